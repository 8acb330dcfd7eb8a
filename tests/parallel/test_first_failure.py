"""``hpcdl run`` names the rank that failed first by its own error, whichever exit it happens to see first,
and reports the other ranks' errors as consequences: a rank raising (repeated, at 2 to 4 ranks, while the
others call a collective every 5 ms: an order race would show), killed by SIGKILL, killed by the kernel's
OOM killer, exiting 0 early, or stuck in the user's code while the others wait for it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from runner_helpers import clean_env, hpcdl_run

from hpcdl.diagnosis.words import ranks_text

RANKS = str(Path(__file__).with_name("first_failure_ranks.py"))
HOST = socket.gethostname()
CONSEQUENCE = "consequence, not a cause: "


def summary(stderr: str) -> list[str]:
    """hpcdl run's own lines (and the traceback lines it shows) at the end of its stderr."""
    lines = stderr.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("hpcdl run: "))
    return lines[start:]


def run_job(num_proc: int, how: str, tmp_path: Path, **env: str):
    done, seconds = hpcdl_run("-np", str(num_proc), sys.executable, RANKS, how, cwd=tmp_path, **env)
    return done, summary(done.stderr), seconds


def check_raised(num_proc: int, culprit: int, tmp_path: Path, **env: str) -> list[str]:
    """Run a job whose rank `culprit` raises; check the summary names it; return the consequence lines."""
    done, lines, _ = run_job(num_proc, "raise", tmp_path, CULPRIT=str(culprit), **env)
    assert done.returncode == 1, done.stderr
    head = f"hpcdl run: rank {culprit} on host {HOST} failed first, with ValueError: boom on rank {culprit} "
    assert lines[0] in (
        f"{head}(exited with code 1); stopped the other {num_proc - 1} rank(s)",
        # stopped by hpcdl run while it was still shutting down
        f"{head}(was killed by signal SIGTERM (15)); stopped the other {num_proc - 1} rank(s)",
    ), done.stderr
    assert lines[1] == f"hpcdl run: its error (rank {culprit} on host {HOST}):"
    assert '        raise ValueError(f"boom on rank {hc.rank()}")' in lines
    assert not [line for line in lines[1:] if line.startswith("hpcdl run: rank ")]
    blamed = [line for line in lines if line.startswith("hpcdl run: " + CONSEQUENCE)]
    assert all(f"HpcdlShutdownError: rank {culprit} has shut down" in line for line in blamed), blamed
    return blamed


@pytest.mark.parametrize("num_proc", [2, 3, 4])
def test_the_raising_rank_is_named_every_time(tmp_path: Path, num_proc: int) -> None:
    """Four jobs at each size (twelve in all), the culprit a different rank each time."""
    for run in range(4):
        check_raised(num_proc, (run + 1) % num_proc, tmp_path)


def test_the_raising_rank_is_named_when_its_exit_comes_last(tmp_path: Path) -> None:
    """Its exit reaches hpcdl run only after every other rank's failure did."""
    blamed = check_raised(4, 2, tmp_path, SLOW_EXIT="1.0")
    assert blamed and blamed[0].startswith(f"hpcdl run: {CONSEQUENCE}ranks 0-1, 3 failed with "), blamed


def test_a_raising_rank_whose_output_was_lost_is_named_from_its_last_words(tmp_path: Path) -> None:
    """Its traceback never reached hpcdl run (as when a crashing mpirun takes a rank's output with it): the
    last words it left in the job's debug directory still name its error."""
    done, lines, _ = run_job(2, "raise-unseen", tmp_path, CULPRIT="1")
    assert done.returncode == 1, done.stderr
    assert not [line for line in done.stderr.splitlines() if line.startswith("[1]") and "boom" in line]
    head = f"hpcdl run: rank 1 on host {HOST} failed first, with ValueError: boom on rank 1 ("
    assert lines[0].startswith(head), done.stderr
    assert lines[1] == f"hpcdl run: its error (rank 1 on host {HOST}):"
    assert '        raise ValueError(f"boom on rank {hc.rank()}")' in lines


def test_a_killed_rank_is_named_and_its_signal(tmp_path: Path) -> None:
    done, lines, _ = run_job(3, "kill", tmp_path)
    assert done.returncode == 128 + 9, done.stderr
    assert lines[0].startswith(f"hpcdl run: rank 2 on host {HOST} was killed by signal SIGKILL (9)"), lines


def test_a_rank_that_exits_0_early_is_named(tmp_path: Path) -> None:
    done, lines, _ = run_job(3, "exit0", tmp_path, CULPRIT="1")
    assert done.returncode == 1, done.stderr
    assert lines[0] in (
        f"hpcdl run: rank 1 on host {HOST} exited with code 0 while ranks 0, 2 still waited for it in "
        "collectives; stopped the other 2 rank(s)",
        # hpcdl run stopped it before its exit had quite ended
        f"hpcdl run: rank 1 on host {HOST} shut down while ranks 0, 2 still waited for it in collectives, "
        "and was stopped as it ended (was killed by signal SIGTERM (15)); stopped the other 2 rank(s)",
    ), lines
    assert lines[1].startswith(f"hpcdl run: {CONSEQUENCE}ranks 0, 2 failed with HpcdlShutdownError: rank 1 ")


@pytest.mark.parametrize("how", ["stuck", "stuck-in-c"])
def test_a_stuck_rank_is_named_not_the_ranks_that_waited_for_it(tmp_path: Path, how: str) -> None:
    """Stuck in the user's function, or in a C call that holds the GIL."""
    done, lines, seconds = run_job(
        3, how, tmp_path, CULPRIT="1",
        HPCDL_STALL_CHECK_TIME_SECONDS="1", HPCDL_STALL_SHUTDOWN_TIME_SECONDS="2",
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert lines[0].startswith(
        f"hpcdl run: rank 1 on host {HOST} never submitted the operation ranks 0, 2 waited for (stall "
        "shutdown), and was stopped"
    ), lines
    assert f"{CONSEQUENCE}ranks 0, 2 failed with HpcdlShutdownError: stall shutdown: allreduce 'grad.2'" in (
        "\n".join(lines)
    )
    assert seconds < 30


def test_a_shape_mismatch_names_the_rank_that_differs(tmp_path: Path) -> None:
    done, lines, _ = run_job(3, "shape", tmp_path, CULPRIT="2")
    assert done.returncode == 1, done.stderr
    mismatch = (
        "HpcdlMismatchError: mismatched shape for allreduce 'grad.0': shape [4] on ranks 0-1, [5] on rank 2."
    )
    assert mismatch in lines[0] and " failed first, with " in lines[0], lines
    first = int(lines[0].split()[3])
    others = ranks_text(rank for rank in range(3) if rank != first)
    assert f"hpcdl run: {others} failed with the same error" in lines, lines


def _memory_cgroup(tmp_path: Path) -> Path | None:
    """A new memory cgroup (v1 or v2) below this process's, limited to 400 MiB without swap; None when
    this machine does not let us make one."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "" and Path("/sys/fs/cgroup/cgroup.controllers").exists():
            base, limits = (
                Path("/sys/fs/cgroup") / path.lstrip("/"),
                {"memory.max": "400M", "memory.swap.max": "0"},
            )
        elif "memory" in controllers.split(","):
            base = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            limits = {"memory.limit_in_bytes": "400M", "memory.memsw.limit_in_bytes": "400M"}
        else:
            continue
        group = base / f"hpcdl-oom-test-{os.getpid()}-{tmp_path.name}"
        try:
            group.mkdir()
        except OSError:
            return None
        for name, value in limits.items():
            knob = group / name
            if knob.exists():
                knob.write_text(value)
        return group
    return None


def test_an_oom_killed_rank_is_named_with_the_kernels_words(tmp_path: Path) -> None:
    group = _memory_cgroup(tmp_path)
    if group is None:
        pytest.skip("cannot make a memory cgroup here (needs root and a writable cgroup file system)")
    try:
        # hpcdl run, its agents and ranks all start inside the limited cgroup
        launcher = [sys.executable, "-m", "hpcdl", "run", "-np", "2", sys.executable, RANKS, "oom"]
        enter = f'echo $$ > {group / "cgroup.procs"} && exec "$@"'
        done = subprocess.run(
            ["sh", "-c", enter, "sh", *launcher],
            capture_output=True, text=True, timeout=120, env=clean_env(), cwd=tmp_path,
        )  # fmt: skip
    finally:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)
    lines = summary(done.stderr)
    assert done.returncode == 128 + 9, done.stderr
    assert lines[0].startswith(
        f"hpcdl run: rank 1 on host {HOST} was killed by signal SIGKILL (9): the kernel's OOM killer ended "
        "it ("
    ), lines
    assert "Killed process" in lines[0] or "oom_kill in /sys/fs/cgroup/" in lines[0]


def test_every_ranks_stack_on_request_names_where_each_is(tmp_path: Path) -> None:
    """hpcdl debug stacks: rank 0 waits in a collective, rank 1 sleeps in the user's function, rank 2 in a
    C call that holds the GIL; each stack says so."""
    job = subprocess.Popen(
        [sys.executable, "-m", "hpcdl", "run", "-np", "3", sys.executable, RANKS, "stuck"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
        env=clean_env(CULPRIT="1", SECOND="2:stuck-in-c"),
    )  # fmt: skip
    try:
        # Until every rank is where it stays: rank 0 may still be in init() while the others already sleep.
        deadline, shown, parts = time.monotonic() + 60, "", []
        while not (len(parts) == 4 and "in synchronize" in parts[1] and "in stuck_in_dataloader" in parts[2]
                   and "in stuck_in_c_call" in parts[3]):  # fmt: skip
            assert time.monotonic() < deadline, f"the stacks never showed where the ranks are:\n{shown}"
            asked = subprocess.run(
                [sys.executable, "-m", "hpcdl", "debug", "stacks"],
                capture_output=True, text=True, cwd=tmp_path, timeout=30, env=clean_env(),
            )  # fmt: skip
            shown = asked.stdout + asked.stderr
            parts = shown.split("=== rank ")
    finally:
        job.terminate()
        _, stderr = job.communicate(timeout=30)
    assert [part.split(" ===")[0] for part in parts[1:]] == [f"{r} on host {HOST}" for r in range(3)]
    assert "first_failure_ranks.py" in parts[1]
    assert parts[2].index("in stuck_in_dataloader") < parts[2].index("in fail")  # innermost first
    assert "in stuck_in_c_call" in parts[3]
    (directory,) = (tmp_path / "hpcdl-debug").iterdir()
    assert (
        f"hpcdl run: Python stacks of every rank, on SIGQUIT (also in {directory / 'stacks.txt'}):" in stderr
    )
    assert (directory / "stacks.txt").read_text() == shown
    assert not (directory / "launcher.json").exists()  # removed as the job ended


def test_debug_stacks_without_a_running_job_says_what_to_give(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "hpcdl", "debug", "stacks"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=30,
    )
    assert done.returncode == 2
    assert "name the job: hpcdl debug stacks JOB (no job started here runs on this host" in done.stderr
    done = subprocess.run(
        [sys.executable, "-m", "hpcdl", "debug", "stacks", "12345"],
        capture_output=True, text=True, cwd=tmp_path, timeout=30,
    )  # fmt: skip
    assert done.returncode == 2 and "no job '12345'" in done.stderr
