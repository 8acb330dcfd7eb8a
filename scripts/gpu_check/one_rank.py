"""Step 2 of scripts/gpu-check.sh: one rank, every collective of hpcdl.torch on tensors of every dtype and
several layouts through the engine's GPU path, each result checked against the CPU answer; then the NVTX
ranges the executor opened, as an NVTX tool sees them.

On a GPU (``HPCDL_GPU_OPERATIONS=nccl``) the tensors are CUDA tensors and NCCL moves them; in the dry mode
(``gloo-standin``) CPU tensors take the same path with gloo. The CPU answer is Horovod's result for one
rank computed with torch on a CPU copy of the input (the reduction of one tensor is itself, scaled by the
pre- and postscale factors in its own dtype). Layouts: contiguous, transposed, expanded (stride 0), a
strided slice with an offset, channels-last, 0-d and empty. Every failure is collected, so that one
does not hide the others.

NVTX: the executor opens one range per batch it runs on CUDA. The check builds nvtx_probe.c, an NVTX tool
library, and names it in ``NVTX_INJECTION64_PATH`` before the process's first NVTX call, so every range
torch's NVTX calls open is written to a log; it then expects one closed ``hpcdl <COLLECTIVE>`` range per
kind of batch, and none once ``HPCDL_DISABLE_NVTX_RANGES=1``.

``python scripts/gpu_check/one_rank.py --work DIR`` prints ``GPU-CHECK-ROW`` lines (see verdict.py).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

from verdict import FAIL, PASS, SKIP, emit

HERE = Path(__file__).resolve().parent


def build_probe(work: Path) -> tuple[Path | None, str]:
    """Compile the NVTX tool library into ``work``; (its path, '') or (None, why not)."""
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        return None, "no C compiler (cc) to build the NVTX probe; install one or set CC"
    library = work / "libhpcdl_nvtx_probe.so"
    done = subprocess.run(
        [compiler, "-shared", "-fPIC", "-O2", "-o", str(library), str(HERE / "nvtx_probe.c"), "-lpthread"],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        return None, f"building the NVTX probe failed: {done.stderr.strip()[-500:]}"
    return library, ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True, help="folder for the probe and its log")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    on_gpu = os.environ.get("HPCDL_GPU_OPERATIONS") == "nccl"
    probe, why_not = build_probe(args.work)
    log = args.work / "nvtx.log"
    log.unlink(missing_ok=True)
    if probe is not None:  # before torch makes its first NVTX call, which loads the tool
        os.environ["NVTX_INJECTION64_PATH"] = str(probe)
        os.environ["HPCDL_NVTX_PROBE_LOG"] = str(log)

    import torch

    import hpcdl.torch as hvd
    from hpcdl.torch import _gpu

    torch.set_num_threads(1)
    os.environ["HPCDL_DISABLE_NVTX_RANGES"] = "0"
    hvd.init()
    path = "NCCL, CUDA tensors" if on_gpu else "gloo stand-in, CPU tensors (dry)"
    if _gpu.mode() != os.environ.get("HPCDL_GPU_OPERATIONS"):
        emit(f"1 rank, {path}: every collective", FAIL, f"the GPU path is not in use (mode {_gpu.mode()})")
        return 1
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    cases = Cases(hvd, torch, device)
    cases.run_all()
    hvd.shutdown()
    what = f"1 rank, {path}: every collective × 10 dtypes × 7 layouts against the CPU answer"
    if cases.failures:
        shown = "; ".join(cases.failures[:3])
        emit(what, FAIL, f"{len(cases.failures)} of {cases.count} cases failed: {shown}")
    else:
        emit(what, PASS, f"{cases.count} cases")

    nvtx_what = "NVTX ranges of the executor's batches (NVTX tool library)"
    if probe is None:
        emit(nvtx_what, FAIL, why_not)
    elif not on_gpu:
        emit(nvtx_what, SKIP, "dry: the probe builds; NVTX ranges are opened on CUDA only")
    else:
        before = _events(log)
        os.environ["HPCDL_DISABLE_NVTX_RANGES"] = "1"
        hvd.init()
        hvd.allreduce(torch.ones(4, device=device), name="nvtx.disabled")
        hvd.shutdown()
        result, figure = nvtx_verdict(before, _events(log)[len(before) :])
        emit(nvtx_what, result, figure)
    return 0


# ---- the collectives ---------------------------------------------------------------------------------


def layouts(torch, device) -> dict[str, Callable]:
    """Builders of an input of each layout from a CPU tensor maker ``make(shape)``."""
    return {
        "contiguous": lambda make: make((3, 4)).to(device),
        "transposed": lambda make: make((4, 3)).to(device).t(),
        "expanded": lambda make: make((1, 4)).to(device).expand(3, 4),
        "offset slice": lambda make: make((5, 6)).to(device)[1:4, ::2],
        "channels-last": lambda make: (
            make((2, 3, 2, 2)).to(device).contiguous(memory_format=torch.channels_last)
        ),
        "0-d": lambda make: make(()).to(device),
        "empty": lambda make: make((0, 4)).to(device),
    }


class Cases:
    """Every collective on every dtype and layout; ``failures`` says which did not give the CPU answer."""

    def __init__(self, hvd, torch, device) -> None:
        self.hvd, self.torch, self.device = hvd, torch, device
        self.dtypes = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
                       torch.int16, torch.int8, torch.uint8, torch.bool]  # fmt: skip
        self.count = 0
        self.failures: list[str] = []

    def value(self, dtype, salt: int = 0):
        """A maker of small integers in [-5, 5] (uint8: [0, 3]; bool: positive) of ``dtype`` on the CPU."""
        torch = self.torch

        def make(shape: tuple[int, ...]):
            n = 1
            for d in shape:
                n *= d
            v = (torch.arange(n, dtype=torch.int64).reshape(shape) * 7 + salt) % 11 - 5
            if dtype == torch.bool:
                return v > 0
            if dtype == torch.uint8:
                return ((v + 5) % 4).to(dtype)
            return v.to(dtype)

        return make

    def check(
        self, what: str, expected: object, run: Callable[..., object], *args: object, **kw: object
    ) -> None:
        """Run one case, ``run(*args, **kw)``; its result (a tensor, or a tuple/list of them) must equal
        ``expected`` (on the CPU), each tensor on this device."""
        self.count += 1
        try:
            got = run(*args, **kw)
            self._same(got, expected, what)
        except Exception as exc:
            detail = "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()[-1]
            self.failures.append(f"{what}: {detail}"[:300])

    def _same(self, got: object, expected: object, what: str) -> None:
        torch = self.torch
        if isinstance(expected, (list, tuple)):
            assert isinstance(got, (list, tuple)) and len(got) == len(expected), f"{what}: got {got!r}"
            for g, e in zip(got, expected):
                self._same(g, e, what)
            return
        if not isinstance(expected, torch.Tensor):  # e.g. alltoall's received splits
            assert got == expected, f"{what}: {got!r} != {expected!r}"
            return
        assert isinstance(got, torch.Tensor), f"{what}: got {type(got).__name__}"
        assert got.device == self.device, f"{what}: the result is on {got.device}, not {self.device}"
        assert got.dtype == expected.dtype, f"{what}: dtype {got.dtype} != {expected.dtype}"
        assert tuple(got.shape) == tuple(expected.shape), f"{what}: shape {tuple(got.shape)}"
        assert torch.equal(got.cpu(), expected), (
            f"{what}: {got.cpu().flatten()[:6].tolist()} != {expected.flatten()[:6].tolist()}"
        )

    def scaled(self, x, factor: float):
        """Horovod's scaling in the tensor's own dtype (integers truncate; booleans are not scaled)."""
        torch = self.torch
        if factor == 1.0 or x.dtype == torch.bool:
            return x
        if x.dtype.is_floating_point:
            return x * factor
        return (x.to(torch.float64) * factor).trunc().to(x.dtype)

    def run_all(self) -> None:
        shapes = layouts(self.torch, self.device)
        for dtype in self.dtypes:
            for layout, build in shapes.items():
                self._one(dtype, layout, build, self.value(dtype))
            self._groups(dtype, shapes)
        self._fused_burst(shapes)

    def _one(self, dtype, layout: str, build: Callable, make: Callable) -> None:
        hvd, torch = self.hvd, self.torch
        what = f"{str(dtype).removeprefix('torch.')} {layout}"
        x = build(make)
        cpu = x.cpu()
        for op_name in ("Sum", "Average", "Min", "Max", "Product"):
            self.check(f"allreduce {op_name} {what}", cpu, hvd.allreduce, x, op=getattr(hvd, op_name))
        if dtype != torch.bool:
            self.check(
                f"allreduce scaled {what}", self.scaled(self.scaled(cpu, 1.5), 0.5), hvd.allreduce, x,
                op=hvd.Sum, prescale_factor=1.5, postscale_factor=0.5,
            )  # fmt: skip
        self.check(f"broadcast {what}", cpu, hvd.broadcast, x, root_rank=0)
        if layout != "expanded":  # in place into memory its elements share is undefined
            self.check(f"allreduce_ {what}", cpu, self._in_place, hvd.allreduce_, build(make), op=hvd.Sum)
            self.check(f"broadcast_ {what}", cpu, self._in_place, hvd.broadcast_, build(make), root_rank=0)
        if layout == "0-d":
            return  # the row collectives need a first dimension
        self.check(f"allgather {what}", cpu, hvd.allgather, x)
        self.check(f"alltoall {what}", cpu, hvd.alltoall, x)
        self.check(f"alltoall splits {what}", (cpu, [x.shape[0]]), self._alltoall_splits, x)
        if dtype != torch.bool:
            for op_name in ("Sum", "Average"):
                self.check(
                    f"reducescatter {op_name} {what}", cpu, hvd.reducescatter, x, op=getattr(hvd, op_name)
                )

    @staticmethod
    def _in_place(operation: Callable, target, **kw: object):
        out = operation(target, **kw)
        assert out is target, "the in-place collective did not return its argument"
        return target

    def _alltoall_splits(self, x):
        out, received = self.hvd.alltoall(x, splits=[x.shape[0]])
        return out, received.tolist()

    def _groups(self, dtype, shapes: dict[str, Callable]) -> None:
        """One group of every layout of this dtype (the 0-d one only where rows are not needed)."""
        hvd, torch = self.hvd, self.torch
        what = str(dtype).removeprefix("torch.")
        inputs = [build(self.value(dtype, salt)) for salt, build in enumerate(shapes.values())]
        cpu = [t.cpu() for t in inputs]
        rows = [t for t in inputs if t.dim() > 0]
        rows_cpu = [t.cpu() for t in rows]
        self.check(f"grouped_allreduce {what}", cpu, hvd.grouped_allreduce, inputs, op=hvd.Sum)
        self.check(f"grouped_allgather {what}", rows_cpu, hvd.grouped_allgather, rows)
        if dtype != torch.bool:
            self.check(f"grouped_reducescatter {what}", rows_cpu, hvd.grouped_reducescatter, rows, op=hvd.Sum)

    def _fused_burst(self, shapes: dict[str, Callable]) -> None:
        """Every dtype and layout submitted asynchronously before the first wait: fused batches."""
        hvd = self.hvd
        inputs = [
            build(self.value(dtype, salt=i))
            for i, (dtype, build) in enumerate((d, b) for d in self.dtypes for b in shapes.values())
        ]
        expected = [t.cpu() for t in inputs]

        def burst() -> list:
            handles = [hvd.allreduce_async(t, op=hvd.Sum, name=f"burst.{i}") for i, t in enumerate(inputs)]
            return [hvd.synchronize(h) for h in handles]

        self.check(f"fused burst of {len(inputs)} allreduces", expected, burst)


# ---- NVTX --------------------------------------------------------------------------------------------

_KINDS = ("ALLREDUCE", "FUSED_ALLREDUCE", "ALLGATHER", "BROADCAST", "ALLTOALL", "REDUCESCATTER")
_HPCDL_RANGE = re.compile(r"^start (\d+) (hpcdl (\w+) \(\d+ tensors?\))$")


def _events(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.is_file() else []


def nvtx_verdict(enabled: list[str], disabled: list[str]) -> tuple[str, str]:
    """(result, figure) from the probe's log while ranges were on, then off."""
    if "loaded" not in enabled:
        return FAIL, "the NVTX tool library was not loaded: torch made no NVTX call, or ignores the tool"
    opened = {}
    for line in enabled:
        match = _HPCDL_RANGE.match(line)
        if match:
            opened[match.group(1)] = match.group(3)
    closed = {line.split()[1] for line in enabled if line.startswith("end ")}
    unclosed = [kind for rid, kind in opened.items() if rid not in closed]
    kinds = set(opened.values())
    missing = [k for k in _KINDS if k not in kinds]
    leaked = [line for line in disabled if _HPCDL_RANGE.match(line)]
    problems = []
    if missing:
        problems.append(f"no range for {', '.join(missing)}")
    if unclosed:
        problems.append(f"{len(unclosed)} ranges never closed ({', '.join(sorted(set(unclosed)))})")
    if leaked:
        problems.append(f"{len(leaked)} ranges with HPCDL_DISABLE_NVTX_RANGES=1")
    if problems:
        return FAIL, "; ".join(problems)
    return PASS, (
        f"{len(opened)} ranges, all closed, of {len(kinds)} kinds ({', '.join(sorted(kinds))}); "
        "none with HPCDL_DISABLE_NVTX_RANGES=1"
    )


if __name__ == "__main__":
    sys.exit(main())
