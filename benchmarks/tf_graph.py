"""Step latency of hpcdl.tensorflow's collectives in graph mode and eagerly, one build against another.

Six loops, each timed step by step on every rank of one job (rank 0's times are reported):

- ``tape``: a ``tf.function`` training step of a small MLP (64-64-10, 4 gradients) with
  ``hvd.DistributedGradientTape``: one grouped allreduce per step, so the step is mostly latency;
- ``many``: a ``tf.function`` of 18 independent allreduces of 100 float32 each;
- ``eager_tape``: the ``tape`` step run eagerly;
- ``eager_allreduce``: one allreduce of 100 float32, eagerly;
- ``eager_allgather``: one allgather of 100 float32, eagerly;
- ``eager_allgather_16mib``: one allgather of 16 MiB per rank (float32), eagerly: a large result.

Builds are hpcdl installations: ``installed`` (the hpcdl this Python imports, e.g. the editable checkout)
or a directory made with ``pip install --no-deps --target DIR <tree>`` (another commit). Their ranks run
with ``python -S`` and ``PYTHONPATH=DIR:<this Python's site-packages>``, so they import that build's hpcdl
and this environment's TensorFlow, and nothing else's hpcdl. The builds take turns, one job each per round
(ABC, CBA, ...), and within a job the loops take turns in windows (ABCD, DCBA, ...), so that the machine's
load falls on all of them alike::

    python benchmarks/tf_graph.py --build /tmp/old --build installed --rounds 4

prints, per loop and build, the median step time and its 90th percentile over every step of every round,
and each build's ratio to the first one (the median of the per-round ratios of medians). Benchmarks do
not assert.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import sysconfig
import time
from typing import Any, Optional

LOOPS = ("tape", "many", "eager_tape", "eager_allreduce", "eager_allgather", "eager_allgather_16mib")
MARKER = "REPORT "


def _loops(tf: Any, hvd: Any) -> dict[str, Any]:
    keras = tf.keras
    keras.utils.set_random_seed(hvd.rank())
    model = keras.Sequential(
        [keras.Input((64,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)]
    )
    optimizer = keras.optimizers.SGD(0.01)
    x = tf.random.normal([32, 64])
    y = tf.random.uniform([32], 0, 10, tf.int32)
    loss_of = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def step() -> Any:
        with tf.GradientTape() as tape:
            loss = loss_of(y, model(x, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    tensors = [tf.fill([100], float(i)) for i in range(18)]
    large = tf.fill([4 << 20], 1.0)

    @tf.function
    def many() -> Any:
        return [hvd.allreduce(t, op=hvd.Sum) for t in tensors]

    return {
        "tape": tf.function(step),
        "many": many,
        "eager_tape": step,
        "eager_allreduce": lambda: hvd.allreduce(tensors[0], op=hvd.Sum, name="eager_allreduce"),
        "eager_allgather": lambda: hvd.allgather(tensors[0], name="eager_allgather"),
        "eager_allgather_16mib": lambda: hvd.allgather(large, name="eager_allgather_16mib"),
    }


def worker(args: argparse.Namespace) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    import hpcdl
    import hpcdl.tensorflow as hvd

    hvd.init()
    loops = _loops(tf, hvd)
    for run in loops.values():  # trace, build the kernel, warm up
        for _ in range(10):
            run()
    times: dict[str, list[float]] = {name: [] for name in LOOPS}
    for window in range(args.windows):
        order = LOOPS if window % 2 == 0 else LOOPS[::-1]
        for name in order:
            run = loops[name]
            hvd.barrier()
            for _ in range(args.steps):
                start = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - start)
    if hvd.rank() == 0:
        print(MARKER + json.dumps({"hpcdl": os.path.dirname(hpcdl.__file__), "times": times}), flush=True)
    hvd.shutdown()


def _environment(build: str) -> tuple[list[str], dict[str, str], Optional[str]]:
    """The Python flags, environment and working directory under which a job imports ``build``."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    if build == "installed":
        return [], env, None
    sites = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    env["PYTHONPATH"] = os.pathsep.join([os.path.abspath(build), *sites])
    return ["-S"], env, os.path.abspath(build)  # not a checkout, whose hpcdl ``-m`` would import


def _job(build: str, args: argparse.Namespace) -> dict:
    flags, env, cwd = _environment(build)
    python = [sys.executable, *flags]
    command = [*python, "-m", "hpcdl", "run", "-np", str(args.num_proc), *python, os.path.abspath(__file__)]
    command += ["--worker", "--steps", str(args.steps), "--windows", str(args.windows)]
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd, timeout=args.timeout)
    for line in result.stdout.splitlines():
        at = line.find(MARKER)
        if at >= 0:
            return json.loads(line[at + len(MARKER) :])
    sys.exit(f"the job of build {build} failed (exit code {result.returncode}):\n{result.stderr[-4000:]}")


def _ms(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return 1e3 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def report(builds: list[str], rounds: list[dict[str, dict]], header: str) -> str:
    lines = [header, ""]
    head = "| loop | " + " | ".join(f"{b}: median (p90) ms" for b in builds)
    head += "".join(f" | {b} / {builds[0]}" for b in builds[1:]) + " |"
    lines += [head, "|---" * (1 + 2 * len(builds) - 1) + "|"]
    for loop in LOOPS:
        cells = []
        for build in builds:
            steps = [t for r in rounds for t in r[build]["times"][loop]]
            cells.append(f"{_ms(steps, 0.5):.2f} ({_ms(steps, 0.9):.2f})")
        for build in builds[1:]:
            ratios = [
                statistics.median(r[build]["times"][loop]) / statistics.median(r[builds[0]]["times"][loop])
                for r in rounds
            ]
            cells.append(f"{statistics.median(ratios):.2f}")
        lines.append(f"| {loop} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-np", "--num-proc", type=int, default=2, help="ranks per job (default 2)")
    parser.add_argument(
        "--build",
        action="append",
        help="'installed' or a directory holding another hpcdl (pip install --no-deps --target DIR <tree>); "
        "repeat to compare, the first is the reference (default: installed)",
    )
    parser.add_argument("--rounds", type=int, default=4, help="jobs per build (default 4)")
    parser.add_argument("--windows", type=int, default=4, help="windows per loop in each job (default 4)")
    parser.add_argument("--steps", type=int, default=50, help="timed steps per window (default 50)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds one job may take")
    parser.add_argument("--json", action="store_true", help="print every step time as JSON")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on a terminal")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return
    from hpcdl.common import progress  # here: the ranks of an older build run this file too

    builds = args.build or ["installed"]
    load_before = os.getloadavg()[0]
    rounds = []
    with progress.bar("tf_graph jobs", args.rounds * len(builds), no_progress=args.no_progress) as bar:
        for i in range(args.rounds):
            order = builds if i % 2 == 0 else builds[::-1]
            jobs = {}
            for build in order:
                jobs[build] = _job(build, args)
                bar.advance()
            rounds.append(jobs)
    load_after = os.getloadavg()[0]
    if args.json:
        print(json.dumps({"builds": builds, "rounds": rounds}))
        return
    imported = ", ".join(f"{b} -> {rounds[0][b]['hpcdl']}" for b in builds)
    header = (
        f"hpcdl.tensorflow step times, {args.num_proc} ranks, {args.rounds} rounds x {args.windows} windows"
        f" x {args.steps} steps; {imported}; load average {load_before:.2f} before, {load_after:.2f} after"
    )
    print(report(builds, rounds, header))


if __name__ == "__main__":
    main()
