"""The driver of scripts/gpu-check.sh: runs the check's steps, each in its own process with its own timeout
inside one time budget, and prints one verdict table (check, result, figure) for benchmarks/README.md.

Steps: (1) the ``gpu``-marked tests; (2) one rank, every collective on the GPU path (one_rank.py); (3) 2
and 4 ranks through the device-operation path (ranks.py); (4) two benchmarks, the engine's overhead on
one rank (benchmarks/gpu_overhead.py) and ResNet-50's gradients fused (benchmarks/gpu_fusion.py). A step
that fails, crashes or runs out of time gives FAIL rows and the next step runs. The exit status is 0 when
every row passed (in the dry mode: none failed, since what needs a GPU is skipped there).

Standard library only, so that the table is printed even when hpcdl or torch does not import. Each step's
output is kept in ``--out`` (``<step>.out``, ``<step>.err``, and the whole output of a failed scenario of
step 3 in ``ranks/``), with the table in ``verdict.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from verdict import FAIL, MEASURED, PASS, SKIP, Row, parse, passed, table

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
BUDGET_S = 480.0  # the steps' time in all: 8 minutes
MIB = 1 << 20


@dataclass
class Outcome:
    """What one step's process did."""

    returncode: int | None  # None: killed at its timeout
    seconds: float
    stdout: str
    stderr: str
    timeout: float


@dataclass
class Step:
    name: str
    what: str  # the check's name in the table when the step gives no row of its own
    command: list[str]
    timeout: float
    rows: Callable[[Outcome], list[Row]]
    env: dict[str, str] = field(default_factory=dict)


def _tail(text: str, lines: int = 3) -> str:
    kept = [line for line in text.strip().splitlines() if line.strip()][-lines:]
    return " / ".join(" ".join(line.split()) for line in kept)[-400:]


def run_step(step: Step, timeout: float, out: Path) -> Outcome:
    """Run the step's command in a new process group; kill the group at the timeout."""
    env = {k: v for k, v in os.environ.items() if k != "HPCDL_GPU_OPERATIONS"}
    env.update(step.env, PYTHONUNBUFFERED="1")
    stdout_path, stderr_path = out / f"{step.name}.out", out / f"{step.name}.err"
    started = time.monotonic()
    with stdout_path.open("w") as stdout, stderr_path.open("w") as stderr:
        process = subprocess.Popen(
            step.command, cwd=REPO, env=env, stdout=stdout, stderr=stderr, start_new_session=True
        )
        try:
            code: int | None = process.wait(timeout)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)  # the step's ranks and helpers, too
            process.wait()
    return Outcome(
        code, time.monotonic() - started, stdout_path.read_text(errors="replace"),
        stderr_path.read_text(errors="replace"), timeout,
    )  # fmt: skip


def rows_of(step: Step, outcome: Outcome) -> list[Row]:
    """The step's rows, and a FAIL row when it timed out or failed without saying which check failed."""
    try:
        rows = step.rows(outcome)
    except Exception as exc:  # output the step should not have printed: still a row
        rows = [Row(step.what, FAIL, f"unreadable output ({type(exc).__name__}: {exc})")]
    where = f"see {step.name}.out/.err"
    if outcome.returncode is None:
        rows.append(Row(step.what, FAIL, f"timed out after {outcome.timeout:.0f} s ({where})"))
    elif outcome.returncode != 0 and not any(r.result == FAIL for r in rows):
        rows.append(
            Row(step.what, FAIL, f"exit {outcome.returncode}: {_tail(outcome.stderr or outcome.stdout)}")
        )
    elif not rows:
        rows.append(Row(step.what, FAIL, f"the step reported nothing ({where})"))
    return rows


# ---- reading each step's output ----------------------------------------------------------------------


def gpu_test_files() -> list[str]:
    """The test modules that hold ``gpu``-marked tests."""
    found = []
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        if "pytest.mark.gpu" in path.read_text(errors="replace"):
            found.append(str(path.relative_to(REPO)))
    return found


_COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected)")


def pytest_rows(dry: bool) -> Callable[[Outcome], list[Row]]:
    def rows(outcome: Outcome) -> list[Row]:
        what = "gpu-marked tests (pytest -m gpu)"
        summary = [line for line in outcome.stdout.splitlines() if " in " in line and _COUNT.search(line)]
        if outcome.returncode is None or not summary:
            return []
        counts = {kind.rstrip("s"): int(n) for n, kind in _COUNT.findall(summary[-1])}
        ran, skipped = counts.get("passed", 0), counts.get("skipped", 0)
        bad = counts.get("failed", 0) + counts.get("error", 0)
        reasons = sorted({m.strip() for m in re.findall(r"SKIPPED \[\d+\] [^:]+:\d+: (.*)", outcome.stdout)})
        figure = f"{ran} passed, {bad} failed, {skipped} skipped"
        if bad:
            failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", outcome.stdout, re.M)
            return [Row(what, FAIL, f"{figure}: {', '.join(failed[:4])}")]
        if dry:
            return [Row(what, SKIP if ran == 0 else PASS, f"dry: {figure}, no GPU here")]
        if reasons:
            figure += f" ({'; '.join(reasons)})"
        return [Row(what, PASS if ran else FAIL, figure)]

    return rows


def step_rows(outcome: Outcome) -> list[Row]:
    return parse(outcome.stdout)


def overhead_rows(outcome: Outcome) -> list[Row]:
    if outcome.returncode != 0:
        return []
    report = json.loads(outcome.stdout)
    sizes = report["sizes"]
    what = (
        f"engine overhead, 1 rank, {'CUDA' if report['mode'] == 'nccl' else 'CPU (dry)'}: hvd.allreduce_ "
        f"against torch.distributed.all_reduce on a size-1 {report['backend']} group"
    )
    picks = [sizes[0]] + [s for s in sizes[1:-1] if s["bytes"] == MIB] + [sizes[-1]]
    parts = [
        f"{_size(s['bytes'])}: {s['hpcdl_us']:.1f} vs {s['torch_us']:.1f} us "
        f"(+{s['overhead_us']:.1f} us, {s['hpcdl_vs_torch']:.2f}x)"
        for s in picks
    ]
    return [Row(what, MEASURED, "; ".join(parts))]


def fusion_rows(outcome: Outcome) -> list[Row]:
    if outcome.returncode != 0:
        return []
    report = json.loads(outcome.stdout)
    ms = report["median_step_ms"]
    on = "CUDA, NCCL" if report["mode"] == "nccl" else "CPU, gloo (dry)"
    what = (
        f"fusion of ResNet-50's {report['tensors']} gradients ({report['bytes'] / 1e6:.0f} MB), 1 rank, {on}"
    )
    # One rank: the allreduce itself moves nothing, so the figures are the engine's and the copies' cost.
    figure = (
        f"median step hpcdl {ms['hpcdl']:.2f} ms, packed {ms['packed']:.2f} ms, DDP buckets {ms['ddp']:.2f} "
        f"ms, flat {ms['flat']:.2f} ms; hpcdl/packed {report['hpcdl_vs_packed']}, "
        f"hpcdl/ddp {report['hpcdl_vs_ddp']}"
    )
    return [Row(what, MEASURED, figure)]


def _size(nbytes: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


# ---- the plan ----------------------------------------------------------------------------------------


def steps(python: str, dry: bool, out: Path) -> list[Step]:
    operations = "gloo-standin" if dry else "nccl"
    tests = [python, "-m", "pytest", "-m", "gpu", "-q", "-rs", "-p", "no:cacheprovider", *gpu_test_files()]
    ranks = [
        python,
        str(HERE / "ranks.py"),
        "--device",
        "cpu" if dry else "cuda",
        "--log",
        str(out / "ranks"),
        *(["--quick"] if dry else []),
    ]
    bench = ["--json", "--no-progress", "--gpu-operations", operations]
    sweep = ["--max-bytes", str(MIB), "--iterations", "5", "--warmup", "1"] if dry else ["--iterations", "20"]
    rounds = ["--iterations", "3", "--warmup", "1"] if dry else ["--iterations", "10", "--warmup", "2"]
    return [
        Step("gpu_tests", "gpu-marked tests", tests, 120, pytest_rows(dry)),
        Step(
            "one_rank", "1 rank, every collective on the GPU path",
            [python, str(HERE / "one_rank.py"), "--work", str(out / "one_rank")], 60, step_rows,
            {"HPCDL_GPU_OPERATIONS": operations},
        ),
        Step("ranks", "2 and 4 ranks through the device-operation path", ranks, 180, step_rows),
        Step(
            "gpu_overhead", "engine overhead, 1 rank",
            [python, str(REPO / "benchmarks" / "gpu_overhead.py"), *bench, *sweep], 60, overhead_rows,
        ),
        Step(
            "gpu_fusion", "fusion of ResNet-50's gradients, 1 rank",
            [python, str(REPO / "benchmarks" / "gpu_fusion.py"), "-np", "1", *bench, *rounds], 60,
            fusion_rows,
        ),
    ]  # fmt: skip


def install_row(args: argparse.Namespace) -> Row:
    what = "install hpcdl from the tree without network, C++ runtime built with the machine's CMake"
    if args.install_rc is None:
        return Row(what, SKIP, "dry: the environment's installed hpcdl is used (--install installs it)")
    log = Path(args.install_log).read_text(errors="replace") if args.install_log else ""
    if args.install_rc != 0:
        return Row(what, FAIL, f"exit {args.install_rc}: {_tail(log)}")
    cmake = re.search(r"cmake version (\S+)", log)
    return Row(what, PASS, f"{args.install_seconds:.0f} s" + (f", CMake {cmake.group(1)}" if cmake else ""))


_FACTS = """
import json, platform, subprocess
facts = {"python": platform.python_version()}
try:
    import torch
    facts["torch"] = torch.__version__
    facts["cuda"] = torch.version.cuda
    if torch.cuda.is_available():
        facts["device"] = torch.cuda.get_device_name(0)
        facts["gpus"] = torch.cuda.device_count()
except Exception as exc:
    facts["torch"] = f"not importable ({type(exc).__name__})"
try:
    import hpcdl
    facts["hpcdl"] = hpcdl.__version__
except Exception as exc:
    facts["hpcdl"] = f"not importable ({type(exc).__name__})"
print(json.dumps(facts))
"""


def facts(python: str) -> dict:
    try:
        done = subprocess.run([python, "-c", _FACTS], capture_output=True, text=True, timeout=120, cwd="/")
        found = json.loads(done.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, json.JSONDecodeError, IndexError, OSError) as exc:
        found = {"python": f"unknown ({type(exc).__name__})"}
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    found["commit"] = commit.stdout.strip() or "unknown"
    return found


def header(dry: bool, found: dict) -> str:
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    where = "dry mode on the CPU (gloo stand-in)" if dry else found.get("device", "no CUDA device visible")
    return (
        f"GPU check, {where}, {when}: hpcdl {found.get('hpcdl')} at {found['commit']}, "
        f"torch {found.get('torch')} (CUDA {found.get('cuda')}), Python {found.get('python')}"
    )


def overhead_table(out: Path) -> str:
    """The overhead benchmark's whole sweep, as a Markdown table (empty when it did not report)."""
    try:
        report = json.loads((out / "gpu_overhead.out").read_text())
    except (OSError, json.JSONDecodeError):
        return ""
    lines = ["| size | hpcdl us | torch us | overhead us | hpcdl/torch |", "|---:|---:|---:|---:|---:|"]
    for s in report["sizes"]:
        lines.append(
            f"| {_size(s['bytes'])} | {s['hpcdl_us']:.1f} | {s['torch_us']:.1f} | {s['overhead_us']:.1f} | "
            f"{s['hpcdl_vs_torch']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry", action="store_true", help="on the CPU with the gloo stand-in")
    parser.add_argument("--out", type=Path, required=True, help="folder for the steps' output and the table")
    parser.add_argument("--budget", type=float, default=BUDGET_S, help="seconds for all steps (default 480)")
    parser.add_argument(
        "--timeout", action="append", default=[], metavar="STEP=SECONDS", help="one step's own timeout"
    )
    parser.add_argument("--only", help="comma-separated steps to run (default: all)")
    parser.add_argument("--install-rc", type=int, help="the install step's exit status (none: not run)")
    parser.add_argument("--install-seconds", type=float, default=0.0)
    parser.add_argument("--install-log", help="the install step's output")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    python = sys.executable
    found = facts(python)
    if not args.dry and "device" not in found:
        print(
            "gpu-check: no CUDA device is visible to this Python's torch "
            f"({found.get('torch')}); on a machine without a GPU run scripts/gpu-check.sh --dry",
            file=sys.stderr,
        )
    plan = steps(python, args.dry, args.out.resolve())
    for override in args.timeout:
        name, _, seconds = override.partition("=")
        matching = [s for s in plan if s.name == name]
        if not matching or not seconds:
            parser.error(
                f"--timeout {override}: expected STEP=SECONDS with STEP one of {[s.name for s in plan]}"
            )
        matching[0].timeout = float(seconds)
    if args.only:
        names = args.only.split(",")
        unknown = sorted(set(names) - {s.name for s in plan})
        if unknown:
            parser.error(f"--only: no step {', '.join(unknown)}")
        plan = [s for s in plan if s.name in names]
    rows = [install_row(args)]
    deadline = time.monotonic() + args.budget
    for i, step in enumerate(plan, 1):
        left = deadline - time.monotonic()
        if left < 5:
            rows.append(Row(step.what, FAIL, f"not run: the {args.budget:.0f} s budget was spent"))
            continue
        timeout = min(step.timeout, left)
        print(f"==> [{i}/{len(plan)}] {step.name} (timeout {timeout:.0f} s)", flush=True)
        outcome = run_step(step, timeout, args.out)
        step_rows_ = rows_of(step, outcome)
        rows += step_rows_
        verdicts = ", ".join(sorted({r.result for r in step_rows_}))
        print(f"    {outcome.seconds:.1f} s: {verdicts}", flush=True)
    ok = passed(rows, allow_skips=args.dry)
    count = sum(r.result in (PASS, MEASURED) for r in rows)
    text = f"{header(args.dry, found)}; {count} of {len(rows)} rows passed or measured\n\n{table(rows)}\n"
    sweep = overhead_table(args.out)
    if sweep:
        text += f"\nEngine overhead by size (1 rank):\n\n{sweep}\n"
    (args.out / "verdict.md").write_text(text)
    print("\n" + text)
    print(f"gpu-check: {'PASSED' if ok else 'FAILED'} (output in {args.out})", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
