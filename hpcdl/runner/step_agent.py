"""Runs one rank of a step started by a scheduler's launcher (``srun``, ``flux run``, PALS ``mpiexec``,
``aprun``, ``jsrun``): ``python -m hpcdl.runner.step_agent [options] -- COMMAND...`` on every task.

The launcher starts the same command on every task; each agent finds its rank from the host it landed on
and its index among the tasks there (the launcher's variables, e.g. SLURMD_NODENAME and SLURM_LOCALID),
looked up in the placement ``hpcdl run`` decided, so every rank gets the identity, the torch.distributed
variables and the network interface ``hpcdl run`` would give it. It runs the rank as its own process group
and writes everything the rank prints as whole lines ``TOKEN RANK out|err TEXT`` on its stdout, then
``TOKEN RANK exit CODE`` (after ``TOKEN RANK oom TEXT`` when the kernel's OOM killer ended the rank): the
launcher merges the tasks' output, and these tags route every line to its rank. Signals to the agent reach
the rank's group; with ``--control-stdin`` (launchers that copy their stdin to every task) lines ``signal N``
do too, a line ``stacks`` asks the rank for its Python stacks (answered ``TOKEN RANK stacks BASE64``), and
the end of stdin stops the rank, as under the rank agent.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
from typing import BinaryIO

from hpcdl import jobenv
from hpcdl.runner.hosts import HostSlots, RankSlot, assign_ranks, parse_hosts_arg
from hpcdl.runner.rank_agent import (
    choose_interface,
    dump_stacks,
    encode_stacks,
    follow_control,
    interrupts_by_default,
    learn_master_port,
    oom_kill_count,
    oom_report,
    signal_group,
    socket_interface_env,
)
from hpcdl.runner.rank_env import rank_variables, torch_variables

RELAY_JOIN_SECONDS = 2.0


def _short(host: str) -> str:
    return host.split(".", 1)[0]


def find_slot(slots: list[RankSlot], host: str, local: int) -> RankSlot | None:
    """The slot placed on `host` (the same name, or the same short name) at local index `local`."""
    for slot in slots:
        if slot.local_rank == local and (slot.host == host or _short(slot.host) == _short(host)):
            return slot
    return None


def task_position(args: argparse.Namespace, hosts: list[HostSlots]) -> tuple[str, int]:
    """This task's host and its index among the tasks of that host, from the launcher's variables."""
    host = os.environ.get(args.host_variable or "", "") or socket.gethostname()
    if args.local_variable:
        return host, int(os.environ[args.local_variable])
    per_host = max(h.slots for h in hosts)  # aprun -N: block placement, so local = global % per host
    return host, int(os.environ[args.rank_variable]) % per_host


class TaggedWriter:
    """Whole tagged lines on this process's stdout, one write each, from several threads."""

    def __init__(self, token: str, rank: int) -> None:
        self._head = f"{token} {rank} ".encode()
        self._lock = threading.Lock()

    def line(self, kind: str, text: bytes) -> None:
        if not text.endswith(b"\n"):
            text += b"\n"
        data = self._head + kind.encode() + b" " + text
        with self._lock:
            while data:
                data = data[os.write(1, data) :]

    def relay(self, pipe: BinaryIO, kind: str) -> None:
        with pipe:
            for text in iter(pipe.readline, b""):
                self.line(kind, text)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m hpcdl.runner.step_agent")
    parser.add_argument("--token", required=True)
    parser.add_argument("--placement", required=True, help="host:ranks,... in rank order")
    parser.add_argument("--host-variable", default="")
    parser.add_argument("--local-variable", default="")
    parser.add_argument("--rank-variable", default="")
    parser.add_argument("--control-stdin", action="store_true")
    parser.add_argument(
        "--interfaces", default="", help="network interfaces, the first one this host has wins"
    )
    parser.add_argument("--keep", default="", help="per-rank variables the user set with -x")
    parser.add_argument("--master-board", default="", help="host:port where rank 0 posts MASTER_PORT")
    parser.add_argument("--start-timeout", type=float, default=30.0)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    return parser


def rank_environment(args: argparse.Namespace, slot: RankSlot) -> dict[str, str]:
    """The rank's environment: this task's, plus the identity ``hpcdl run`` placed here."""
    env = dict(os.environ)
    env.update(rank_variables(slot, None))
    keep = set(filter(None, args.keep.split(",")))
    env.update({k: v for k, v in torch_variables(slot).items() if k not in keep})
    if args.interfaces:
        env.update(choose_interface(args.interfaces.split(",")))
    env.update(socket_interface_env(env))
    return env


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    hosts = parse_hosts_arg(args.placement)
    slots = assign_ranks(hosts, sum(h.slots for h in hosts))
    host, local = task_position(args, hosts)
    slot = find_slot(slots, host, local)
    if slot is None:
        sys.stderr.write(
            f"hpcdl run: the launcher started a task on {host} (index {local} there), where hpcdl run placed "
            f"no rank (placement {args.placement}); the launcher placed the tasks differently\n"
        )
        return 1
    out = TaggedWriter(args.token, slot.rank)
    env = rank_environment(args, slot)
    holder = None  # rank 0's reservation of MASTER_PORT, held while the rank runs
    if args.master_board:
        try:
            holder, port = learn_master_port(
                args.master_board, env[jobenv.SECRET], slot.rank, args.start_timeout
            )
        except OSError as exc:
            out.line("err", f"hpcdl run: rank {slot.rank}: {exc}".encode())
            out.line("exit", b"1")
            return 1
        env["MASTER_PORT"] = str(port)
    oom_before = oom_kill_count()
    try:
        child = subprocess.Popen(
            command,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=interrupts_by_default,
        )
    except OSError as exc:
        out.line(
            "err",
            f"hpcdl run: cannot start {command[0] if command else '(nothing)'}: {exc.strerror}".encode(),
        )
        out.line("exit", b"127")
        return 127
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, lambda received, _frame: signal_group(child.pid, received))
    if args.control_stdin:

        def answer_stacks() -> None:
            from hpcdl.common import stacks  # the rank's stack dumps go where its environment says

            text = dump_stacks(child.pid, int(stacks.STACK_SIGNAL), str(stacks.stack_path(slot.rank)))
            out.line("stacks", encode_stacks(text).encode())

        control = (sys.stdin.buffer, child, answer_stacks)
        threading.Thread(target=follow_control, args=control, daemon=True).start()
    assert child.stdout is not None and child.stderr is not None
    relays = [
        threading.Thread(target=out.relay, args=(pipe, kind), daemon=True)
        for pipe, kind in ((child.stdout, "out"), (child.stderr, "err"))
    ]
    for relay in relays:
        relay.start()
    returncode = child.wait()
    signal_group(child.pid, signal.SIGKILL)  # nothing the rank started outlives it
    for relay in relays:
        relay.join(timeout=RELAY_JOIN_SECONDS)  # bounded: a grandchild may still hold a pipe
    oom = oom_report(oom_before, child.pid) if returncode == -signal.SIGKILL else ""
    if oom:
        out.line("oom", oom.encode())
    out.line("exit", str(returncode).encode())
    if holder is not None:
        holder.close()
    return returncode if returncode >= 0 else 128 - returncode


if __name__ == "__main__":
    # os._exit: the control thread may sit in a read of stdin, which blocks interpreter shutdown.
    os._exit(main(sys.argv[1:]))
