"""The rendezvous server a batch script hosts (``python -m hpcdl.runner.batch_rendezvous``), started the way
the generated scripts start it: its one line, real ranks meeting at it, a port the user fixed, and its end
with the script's shell. (Through real Slurm jobs: tests/integration/test_slurm_submit.py.)"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from runner_helpers import clean_env, is_running, wait_gone

SECRET = "7e" * 32


def start(size: int, *flags: str, **env: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "hpcdl.runner.batch_rendezvous", "--size", str(size), *flags],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=clean_env(HPCDL_SECRET=SECRET, **env),
    )  # fmt: skip


def first_line(server: subprocess.Popen) -> list[str]:
    assert server.stdout is not None
    return server.stdout.readline().split()


def test_ranks_meet_at_the_server_and_master_port_is_held() -> None:
    server = start(2, "--master-port")
    try:
        addr, port, master_addr, master_port, iface, pid = first_line(server)
        assert int(pid) == server.pid and master_addr == addr and master_port != port
        assert iface in [name for _, name in socket.if_nameindex()]  # for GLOO/NCCL_SOCKET_IFNAME
        # a program that picks the announced MASTER_PORT a moment later
        with socket.socket() as late, pytest.raises(OSError, match="Address already in use"):
            late.bind(("0.0.0.0", int(master_port)))
        code = (
            "import numpy as np, hpcdl.common as c; c.init(); "
            "print(float(c.allreduce(np.array([c.rank() + 1.0]))[0]), flush=True); c.shutdown()"
        )
        meeting = {"HPCDL_SECRET": SECRET, "HPCDL_RENDEZVOUS_ADDR": addr, "HPCDL_RENDEZVOUS_PORT": port}
        ranks = []
        for rank in range(2):
            identity = {"SLURM_PROCID": str(rank), "SLURM_NTASKS": "2", "SLURM_LOCALID": str(rank)}
            command = [sys.executable, "-c", code]
            ranks.append(
                subprocess.Popen(
                    command, stdout=subprocess.PIPE, text=True, env=clean_env(**meeting, **identity)
                )
            )
        assert [rank.communicate(timeout=60)[0].strip() for rank in ranks] == ["3.0", "3.0"]
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=10) == 0


def test_a_port_the_user_fixed_is_used_and_named_when_taken() -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = start(2, HPCDL_RENDEZVOUS_PORT=str(port))
        _, stderr = server.communicate(timeout=60)
        assert server.returncode == 1
        assert f"cannot host the job's rendezvous on port {port} (your HPCDL_RENDEZVOUS_PORT)" in stderr
        assert "choose another port or unset it" in stderr
    server = start(2, HPCDL_RENDEZVOUS_PORT=str(port))  # free again now
    try:
        assert first_line(server)[1] == str(port)
        assert first_line(server) == []  # nothing more on stdout, ever
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=10)


def test_the_probe_names_this_host_a_free_port_and_the_interface_towards_the_rendezvous() -> None:
    """What a Cobalt or LSF script runs on the first compute node (its own node is a service node)."""
    probe = [sys.executable, "-m", "hpcdl.runner.batch_rendezvous", "--probe"]
    done = subprocess.run(
        probe, capture_output=True, text=True, timeout=60, env=clean_env(HPCDL_RENDEZVOUS_ADDR="127.0.0.1")
    )
    host, port, iface = done.stdout.split()
    assert (host, iface) == (socket.gethostname(), "lo") and int(port) > 0, done.stderr


def test_without_the_secret_it_says_so() -> None:
    server = subprocess.run(
        [sys.executable, "-m", "hpcdl.runner.batch_rendezvous", "--size", "2"],
        capture_output=True, text=True, timeout=60, env=clean_env(),
    )  # fmt: skip
    assert server.returncode == 1 and "needs HPCDL_SECRET" in server.stderr


def test_it_ends_when_the_scripts_shell_is_gone() -> None:
    """Started as the scripts start it (bash process substitution); the shell is killed with SIGKILL, so no
    EXIT trap runs: the server notices it was re-parented and leaves."""
    script = (
        'exec {fd}< <(exec "$0" -m hpcdl.runner.batch_rendezvous --size 2)\n'
        'read -r -t 60 addr port maddr mport iface pid <&"$fd"\n'
        'echo "$pid"\n'
        "sleep 60\n"
    )
    shell = subprocess.Popen(
        ["bash", "-c", script, sys.executable], stdout=subprocess.PIPE, text=True,
        env=clean_env(HPCDL_SECRET=SECRET),
    )  # fmt: skip
    try:
        assert shell.stdout is not None
        pid = int(shell.stdout.readline())
        assert is_running(pid)
        os.kill(shell.pid, signal.SIGKILL)
        shell.wait(timeout=10)
        started = time.monotonic()
        assert wait_gone([pid], 10.0) == []
        assert time.monotonic() - started < 5
    finally:
        if shell.poll() is None:
            shell.kill()
            shell.wait()


def test_a_script_gone_before_the_line_is_read_stops_the_server_without_a_traceback() -> None:
    """The script can die before it reads the line (killed, or a signal it had no trap for yet)."""
    server = start(2, "--master-port")
    assert server.stdout is not None
    server.stdout.close()  # the only reader of the line is gone
    _, stderr = server.communicate(timeout=60)
    assert server.returncode == 1
    assert stderr.strip() == "hpcdl: the job script that started this rendezvous server is gone"
