"""A rank that dies or hangs makes the others fail within the deadline, naming it; nothing leaks."""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from _ranks import run_ranks

FAILURES = str(Path(__file__).with_name("_failure_checks.py"))


def shm_segments() -> set[str]:
    return {name for name in os.listdir("/dev/shm") if name.startswith("hpcdl-")}


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_killed_rank_is_named_by_the_others(transport: str) -> None:
    before = shm_segments()
    results = run_ranks(
        3,
        FAILURES,
        args=("kill",),
        env={"HPCDL_TRANSPORT": transport, "CHECK_TIMEOUT": "20"},
        launcher="manual",
        timeout=60,
    )
    assert results[2].returncode == -9  # SIGKILL
    for r in results[:2]:
        assert r.result is not None, r.stderr
        assert r.result["error"] == "HpcdlInternalError", r.result
        assert "rank 2" in r.result["message"] and "allreduce" in r.result["message"], r.result["message"]
        # noticed as a death (process gone / connection lost), well before the 20 s deadline
        assert r.result["seconds"] < 5, r.result
    # no segment of these ranks (/hpcdl-<creator pid>-...) left in /dev/shm although one was SIGKILLed;
    # segments of other jobs running meanwhile (another test file, another user) come and go
    pids = {str(r.extra["pid"]) for r in results}
    assert not {name for name in shm_segments() - before if name.split("-")[1] in pids}


def test_a_hung_rank_times_out_naming_it() -> None:
    results = run_ranks(
        3, FAILURES, args=("hang",), env={"CHECK_TIMEOUT": "2"}, launcher="manual", timeout=90
    )
    for r in results[:2]:
        assert r.result["error"] == "HpcdlTimeoutError", r.result
        assert "rank 2" in r.result["message"] and "timed out" in r.result["message"]
        assert 1.5 < r.result["seconds"] < 5, r.result


def _hostile_clients(port: int, stop: threading.Event) -> None:
    """Garbage, a silent half-open connection and a forged handshake at the rendezvous port."""
    silent = []
    while not stop.is_set():
        for payload in (
            b"GET / HTTP/1.0\r\n\r\n",
            b"HPCDLAU1" + b"\0" * 72 + b"\xff\xff\xff\x7f",
            os.urandom(300),
        ):
            try:
                s = socket.create_connection(("127.0.0.1", port), timeout=1)
                s.sendall(payload)
                s.close()
                silent.append(socket.create_connection(("127.0.0.1", port), timeout=1))
            except OSError:
                pass
        time.sleep(0.05)
    for s in silent:
        s.close()


def test_stray_connections_do_not_disturb_the_rendezvous(monkeypatch: pytest.MonkeyPatch) -> None:
    import _ranks

    from hpcdl.common.rendezvous import RendezvousServer

    stop = threading.Event()
    threads = []
    real_start = RendezvousServer.start

    def start_and_attack(self: RendezvousServer) -> None:
        real_start(self)
        t = threading.Thread(target=_hostile_clients, args=(self.port, stop), daemon=True)
        t.start()
        threads.append(t)

    monkeypatch.setattr(_ranks.RendezvousServer, "start", start_and_attack)
    try:
        code = (
            "import hpcdl.common as hc, numpy as np\nhc.init(timeout=20)\n"
            "print('RESULT', int(hc.allreduce(np.ones(4))[0]), flush=True)\nhc.shutdown()\n"
        )
        results = run_ranks(3, code, launcher="manual", timeout=60)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert threads, "the attack never started"
    assert [r.result for r in results] == [3, 3, 3], [r.stderr for r in results]


def test_a_rank_with_the_wrong_secret_is_refused() -> None:
    code = (
        "import hpcdl.common as hc\ntry:\n    hc.init(timeout=4)\nexcept hc.HpcdlAuthError as e:\n"
        "    print('RESULT', '\"refused\"', flush=True)\n"
    )
    results = run_ranks(
        2,
        code,
        launcher="manual",
        rank_env=lambda r: {"HPCDL_SECRET": "0" * 64} if r == 1 else {},
        timeout=60,
    )
    assert results[1].result == "refused", results[1].stderr


def test_interface_selection_and_static_process_sets() -> None:
    code = (
        "import json, hpcdl.common as hc, numpy as np\n"
        "hc.init(process_sets=[[0, 1]], transport='tcp')\n"
        "got = hc.allreduce(np.ones(3), process_set=1) if hc.rank() < 2 else [0]\n"
        "seen = [hc.process_set_ids(), int(got[0]), hc.transport_name(True)]\n"
        "print('RESULT', json.dumps(seen), flush=True)\n"
        "hc.shutdown()\n"
    )
    results = run_ranks(3, code, env={"HPCDL_IFACE": "lo"}, launcher="manual", timeout=60)
    assert [r.result for r in results[:2]] == [[[0, 1], 2, "tcp"]] * 2, [r.stderr for r in results]
    bad = (
        "import json, hpcdl.common as hc\ntry:\n    hc.init(timeout=5)\nexcept hc.HpcdlError as e:\n"
        "    print('RESULT', json.dumps(str(e)))\n"
    )
    results = run_ranks(2, bad, env={"HPCDL_IFACE": "no-such-nic0"}, launcher="manual", timeout=60)
    for r in results:
        assert "no-such-nic0" in r.result and "lo" in r.result, r.result  # names the interfaces there are


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare")
def test_a_full_dev_shm_is_a_clear_error_not_a_crash() -> None:
    # The ranks run in a private mount namespace whose /dev/shm holds 1 MiB (less than one segment).
    inner = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from _ranks import run_ranks\n"
        "code = 'import json, hpcdl.common as hc\\ntry:\\n    hc.init(timeout=10)\\n"
        'except hc.HpcdlError as e:\\n    print("RESULT", json.dumps(str(e)))\\n\'\n'
        "print([r.result for r in run_ranks(2, code, launcher='manual', timeout=60)])\n"
    )
    script = f"mount -t tmpfs -o size=1m tmpfs /dev/shm && exec {sys.executable} -c {shlex.quote(inner)}"
    done = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr
    assert "/dev/shm" in done.stdout and "HPCDL_SHM_CHUNK_BYTES" in done.stdout, done.stdout + done.stderr


def test_a_missing_rank_is_named_at_the_rendezvous() -> None:
    from hpcdl.common.rendezvous import RendezvousServer, make_secret

    secret = make_secret()
    code = (
        "import hpcdl.common as hc\ntry:\n    hc.init(timeout=3)\n"
        "except hc.HpcdlTimeoutError as e:\n    print(e)\n"
    )
    with RendezvousServer(4, secret, host="127.0.0.1") as server:
        procs = []
        for rank in (0, 2):  # ranks 1 and 3 never start
            env = dict(os.environ, HPCDL_RANK=str(rank), HPCDL_SIZE="4", HPCDL_RENDEZVOUS_ADDR="127.0.0.1")
            env.update(HPCDL_RENDEZVOUS_PORT=str(server.port), HPCDL_SECRET=secret)
            procs.append(
                subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
            )
        outputs = [p.communicate(timeout=60)[0] for p in procs]
        assert server.arrived() == [0, 2]
    for out in outputs:
        assert "still missing: rank 1, 3" in out and "same size, secret" in out, out
