"""``hpcdl run --mpi``: the mpirun (Open MPI) or mpiexec (MPICH/Hydra, Intel MPI) line for a job, and how
its tagged output is read back into ranks (``hpcdl.runner.tagged`` runs it)."""

from __future__ import annotations

import re
import secrets
import shlex
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

from hpcdl.platforms.mpi import VERSION_TIMEOUT_SECONDS, version_output
from hpcdl.runner.errors import LaunchError
from hpcdl.runner.hosts import HostSlots
from hpcdl.runner.procs import SshOptions
from hpcdl.runner.rank_env import FORWARDED_NAMES, FORWARDED_PREFIXES
from hpcdl.runner.tagged import Tagged, TagReader

OPENMPI, MPICH = "Open MPI", "MPICH/Hydra"
# Per-rank identity comes from the MPI launcher; inherited values would be wrong.
_RANK_VARIABLES = tuple(
    prefix + name
    for prefix in ("HPCDL_", "HOROVOD_")
    for name in ("RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE", "HOSTNAME")
)
_OPENMPI_TAG = re.compile(rb"^\[\d+,(\d+)\]<(stdout|stderr)>:(.*)$", re.DOTALL)
_MPICH_TAG = re.compile(rb"^\[(\d+)\] (.*)$", re.DOTALL)


def detect_flavor(mpirun: str) -> str:
    """Open MPI or MPICH/Hydra, from ``mpirun --version``."""
    try:
        text = version_output(mpirun)
    except FileNotFoundError:
        raise LaunchError(
            f"--mpi: '{mpirun}' is not installed or not on PATH; load an MPI or pass --mpirun PATH"
        ) from None
    except subprocess.TimeoutExpired:
        raise LaunchError(
            f"--mpi: '{mpirun} --version' did not answer within {VERSION_TIMEOUT_SECONDS:g} s"
        ) from None
    if any(mark in text for mark in ("Open MPI", "OpenRTE", "Spectrum MPI")):
        return OPENMPI
    if any(mark in text for mark in ("HYDRA", "Intel(R) MPI", "MPICH")):
        return MPICH
    first = text.strip().splitlines()[0] if text.strip() else "(no output)"
    raise LaunchError(
        f"--mpi: cannot tell which MPI '{mpirun}' is from its --version output ('{first}'); "
        "hpcdl run supports Open MPI and MPICH/Hydra (incl. Intel MPI); pass --mpirun PATH to one of them"
    )


@dataclass(frozen=True)
class MpiCommand:
    argv: list[str]
    env: dict[str, str]  # the launcher's environment, plus what the ranks get by name (-x / -genvlist)
    shown: str  # what --verbose prints (no values of variables, so no secret)


def build_mpi_command(
    flavor: str,
    mpirun: str,
    hosts: list[HostSlots],
    num_proc: int,
    rank_env: dict[str, str],
    environ: Mapping[str, str],
    wrapped_command: list[str],
    *,
    ssh: SshOptions,
    network_interface: str | None,
    tcp: bool,
    extra_args: str,
    is_root: bool,
) -> MpiCommand:
    """The mpirun/mpiexec line running `wrapped_command` on `num_proc` ranks over `hosts`.

    Variables reach the ranks by name only (values travel in mpirun's own environment), so the job
    secret never appears on a command line.
    """
    env = {k: v for k, v in environ.items() if k not in _RANK_VARIABLES}
    env.update(rank_env)
    names = sorted(
        name
        for name in env
        if name in FORWARDED_NAMES or name.startswith(FORWARDED_PREFIXES) or name in rank_env
    )
    host_list = ",".join(f"{h.name}:{h.slots}" for h in hosts)
    ssh_args = shlex.join(ssh.options())
    shown_env = ""
    if flavor == OPENMPI:
        argv = [mpirun, *(["--allow-run-as-root"] if is_root else []), "--tag-output"]
        argv += ["-np", str(num_proc), "-H", host_list, "-bind-to", "none", "-map-by", "slot"]
        # Open MPI refuses a parameter given twice: the user's --mpi-args choice replaces hpcdl's default.
        given = _mca_names(extra_args)
        for name, value in (("pml", "ob1"), ("btl", "self,tcp" if tcp else "^openib")):
            if name not in given:
                argv += ["-mca", name, value]
        if network_interface:
            argv += ["-mca", "btl_tcp_if_include", network_interface]
            argv += ["-mca", "oob_tcp_if_include", network_interface]
        argv += ["-mca", "plm_rsh_args", ssh_args]
        for name in names:
            argv += ["-x", name]
    else:
        argv = [mpirun, "-l", "-n", str(num_proc), "-hosts", host_list, "-bind-to", "none"]
        if network_interface:  # Hydra takes one interface: the first of a list
            argv += ["-iface", network_interface.split(",")[0]]
        argv += ["-launcher", "ssh", "-genvlist", ",".join(names)]
        env["HYDRA_LAUNCHER_EXTRA_ARGS"] = ssh_args
        shown_env = f"HYDRA_LAUNCHER_EXTRA_ARGS={shlex.quote(ssh_args)} "
    argv += shlex.split(extra_args)
    argv += wrapped_command
    return MpiCommand(argv, env, shown_env + shlex.join(argv))


def _mca_names(args: str) -> set[str]:
    """The MCA parameters an Open MPI argument string sets (``-mca NAME VALUE`` or ``--mca NAME VALUE``)."""
    words = shlex.split(args)
    return {words[i + 1] for i, word in enumerate(words[:-1]) if word in ("-mca", "--mca")}


def mpi_reader(flavor: str, token: str) -> TagReader:
    """Lines of mpirun ``--tag-output`` (Open MPI) or ``-l`` (MPICH), whose rank wrapper
    (``hpcdl.runner.mpi_rank``) ends with ``TOKEN exit CODE``, after ``TOKEN oom TEXT`` for an OOM kill."""
    exit_head = token.encode() + b" exit "
    oom_head = token.encode() + b" oom "

    def read(stream: str, line: bytes) -> Tagged | None:
        if flavor == OPENMPI:
            match = _OPENMPI_TAG.match(line)
            if match is None:
                return None
            rank, stream, text = int(match.group(1)), match.group(2).decode(), match.group(3)
        else:
            match = _MPICH_TAG.match(line)
            if match is None:
                return None
            rank, text = int(match.group(1)), match.group(2)
        if text.startswith(exit_head):
            return Tagged(rank, exit_code=int(text[len(exit_head) :]))
        if text.startswith(oom_head):
            return Tagged(rank, oom=text[len(oom_head) :].decode(errors="replace").strip())
        return Tagged(rank, stream, text)

    return read


def new_token() -> str:
    return "hpcdl-rank-" + secrets.token_hex(8)
