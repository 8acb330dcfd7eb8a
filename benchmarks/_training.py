"""What the training benchmarks (``train.py``, ``keras_train.py``) share: their options, the timing of
variants that take turns, launching themselves once per rank count, and the scaling efficiency."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any, Callable, Optional

try:
    from ._launch import NO_PROGRESS_HELP, report_progress, run_ranks
except ImportError:  # run as a script: python benchmarks/train.py
    from _launch import NO_PROGRESS_HELP, report_progress, run_ranks  # type: ignore[no-redef]

Result = dict[str, Any]


def parser(description: str, steps: int, repeats: int, framework: str) -> argparse.ArgumentParser:
    """The options of a training benchmark (``steps`` and ``repeats`` are its defaults; ``framework`` names
    whose threads ``--threads`` sets)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--launch", help="comma list of rank counts to launch with hpcdl run, e.g. 1,2")
    p.add_argument("--hosts", help="with --launch: the ranks' hosts (hpcdl run -H syntax: host1:1,host2:1)")
    p.add_argument("--batch-size", type=int, default=32, help="samples per rank per step")
    p.add_argument("--steps", type=int, default=steps, help="steps per timed window")
    p.add_argument("--repeats", type=int, default=repeats, help="timed windows per variant (median kept)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument(
        "--threads", type=int, default=0, help=f"{framework} threads per rank (0: cores / local ranks)"
    )
    p.add_argument("--json", action="store_true")
    p.add_argument("--no-progress", action="store_true", help=NO_PROGRESS_HELP)
    p.add_argument("--report-progress", action="store_true", help=argparse.SUPPRESS)
    return p


def main(
    argv: Optional[list[str]],
    options: argparse.ArgumentParser,
    script: str,
    worker: Callable[[argparse.Namespace], Optional[Result]],
    table: Callable[[argparse.Namespace, dict[int, Result]], None],
) -> None:
    """With ``--launch``: run ``script`` for each rank count (:func:`launch_each`) and print the results
    (``table(args, results)``, or JSON with ``--json``). Else this process is a rank: ``worker(args)``, whose
    result (rank 0's) is printed as ``RESULT <json>`` with ``--json``, else one ``key: value`` per line."""
    args = options.parse_args(argv)
    if args.launch:
        results = launch_each(script, args)
        if args.json:
            print(json.dumps({"results": results}, indent=2))
        else:
            table(args, results)
        return
    result = worker(args)
    if result is None:
        return
    if args.json:
        print("RESULT " + json.dumps(result), flush=True)
    else:
        for key, value in result.items():
            print(f"{key}: {value}")


def threads_per_rank(args: argparse.Namespace, local_ranks: int) -> int:
    """``--threads``, else this rank's share of the host's cores."""
    return args.threads or max(1, (os.cpu_count() or 1) // local_ranks)


def interleaved(
    steps: dict[str, Callable[[], None]], args: argparse.Namespace, barrier: Callable[[], Any], report: bool
) -> dict[str, float]:
    """Median seconds per step of each variant. The variants take turns, one timed window of
    ``args.steps`` steps each per round, in alternating order (ABC CBA ...), so that changes in machine
    load and any first-in-round effect hit them alike. ``report``: print PROGRESS lines (rank 0)."""
    for step in steps.values():
        for _ in range(args.warmup):
            step()
    windows: dict[str, list[float]] = {name: [] for name in steps}
    order = list(steps.items())
    for round_index in range(args.repeats):
        for name, step in order if round_index % 2 == 0 else reversed(order):
            barrier()
            started = time.perf_counter()
            for _ in range(args.steps):
                step()
            barrier()
            windows[name].append((time.perf_counter() - started) / args.steps)
        if report:
            report_progress(round_index + 1, args.repeats)
    return {name: statistics.median(seconds) for name, seconds in windows.items()}


def launch_each(script: str, args: argparse.Namespace) -> dict[int, Result]:
    """Run ``script``'s worker under ``hpcdl run -np N`` for each N of ``--launch``; every run gets the
    same threads per rank (``cores / largest N`` unless ``--threads``), so that N ranks are compared with
    one of them on the same share of the machine; ``--hosts`` places them on other hosts. Returns rank 0's
    result of each run."""
    counts = [int(n) for n in args.launch.split(",")]
    threads = args.threads or max(1, (os.cpu_count() or 1) // max(counts))
    worker_args = ["--json", "--report-progress", "--steps", str(args.steps), "--warmup", str(args.warmup)]
    worker_args += ["--repeats", str(args.repeats), "--batch-size", str(args.batch_size)]
    worker_args += ["--threads", str(threads)]
    results = {}
    for ranks in counts:
        texts = run_ranks(script, ranks, worker_args, "RESULT", False, args.no_progress, hosts=args.hosts)
        results[ranks] = json.loads(texts[0])
    return results


def efficiency(results: dict[int, Result], ranks: int, key: str) -> str:
    """Scaling efficiency of ``key`` (a samples/s figure) on ``ranks`` ranks: samples/s over ranks ×
    samples/s on one rank ("n/a" without a one-rank run)."""
    single = results.get(1, {}).get(key)
    if not single:
        return "n/a"
    return f"{100 * results[ranks][key] / (ranks * single):.1f}%"
