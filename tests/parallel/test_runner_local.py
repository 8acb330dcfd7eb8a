"""``hpcdl run`` with real local ranks: the environment they see, output, exit codes, failures,
signals and leftovers."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from runner_helpers import (
    clean_env,
    hpcdl_run,
    rank_lines,
    read_pids,
    wait_files,
    wait_gone,
)

SHOW_ENV = r"""
import json, os
wanted = ("HPCDL_", "HOROVOD_", "FOO")
names = sorted(k for k in os.environ if k.startswith(wanted))
secret = os.environ.get("HPCDL_SECRET", "")
cmdlines = [open(f"/proc/{pid}/cmdline", "rb").read() for pid in ("self", str(os.getppid()))]
print(json.dumps({
    "env": {k: os.environ[k] for k in names},
    "secret_on_a_command_line": bool(secret) and any(secret.encode() in c for c in cmdlines),
    "cwd": os.getcwd(),
}))
"""

# Each rank records its pid and the pid of a background child, then waits; rank 1 misbehaves.
MISBEHAVE = r"""
import os, signal, subprocess, sys, time
rank = int(os.environ["HPCDL_RANK"])
out = sys.argv[1]
try:  # Ctrl-C may arrive as soon as the pid files exist, even while rank 1 still waits for the others
    child = subprocess.Popen(["sleep", "60"])
    for name, pid in (("child", child.pid), ("rank", os.getpid())):
        with open(f"{out}/{name}{rank}.tmp", "w") as f:
            f.write(str(pid))
        os.rename(f"{out}/{name}{rank}.tmp", f"{out}/{name}{rank}.pid")
    if rank == 1 and sys.argv[2] != "wait":
        size = int(os.environ["HPCDL_SIZE"])
        while len([p for p in os.listdir(out) if p.startswith("rank") and p.endswith(".pid")]) < size:
            time.sleep(0.05)
        print("rank 1 is about to fail", file=sys.stderr, flush=True)
        if sys.argv[2] == "exit":
            sys.exit(3)
        if sys.argv[2] == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)
except KeyboardInterrupt:
    print(f"rank {rank} got SIGINT", flush=True)
    raise
"""


@pytest.mark.parametrize("num_proc", [1, 2, 4])
def test_environment_of_each_rank(tmp_path: Path, num_proc: int) -> None:
    script = tmp_path / "show_env.py"
    script.write_text(SHOW_ENV)
    done, _ = hpcdl_run(
        "-np",
        str(num_proc),
        "-x",
        "FOO=bar",
        "--cycle-time-ms",
        "2",
        sys.executable,
        str(script),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    seen = [json.loads(rank_lines(done.stdout, rank)[0]) for rank in range(num_proc)]
    host = socket.gethostname()
    secrets = set()
    for rank, report in enumerate(seen):
        env = report["env"]
        for prefix in ("HPCDL_", "HOROVOD_"):
            assert env[prefix + "RANK"] == str(rank)
            assert env[prefix + "SIZE"] == str(num_proc)
            assert env[prefix + "LOCAL_RANK"] == str(rank)
            assert env[prefix + "LOCAL_SIZE"] == str(num_proc)
            assert env[prefix + "CROSS_RANK"] == "0"
            assert env[prefix + "CROSS_SIZE"] == "1"
            assert env[prefix + "HOSTNAME"] == host
        assert env["FOO"] == "bar"
        assert env["HPCDL_CYCLE_TIME"] == "2"
        assert report["cwd"] == str(tmp_path)
        if "HPCDL_RENDEZVOUS_PORT" in env:  # a rendezvous server is hosted by the launcher
            assert env["HPCDL_RENDEZVOUS_ADDR"] == "127.0.0.1"
            assert re.fullmatch(r"[0-9a-f]{64}", env["HPCDL_SECRET"])
            secrets.add(env["HPCDL_SECRET"])
        assert not report["secret_on_a_command_line"]
    assert len(secrets) <= 1  # one job, one secret


def test_plain_program_and_prefixes() -> None:
    done, _ = hpcdl_run("-np", "2", "hostname")
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == [
        f"[0]<stdout>:{socket.gethostname()}",
        f"[1]<stdout>:{socket.gethostname()}",
    ]
    done, _ = hpcdl_run("-np", "2", "--", "sh", "-c", "echo to-err >&2; printf 'no newline'")
    assert done.returncode == 0
    assert "[0]<stderr>:to-err" in done.stderr and "[1]<stderr>:to-err" in done.stderr
    assert sorted(done.stdout.splitlines()) == ["[0]<stdout>:no newline", "[1]<stdout>:no newline"]


def test_timestamps_and_per_rank_logs(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    args = ["-np", "2", "--prefix-output-with-timestamp", "--output-filename", str(logs)]
    command = ["sh", "-c", "echo out$HPCDL_RANK; echo err$HPCDL_RANK >&2"]
    done, _ = hpcdl_run(*args, "--", *command)
    assert done.returncode == 0, done.stderr
    assert re.search(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} \[1\]<stdout>:out1$", done.stdout, re.M)
    for rank in (0, 1):
        assert (logs / f"rank.{rank}" / "stdout").read_text() == f"out{rank}\n"
        assert (logs / f"rank.{rank}" / "stderr").read_text() == f"err{rank}\n"
    again, _ = hpcdl_run(*args, "--", *command)
    assert again.returncode == 2
    assert "already holds rank logs" in again.stderr and "--force" in again.stderr
    forced, _ = hpcdl_run(*args, "--force", "--", "sh", "-c", "echo new")
    assert forced.returncode == 0
    assert (logs / "rank.0" / "stdout").read_text() == "new\n"


@pytest.mark.parametrize(
    ("how", "code", "described"),
    [("exit", 3, "exited with code 3"), ("kill", 137, "was killed by signal SIGKILL (9)")],
)
def test_failing_rank_stops_the_others(tmp_path: Path, how: str, code: int, described: str) -> None:
    script = tmp_path / "misbehave.py"
    script.write_text(MISBEHAVE)
    done, elapsed = hpcdl_run("-np", "3", sys.executable, str(script), str(tmp_path), how)
    assert done.returncode == code, done.stderr
    assert elapsed < 15, f"the other ranks were not stopped promptly ({elapsed:.1f} s)"
    assert (
        f"hpcdl run: rank 1 on host {socket.gethostname()} {described}; stopped the other 2 rank(s)"
        in done.stderr
    )
    summary = done.stderr.split("last lines of its stderr", 1)[1]
    assert "rank 1 is about to fail" in summary
    pids = read_pids(tmp_path)
    assert len(pids) == 6  # three ranks and their background children
    assert wait_gone(pids, 2.0) == []


def _ignore_interrupts() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize(
    ("signum", "started_ignoring_interrupts"),
    [(signal.SIGINT, False), (signal.SIGTERM, False), (signal.SIGINT, True)],
)
def test_signal_to_launcher_reaches_every_rank(
    tmp_path: Path, signum: int, started_ignoring_interrupts: bool
) -> None:
    """Also when the launcher starts with SIGINT ignored, as a non-interactive shell starts a command
    run in the background (``hpcdl run ... &`` in a job script): the ranks still get the forwarded SIGINT."""
    script = tmp_path / "wait.py"
    script.write_text(MISBEHAVE)
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hpcdl",
            "run",
            "-np",
            "3",
            sys.executable,
            str(script),
            str(tmp_path),
            "none",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(),
        preexec_fn=_ignore_interrupts if started_ignoring_interrupts else None,
    )
    try:
        wait_files(tmp_path, "*.pid", 6)
        launcher.send_signal(signum)
        stdout, stderr = launcher.communicate(timeout=15)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 128 + signum, stderr
    assert f"received {signal.Signals(signum).name}; stopped all ranks" in stderr
    if signum == signal.SIGINT:  # Python ranks see Ctrl-C as KeyboardInterrupt
        assert sorted(line for line in stdout.splitlines() if "got SIGINT" in line) == [
            f"[{r}]<stdout>:rank {r} got SIGINT" for r in (0, 1, 2)
        ]
    assert wait_gone(read_pids(tmp_path), 2.0) == []


def test_errors_are_clear_and_exit_2(tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=2\nlocalhost slots=two\n")
    done, _ = hpcdl_run("-np", "2", "--hostfile", str(hostfile), "true")
    assert done.returncode == 2
    assert f"hpcdl run: error: {hostfile}:2: slots 'two' is not a whole number" in done.stderr
    assert "Traceback" not in done.stderr
    done, _ = hpcdl_run("-np", "3", "-H", "localhost:2", "true")
    assert done.returncode == 2 and "-np 3 asks for more ranks than the 2 slots of localhost:2" in done.stderr
    done, _ = hpcdl_run("-np", "2", "no-such-program-hpcdl")
    assert done.returncode == 2 and "command not found: no-such-program-hpcdl" in done.stderr
    done, _ = hpcdl_run("true")
    assert done.returncode == 2 and "hpcdl run -np N COMMAND" in done.stderr
    done, _ = hpcdl_run("-np", "1", "--log-level", "loud", "true")
    assert done.returncode == 2 and "'log_level' must be one of trace" in done.stderr


def test_config_file_and_flags(tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text("fusion_threshold_mb: 8\ncycle_time_ms: 5\nno-stall-check: true\n")
    done, _ = hpcdl_run(
        "-np", "1", "--config-file", str(config), "--cycle-time-ms", "1.5", "--",
        "sh", "-c", "echo $HPCDL_FUSION_THRESHOLD $HPCDL_CYCLE_TIME $HPCDL_STALL_CHECK_DISABLE",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert rank_lines(done.stdout, 0) == [f"{8 * 1024 * 1024} 1.5 1"]
    config.write_text("fusion_threshold: 8\n")
    done, _ = hpcdl_run("-np", "1", "--config-file", str(config), "true")
    assert done.returncode == 2
    assert "unknown setting 'fusion_threshold'; valid settings:" in done.stderr
    assert "fusion_threshold_mb" in done.stderr


def test_check_build_prints_the_matrix() -> None:
    done, _ = hpcdl_run("--check-build")
    assert done.returncode == 0, done.stderr
    assert "Available Frameworks:" in done.stdout and "Available Tensor Operations:" in done.stdout


def test_start_timeout_names_the_missing_rank(tmp_path: Path) -> None:
    pytest.importorskip("hpcdl.common.rendezvous", reason="the runtime's rendezvous module is not built yet")
    script = tmp_path / "half.py"
    script.write_text(
        "import os, time\n"
        "if os.environ['HPCDL_RANK'] == '0':\n"
        "    import hpcdl.common as c\n"
        "    c.init(timeout=60.0)\n"
        "time.sleep(60)\n"
    )
    started = time.monotonic()
    done, _ = hpcdl_run("-np", "2", "--start-timeout", "3", sys.executable, str(script))
    assert done.returncode == 1, done.stderr
    assert time.monotonic() - started < 20
    assert (
        f"rank(s) 1 (on {socket.gethostname()}) did not reach the rendezvous within --start-timeout 3 s"
        in done.stderr
    )


ALLREDUCE = r"""
import numpy as np
import hpcdl.common as hc
hc.init()
total = hc.allreduce(np.array([hc.rank() + 1.0]))
print(hc.rank(), hc.size(), hc.local_rank(), float(total[0]), flush=True)
hc.shutdown()
"""


@pytest.mark.parametrize("num_proc", [1, 3])
def test_hpcdl_ranks_meet_through_the_launchers_rendezvous(tmp_path: Path, num_proc: int) -> None:
    pytest.importorskip("hpcdl.common.rendezvous", reason="the runtime's rendezvous module is not built yet")
    script = tmp_path / "allreduce.py"
    script.write_text(ALLREDUCE)
    done, _ = hpcdl_run("-np", str(num_proc), "--timeout", "30", sys.executable, str(script))
    assert done.returncode == 0, done.stderr
    total = float(sum(range(1, num_proc + 1)))
    assert sorted(done.stdout.splitlines()) == [
        f"[{r}]<stdout>:{r} {num_proc} {r} {total}" for r in range(num_proc)
    ]


def test_killed_launcher_leaves_no_rank(tmp_path: Path) -> None:
    script = tmp_path / "wait.py"
    script.write_text(MISBEHAVE)
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hpcdl",
            "run",
            "-np",
            "2",
            sys.executable,
            str(script),
            str(tmp_path),
            "wait",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=clean_env(),
    )
    try:
        wait_files(tmp_path, "*.pid", 4)
    finally:
        launcher.kill()  # SIGKILL: the launcher cannot clean up; each rank's agent sees its stdin close
        launcher.wait(timeout=10)
    assert wait_gone(read_pids(tmp_path), 10.0) == []


def test_closed_terminal_does_not_hang_the_job() -> None:
    # `hpcdl run ... | head -1`: the launcher keeps draining the ranks after its stdout is gone
    done = subprocess.run(
        f"{sys.executable} -m hpcdl run -np 2 -- sh -c 'seq 1 50000' | head -1",
        shell=True, capture_output=True, text=True, timeout=60, env=clean_env(),
    )  # fmt: skip
    assert done.stdout.splitlines() == ["[0]<stdout>:1"] or done.stdout.splitlines() == ["[1]<stdout>:1"]
    assert "Traceback" not in done.stderr
