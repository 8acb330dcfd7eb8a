"""Runs one rank for ``hpcdl run``: ``python -c <this file>``, here or on another host over ssh.

Standard library only (a remote host needs Python, not hpcdl, to run plain programs). Protocol on stdin: the
first line is JSON ``{"argv", "env", "cwd", "token"}`` (so the job secret never appears on a command line),
optionally with ``interfaces`` (the first of these network interfaces this host has becomes the rank's
HPCDL_IFACE) and ``master_board`` (``host:port`` of the launcher's board, through which rank 0 publishes the
MASTER_PORT it holds and the other ranks learn it, with ``board_client``: the source of
``hpcdl.common.handshake``, which proves the job's secret to the board without sending it) and ``stacks``
(``{"signal", "file"}``: how ``hpcdl.common.stacks`` has the rank dump its Python stacks); later lines
``signal N`` forward a signal to the rank's process group, and ``stacks`` asks the rank for its Python stacks,
answered ``<token> stacks <base64>``. EOF on stdin means the launcher is gone (even killed with SIGKILL, or
its ssh connection lost): the rank's process group gets SIGTERM, then SIGKILL, so no rank outlives its
launcher. When the rank ends, the agent writes ``<token> exit <returncode>`` on stderr and exits, after
``<token> oom <what the kernel said>`` when its OOM killer ended the rank; ``<token> pid <pid>`` after the
start names the rank's process group. The launcher strips these lines from the rank's output. The rank also
gets torch.distributed's GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME (:func:`socket_interface_env`) unless it
has them. ``hpcdl.runner.step_agent`` and ``hpcdl.runner.mpi_rank`` reuse these pieces for ranks started by a
scheduler's launcher or by mpirun.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from types import ModuleType
from typing import Any, BinaryIO, Callable

GRACE_SECONDS = 3.0
STACKS_SECONDS = 3.0  # how long a rank gets to write its Python stacks
DMESG_TIMEOUT_SECONDS = 5.0
_SIOCGIFADDR = 0x8915  # Linux ioctl: IPv4 address of an interface


def signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _stop_group(child: subprocess.Popen) -> None:
    signal_group(child.pid, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_SECONDS
    while child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    signal_group(child.pid, signal.SIGKILL)


def follow_control(
    stdin: BinaryIO, child: subprocess.Popen, on_stacks: Callable[[], None] | None = None
) -> None:
    """Forward ``signal N`` lines to the rank's group, answer ``stacks`` lines with `on_stacks` (in a thread
    of its own, so that a slow dump delays no signal); stop the rank when stdin ends (thread target)."""
    for line in stdin:
        words = line.split()
        if len(words) == 2 and words[0] == b"signal":
            signal_group(child.pid, int(words[1]))
        elif words == [b"stacks"] and on_stacks is not None:
            threading.Thread(target=on_stacks, daemon=True).start()
    _stop_group(child)


def _group(pgid: int) -> dict[int, int]:
    """The processes of process group `pgid`: pid -> parent pid (from /proc)."""
    members = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid:
            members[int(entry)] = int(fields[1])
    return members


def _catches(pid: int, signum: int) -> bool:
    """Whether process `pid` has a handler for `signum` (its SigCgt mask in /proc): an unhandled real-time
    signal would kill it."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def dump_stacks(pgid: int, signum: int, path: str, timeout: float = STACKS_SECONDS) -> str:
    """The Python stacks of the rank whose process group is `pgid`: its topmost processes that catch `signum`
    (``hpcdl.common.stacks``' handler, installed by ``init()``) write them into `path` when signalled. Their
    text, or a line in parentheses saying why there is none."""
    members = _group(pgid)
    catchers = {pid for pid in members if _catches(pid, signum)}
    topmost = sorted(pid for pid in catchers if members[pid] not in catchers)
    if not topmost:
        return "(no Python stacks: the rank has not called hpcdl's init(), or does not run Python)"
    try:
        os.truncate(path, 0)
    except OSError as exc:
        return f"(no Python stacks: cannot reach {path}: {exc.strerror})"
    for pid in topmost:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
    deadline, size = time.monotonic() + timeout, -1
    while time.monotonic() < deadline:
        time.sleep(0.02)
        now = os.stat(path).st_size
        if now > 0 and now == size:  # written and no longer growing
            break
        size = now
    with open(path, errors="replace") as dump:
        text = dump.read()
    return text or f"(no Python stacks: the rank wrote none within {timeout:g} s)"


def encode_stacks(text: str) -> str:
    """`text` as one word of an agent's status line."""
    return base64.b64encode(text.encode()).decode()


def ipv4_of(iface: str) -> str | None:
    """The (primary) IPv4 address of interface `iface`, or None when it has none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            packed = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, struct.pack("256s", iface[:15].encode()))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def _has_ipv4(iface: str) -> bool:
    return ipv4_of(iface) is not None


def choose_interface(interfaces: list[str]) -> dict[str, str]:
    """``--network-interfaces a,b``: HPCDL_IFACE is the first of them this host has with an IPv4 address (the
    first one when it has none, so the runtime names it in its error); NCCL takes the whole list."""
    present = [iface for iface in interfaces if _has_ipv4(iface)]
    return {"HPCDL_IFACE": (present or interfaces)[0], "NCCL_SOCKET_IFNAME": ",".join(interfaces)}


# torch.distributed's choice of network interface. Unset, gloo binds the address this host's own name
# resolves to, which Debian and Ubuntu map to 127.0.1.1: peers on other hosts cannot reach it.
SOCKET_IFNAME_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def interface_towards(host: str) -> str | None:
    """The interface of this host whose address the kernel uses to reach `host` (an address or a name;
    no packet is sent), or None when that is unknown."""
    try:
        target = socket.gethostbyname(host)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect((target, 9))
            source = sock.getsockname()[0]
    except OSError:
        return None
    return _interface_holding(source)


def _interface_holding(address: str) -> str | None:
    return next((name for _, name in socket.if_nameindex() if ipv4_of(name) == address), None)


def meeting_interface(env: Mapping[str, str]) -> str | None:
    """The network interface of this host for a rank with environment `env`: the one HPCDL_IFACE names
    (an interface or one of this host's addresses) when this host has it, else the one this host reaches the
    job's rendezvous through (HPCDL_RENDEZVOUS_ADDR, the elastic driver or MASTER_ADDR: where the launcher
    chose that the ranks meet); None when unknown."""
    chosen = env.get("HPCDL_IFACE", "")
    iface = (chosen if _has_ipv4(chosen) else _interface_holding(chosen)) if chosen else None
    if iface is None:
        meeting = env.get("HPCDL_RENDEZVOUS_ADDR") or env.get("HPCDL_ELASTIC_DRIVER", "").rpartition(":")[0]
        meeting = meeting or env.get("MASTER_ADDR", "")
        iface = interface_towards(meeting) if meeting else None
    return iface


def socket_interface_env(env: Mapping[str, str]) -> dict[str, str]:
    """GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME, those `env` does not set already, as the rank's
    :func:`meeting_interface` (empty when it is unknown)."""
    missing = [name for name in SOCKET_IFNAME_VARIABLES if not env.get(name)]
    iface = meeting_interface(env) if missing else None
    return {name: iface for name in missing} if iface else {}


def reserve_port() -> socket.socket:
    """A TCP port of this host held for someone else to listen on: bound with SO_REUSEADDR but not listening.

    While it is held, the kernel gives the port to no other bind(port 0) and to no outgoing connection, and
    refuses it to a bind without SO_REUSEADDR; a server that sets SO_REUSEADDR (torch.distributed's TCPStore
    does) can still bind and listen on it. Only a program that binds this very number with SO_REUSEADDR could
    take it first, so MASTER_PORT stays free from the moment it is chosen until rank 0 listens on it.
    """
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("0.0.0.0", 0))
    return holder


def board_client(source: str) -> ModuleType:
    """``hpcdl.common.handshake`` from the source the launcher sent (this host may not have hpcdl)."""
    module = ModuleType("hpcdl_board_client")
    sys.modules[module.__name__] = module  # dataclasses look their module up
    exec(compile(source, "hpcdl/common/handshake.py", "exec"), module.__dict__)
    return module


def board_request(client: Any, board: str, secret: str, request: dict[str, Any], timeout: float) -> Any:
    """One request to the launcher's board (``hpcdl.runner.board``), proving the job's secret through
    `client` (``hpcdl.common.handshake``); OSError when it fails."""
    host, _, port = board.rpartition(":")
    where = f"the launcher's board at {board}"
    try:
        answer = client.request((host, int(port)), secret, request, timeout, where)
    except (RuntimeError, ValueError) as exc:  # the handshake's errors, a malformed address or answer
        raise OSError(str(exc)) from None
    if not isinstance(answer, dict):
        raise OSError(f"{where} answered something else than a JSON object")
    if "error" in answer:
        raise OSError(f"{where}: {answer['error']}")
    return answer


def learn_master_port(
    board: str, secret: str, rank: int, timeout: float, client: Any = None
) -> tuple[socket.socket | None, int]:
    """Rank 0 reserves MASTER_PORT on its host and posts it to the board (returning the holder to keep);
    the others wait up to `timeout` s for it. `client`: ``hpcdl.common.handshake`` (imported when None).
    OSError when that fails."""
    if client is None:
        from hpcdl.common import handshake as client
    request: dict[str, Any] = {"key": "MASTER_PORT"}
    if rank == 0:
        holder = reserve_port()
        port = holder.getsockname()[1]
        board_request(client, board, secret, {**request, "op": "put", "value": str(port)}, timeout)
        return holder, port
    # The board answers within `timeout` (nobody published it: an error); the margin lets that answer arrive.
    answer = board_request(client, board, secret, {**request, "op": "get", "wait": timeout}, timeout + 5.0)
    try:
        return None, int(answer["value"])
    except (KeyError, TypeError, ValueError):
        raise OSError(f"the launcher's board at {board} answered no port: {answer}") from None


def oom_kill_count() -> tuple[str, int] | None:
    """This process's memory cgroup file and how many processes the kernel's OOM killer ended in that cgroup
    (``oom_kill`` of cgroup v2's memory.events, v1's memory.oom_control); None where it cannot be read."""
    try:
        with open("/proc/self/cgroup") as lines:
            entries = [line.rstrip("\n").split(":", 2) for line in lines]
    except OSError:
        return None
    for entry in entries:
        if len(entry) != 3:
            continue
        _, controllers, path = entry
        if controllers == "":
            candidates = [f"/sys/fs/cgroup{root}{path}/memory.events" for root in ("", "/unified")]
        elif "memory" in controllers.split(","):
            candidates = [f"/sys/fs/cgroup/memory{path}/memory.oom_control"]
        else:
            continue
        for candidate in candidates:
            try:
                with open(candidate) as counters:
                    for counter in counters:
                        key, _, value = counter.partition(" ")
                        if key == "oom_kill" and value.strip().isdigit():
                            return candidate, int(value)
            except OSError:
                continue
    return None


def oom_report(before: tuple[str, int] | None, pid: int) -> str:
    """What shows that the kernel's OOM killer ended process `pid` (killed by SIGKILL): the kernel log naming
    it, where this user may read it, else its memory cgroup's ``oom_kill`` count having grown since `before`
    (``oom_kill_count()`` when the process started); '' when neither does."""
    try:
        log = subprocess.run(
            ["dmesg"], capture_output=True, text=True, timeout=DMESG_TIMEOUT_SECONDS, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        log = ""
    for line in reversed(log.splitlines()):
        if f"Killed process {pid} " in line:
            return "the kernel log says: " + line.split("] ", 1)[-1].strip()
    after = oom_kill_count()
    if before is not None and after is not None and after[0] == before[0] and after[1] > before[1]:
        return f"oom_kill in {after[0]} went from {before[1]} to {after[1]}"
    return ""


def interrupts_by_default() -> None:
    """In the rank's process, before exec: SIGINT back at its default. A launcher started with it ignored
    (a non-interactive shell starts background commands so) passes that on to its agents, and the rank
    would never see the Ctrl-C the launcher forwards; a Python rank would get no KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def main() -> None:
    stdin = sys.stdin.buffer
    spec = json.loads(stdin.readline())
    env = dict(os.environ)
    env.update(spec["env"])
    if spec.get("interfaces"):
        env.update(choose_interface(spec["interfaces"]))
    env.update(socket_interface_env(env))
    holder = None  # rank 0's reservation of MASTER_PORT, held while the rank runs
    if spec.get("master_board"):
        try:
            holder, port = learn_master_port(
                spec["master_board"],
                env.get("HPCDL_SECRET", ""),
                spec["rank"],
                spec["start_timeout"],
                board_client(spec["board_client"]),
            )
        except OSError as exc:
            sys.stderr.write(f"hpcdl run: rank {spec['rank']}: {exc}\n")
            sys.stderr.write(f"{spec['token']} exit 1\n")
            sys.stderr.flush()
            os._exit(1)
        env["MASTER_PORT"] = str(port)
    try:
        os.chdir(spec["cwd"])
    except OSError as exc:
        sys.stderr.write(
            f"hpcdl run: cannot enter {spec['cwd']} here ({exc.strerror}); staying in {os.getcwd()}\n"
        )
    oom_before = oom_kill_count()
    try:
        child = subprocess.Popen(
            spec["argv"],
            env=env,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=interrupts_by_default,
        )
    except OSError as exc:
        sys.stderr.write(f"hpcdl run: cannot start {spec['argv'][0]}: {exc.strerror}\n")
        sys.stderr.write(f"{spec['token']} exit 127\n")
        sys.stderr.flush()
        os._exit(127)
    sys.stderr.write(f"{spec['token']} pid {child.pid}\n")
    sys.stderr.flush()
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, lambda received, _frame: signal_group(child.pid, received))

    def answer_stacks() -> None:
        where = spec["stacks"]
        text = dump_stacks(child.pid, where["signal"], where["file"])
        sys.stderr.write(f"{spec['token']} stacks {encode_stacks(text)}\n")
        sys.stderr.flush()

    on_stacks = answer_stacks if spec.get("stacks") else None
    threading.Thread(target=follow_control, args=(stdin, child, on_stacks), daemon=True).start()
    returncode = child.wait()
    signal_group(child.pid, signal.SIGKILL)  # nothing the rank started outlives it
    if holder is not None:
        holder.close()
    sys.stdout.flush()
    oom = oom_report(oom_before, child.pid) if returncode == -signal.SIGKILL else ""
    if oom:
        sys.stderr.write(f"{spec['token']} oom {oom}\n")
    sys.stderr.write(f"{spec['token']} exit {returncode}\n")
    sys.stderr.flush()
    # os._exit: the control thread may sit in a read of stdin, which blocks interpreter shutdown.
    os._exit(returncode if returncode >= 0 else 128 - returncode)


if __name__ == "__main__":
    main()
