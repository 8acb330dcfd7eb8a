"""Step 3 of scripts/gpu-check.sh: 2 and 4 ranks on one machine through the engine's device-operation path,
with the gloo stand-in's own checks (tests/parallel/gpu_rank_checks.py and gpu_engine_checks.py, run by
the runners of their tests).

NCCL refuses two ranks on one GPU, so on a GPU the ranks keep gloo moving the data
(``HPCDL_GPU_OPERATIONS=gloo-standin``) but their tensors are CUDA tensors
(``GPU_RANK_CHECKS_DEVICE=cuda``): the executor then orders its work with real CUDA streams and events.
In the dry mode the tensors are CPU tensors. Each scenario gives one row: every rank must pass every
check of it, and mismatches and stalls must be reported as the stand-in tests expect, naming the last
rank (the odd one out).

``python scripts/gpu_check/ranks.py --device cuda|cpu [--quick]`` prints ``GPU-CHECK-ROW`` lines.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from verdict import FAIL, PASS, emit

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "parallel"))

from runner_helpers import hpcdl_run, rank_lines  # noqa: E402
from test_gpu_path import STANDIN, results, run_scenario  # noqa: E402

ENGINE_CHECKS = REPO / "tests" / "parallel" / "gpu_engine_checks.py"
SCENARIO_TIMEOUT_S = 120.0


def _mismatch(np_: int, done: subprocess.CompletedProcess) -> None:
    per_rank = [results(done.stdout, rank) for rank in range(np_)]
    assert all(r == per_rank[0] for r in per_rank), f"the ranks saw different errors: {per_rank}"
    messages = {r["case"]: r["message"] for r in per_rank[0]}
    others = "rank 0" if np_ == 2 else f"ranks 0-{np_ - 2}"
    odd = f"rank {np_ - 1}"
    expected = {
        "shape": f"shape [3] on {others}, [4] on {odd}",
        "dtype": f"dtype float32 on {others}, float64 on {odd}",
        "reduction": f"reduction sum on {others}, max on {odd}",
        "root": f"root 0 on {others}, 1 on {odd}",
        "operation": f"operation allreduce on {others}, allgather on {odd}",
        "placement": f"a host tensor (engine data plane) on {odd}",
    }
    for case, text in expected.items():
        assert text in messages.get(case, ""), f"{case}: {messages.get(case)!r} lacks {text!r}"


def _stall(np_: int, done: subprocess.CompletedProcess) -> None:
    text = "\n".join(line for line in (done.stdout + done.stderr).splitlines() if "[0]<stderr>" in line)
    assert "stall inspector" in text, "rank 0 printed no stall report"
    assert f"allreduce 'late': rank {np_ - 1} missing" in text, text[-1500:]


# scenario -> (extra environment, what its output must show beyond every check passing on every rank)
SCENARIOS: dict[str, tuple[dict[str, str], Callable[[int, object], None] | None]] = {
    "forms": ({}, None),
    "order": ({"HPCDL_NUM_NCCL_STREAMS": "2"}, None),
    "mismatch": ({}, _mismatch),
    "stall": ({"HPCDL_STALL_CHECK_TIME_SECONDS": "1"}, _stall),
    "lifecycle": ({}, None),
}
# (ranks, scenario), in the order they run; the dry mode's --quick runs the starred ones only
PLAN = [
    (2, "order", False), (2, "mismatch", True), (2, "stall", False), (2, "lifecycle", False),
    (4, "forms", False), (4, "order", False), (4, "mismatch", False), (4, "stall", True),
]  # fmt: skip
DESCRIPTIONS = {
    "forms": "every op, dtype and form, fusion, process set, join",
    "order": "other orders per rank and thread, 2 streams",
    "mismatch": "every mismatch raises the same error everywhere",
    "stall": "the stall inspector names the late rank",
    "lifecycle": "jobs started and ended back to back",
}


def run_rank_checks(np_: int, scenario: str, device: str) -> None:
    env, verify = SCENARIOS[scenario]
    done = run_scenario(
        np_, scenario, timeout=SCENARIO_TIMEOUT_S, GPU_RANK_CHECKS_DEVICE=device, **{**STANDIN, **env}
    )
    if verify is not None:
        verify(np_, done)


def run_engine_checks(np_: int) -> None:
    """The engine's side, the ranks acting as their own executors: batches carry what the executor needs,
    and a failed batch fails its operations and the engine."""
    done, _ = hpcdl_run(
        "-np", str(np_), sys.executable, str(ENGINE_CHECKS), "batches",
        timeout=SCENARIO_TIMEOUT_S, HPCDL_TIMEOUT="20",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    for rank in range(np_):
        passes = [line.split()[1] for line in rank_lines(done.stdout, rank) if line.startswith("PASS ")]
        assert len(passes) == 2, f"rank {rank} passed {passes}"


def row(what: str, work: Callable[[], None], log: Path | None = None) -> bool:
    """One row of the table; a failure's whole text also goes to `log`, when given (the row keeps 400
    characters of it)."""
    started = time.monotonic()
    try:
        work()
    except Exception as exc:
        detail = " ".join(str(exc).split())
        if not isinstance(exc, (AssertionError, TimeoutError, OSError)):  # the runner itself broke
            detail = f"{type(exc).__name__}: {detail}"
        where = ""
        if log is not None:
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text(f"{what}\n\n{traceback.format_exc()}")
            where = f" (all of it: {log})"
        emit(what, FAIL, (detail or type(exc).__name__)[: max(0, 400 - len(where))] + where)
        return False
    emit(what, PASS, f"{time.monotonic() - started:.1f} s")
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), required=True)
    parser.add_argument("--quick", action="store_true", help="a subset (the dry mode in CI)")
    parser.add_argument("--log", type=Path, help="folder for each failed row's whole output")
    args = parser.parse_args()
    tensors = "CUDA tensors, gloo" if args.device == "cuda" else "CPU tensors, gloo stand-in (dry)"
    ok = True
    for np_, scenario, quick in PLAN:
        if args.quick and not quick:
            continue
        what = f"{np_} ranks, {tensors}: {scenario} ({DESCRIPTIONS[scenario]})"
        log = args.log / f"{np_}-ranks-{scenario}.txt" if args.log else None
        ok &= row(what, lambda np_=np_, scenario=scenario: run_rank_checks(np_, scenario, args.device), log)
    for np_ in (2,) if args.quick else (2, 4):
        ok &= row(
            f"{np_} ranks, engine device queue: batches and failed batches",
            lambda n=np_: run_engine_checks(n),
            args.log / f"{np_}-ranks-engine.txt" if args.log else None,
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
