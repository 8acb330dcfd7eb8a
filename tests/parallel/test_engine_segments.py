"""Fused allreduces of tensors of any size, reduced as segments of one collective, with real ranks.

The test functions launch this same file as the rank program (``python test_engine_segments.py
TIMELINE``): every rank submits groups of tensors of odd sizes (tiny ones that go through the fusion
buffer, large ones that are reduced where they are and straddle the data plane's chunks) in every float
dtype, in place and out of place, checks each result against the sum of every rank's inputs, then does the
same with uneven data and ``join`` (joined ranks contribute zeros to fused segments), and prints a digest
of all results. Fusion on and off must give the same digest, bit for bit.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from runner_helpers import hpcdl_run, rank_lines

SIZES = [1, 3, 1000, 1023, 65537, 700001, 5, 300007]  # elements; 700001 crosses 2 MiB staging chunks
SMALL_SIZES = [1023, 17, 2049, 7]  # under 64 KiB in all: the data plane's one-step path
PASSES = ["dtypes", "join"]


def run_ranks(np_: int, timeline: str, threshold: int, transport: str = "auto"):
    done, _ = hpcdl_run(
        "-np", str(np_), sys.executable, __file__, timeline, timeout=120,
        HPCDL_FUSION_THRESHOLD=str(threshold), HPCDL_TRANSPORT=transport,
    )  # fmt: skip
    assert done.returncode == 0, f"ranks failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    digests = {}
    for rank in range(np_):
        lines = rank_lines(done.stdout, rank)
        assert [line.split()[1] for line in lines if line.startswith("PASS ")] == PASSES
        digests[rank] = dict(line.split()[1:3] for line in lines if line.startswith("DIGEST "))
    # Every rank got the same results of the same allreduces (the join steps differ by rank).
    assert len({d["dtypes"] for d in digests.values()}) == 1, digests
    return digests


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_segmented_fusion_matches_unfused_on_2_and_3_ranks(tmp_path: Path, transport: str) -> None:
    """Shared memory (auto on one host) and TCP both reduce a fused batch's tensors where they are."""
    for np_ in (2, 3):
        trace = tmp_path / f"fused{np_}.json"
        fused = run_ranks(np_, str(trace), 64 << 20, transport)
        unfused = run_ranks(np_, "-", 0, transport)
        assert fused == unfused
        events = json.loads(trace.read_text())
        tracks = {
            e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"
        }
        phases: dict[str, list[dict]] = {}
        for e in events:
            if e["ph"] == "X":
                phases.setdefault(tracks[e["tid"]], []).append(e)
        # The large tensor was fused with the others but never copied: one in-place ALLREDUCE span.
        large = phases["tl.large"]
        assert {e["name"] for e in large} == {"NEGOTIATE", "QUEUE", "ALLREDUCE"}
        reduce = next(e for e in large if e["name"] == "ALLREDUCE")
        assert reduce["args"]["in_place"] is True and reduce["args"]["fused_tensors"] == 3
        # The tiny one travelled through the fusion buffer of the same collective.
        tiny = {e["name"] for e in phases["tl.tiny"]}
        assert {"MEMCPY_IN_FUSION_BUFFER", "ALLREDUCE", "MEMCPY_OUT_FUSION_BUFFER"} <= tiny


# ---- rank side ------------------------------------------------------------------------------------------


def rank_main(timeline: str) -> None:
    import hpcdl.common as hc
    from hpcdl.common import engine as E
    from hpcdl.common.types import Buffer, DType, OpType, ReduceOp

    def to_bf16(a: np.ndarray) -> np.ndarray:
        bits = a.astype(np.float32).view(np.uint32)
        return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)

    def as_float(dtype: DType, a: np.ndarray) -> np.ndarray:
        return (
            (a.astype(np.uint32) << 16).view(np.float32) if dtype == DType.BFLOAT16 else a.astype(np.float64)
        )

    storage = {
        DType.FLOAT16: np.float16,
        DType.BFLOAT16: np.uint16,
        DType.FLOAT32: np.float32,
        DType.FLOAT64: np.float64,
    }

    def values(rank: int, n: int, salt: int) -> np.ndarray:
        """Small integers: sums are exact in every float dtype, in any order."""
        return (np.arange(n, dtype=np.float64) * 7 + rank * 13 + salt) % 17

    def stored(dtype: DType, a: np.ndarray) -> np.ndarray:
        return to_bf16(a) if dtype == DType.BFLOAT16 else a.astype(storage[dtype])

    def group(
        dtype: DType, arrays: list[np.ndarray], names: list[str], op: ReduceOp, postscale: float
    ) -> list:
        """One group (negotiated in one cycle, so fused); every other member is reduced in place."""
        gid = E.new_group_id()
        handles = []
        for i, (a, name) in enumerate(zip(arrays, names)):
            out = a if i % 2 else np.empty_like(a)
            handles.append(
                E.enqueue(
                    OpType.ALLREDUCE,
                    Buffer(a.ctypes.data, dtype, a.shape),
                    Buffer(out.ctypes.data, dtype, out.shape),
                    name=name,
                    reduce_op=op,
                    postscale=postscale,
                    group_id=gid,
                    group_size=len(arrays),
                    keep=(a, out),
                    result=lambda _h, out=out: out,
                )
            )
        return [E.synchronize(h) for h in handles]

    hc.init()
    r, n = hc.rank(), hc.size()
    digest = hashlib.sha256()
    for dtype in storage:
        cases = (
            (SIZES, 0, ReduceOp.SUM, 0.5),
            (SIZES, 1, ReduceOp.AVERAGE, 1.0),
            (SMALL_SIZES, 2, ReduceOp.SUM, 1.0),
        )
        for sizes, salt, op, postscale in cases:
            arrays = [stored(dtype, values(r, size, salt + i)) for i, size in enumerate(sizes)]
            names = [f"seg.{dtype.name}.{salt}.{i}" for i in range(len(sizes))]
            for i, out in enumerate(group(dtype, arrays, names, op, postscale)):
                total = sum(values(q, sizes[i], salt + i) for q in range(n))
                expected = total * postscale if op == ReduceOp.SUM else total / n
                got = as_float(dtype, out)
                if op == ReduceOp.SUM:
                    np.testing.assert_array_equal(got, expected, err_msg=names[i])
                else:
                    np.testing.assert_allclose(got, expected, rtol=1e-2, err_msg=names[i])
                digest.update(out.tobytes())
    print(f"DIGEST dtypes {digest.hexdigest()}", flush=True)
    print("PASS dtypes", flush=True)
    digest = hashlib.sha256()
    # Group ids are counted per rank: this group comes before the ranks run different numbers of them.
    if timeline != "-":
        if r == 0:
            E.start_timeline(timeline)
        group(
            DType.FLOAT32,
            [values(r, size, 0).astype(np.float32) for size in (500, 700001, 300007)],
            ["tl.tiny", "tl.large", "tl.medium"],
            ReduceOp.SUM,
            1.0,
        )
        if r == 0:
            E.stop_timeline()
    # Uneven data: rank q runs q + 1 steps, then joins; joined ranks add zeros to every fused segment.
    for step in range(r + 1):
        active = [q for q in range(n) if q >= step]
        sizes = [700001, 3, 300007]
        arrays = [values(r, size, step + i).astype(np.float32) for i, size in enumerate(sizes)]
        outs = group(DType.FLOAT32, arrays, [f"join.{step}.{i}" for i in range(3)], ReduceOp.SUM, 1.0)
        for i, out in enumerate(outs):
            np.testing.assert_array_equal(out, sum(values(q, sizes[i], step + i) for q in active))
            digest.update(out.tobytes())
    assert E.join() == n - 1
    print("PASS join", flush=True)
    print(f"DIGEST join {digest.hexdigest()}", flush=True)
    hc.shutdown()


if __name__ == "__main__":
    rank_main(sys.argv[1])
