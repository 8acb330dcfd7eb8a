"""The mpirun / mpiexec lines ``hpcdl run --mpi`` builds (they are also run for real in
tests/integration/test_runner_mpi.py)."""

from __future__ import annotations

from pathlib import Path

from hpcdl.runner.hosts import HostSlots
from hpcdl.runner.mpi import MPICH, OPENMPI, build_mpi_command
from hpcdl.runner.procs import SshOptions

SECRET = "5e" * 32
HOSTS = [HostSlots("node1", 2), HostSlots("node2", 2)]
RANK_ENV = {"HPCDL_SECRET": SECRET, "HPCDL_RENDEZVOUS_PORT": "4000", "HPCDL_CYCLE_TIME": "2"}
ENVIRON = {"PATH": "/bin", "HOME": "/root", "HPCDL_RANK": "7", "NCCL_DEBUG": "INFO"}


def _build(flavor: str, **overrides: object):
    options = {
        "ssh": SshOptions(port=2222, identity_file=Path("/k/id")),
        "network_interface": None,
        "tcp": False,
        "extra_args": "",
        "is_root": True,
    }
    options.update(overrides)
    return build_mpi_command(flavor, "mpirun", HOSTS, 4, RANK_ENV, ENVIRON, ["python", "t.py"], **options)


def _after(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == flag]


def test_openmpi_line() -> None:
    command = _build(OPENMPI, network_interface="eth1", extra_args="--report-bindings")
    argv = command.argv
    assert argv[:3] == ["mpirun", "--allow-run-as-root", "--tag-output"]
    assert _after(argv, "-np") == ["4"] and _after(argv, "-H") == ["node1:2,node2:2"]
    assert "btl_tcp_if_include" in argv and "eth1" in argv
    assert _after(argv, "plm_rsh_args")[0].startswith("-o BatchMode=yes")
    assert "-p 2222 -i /k/id" in _after(argv, "plm_rsh_args")[0]
    exported = _after(argv, "-x")
    assert {"HPCDL_SECRET", "HPCDL_RENDEZVOUS_PORT", "HPCDL_CYCLE_TIME", "PATH", "NCCL_DEBUG"} <= set(
        exported
    )
    assert "HOME" not in exported and "HPCDL_RANK" not in exported  # MPI gives each rank its own
    assert argv[-3:] == ["--report-bindings", "python", "t.py"]
    assert SECRET not in " ".join(argv) and SECRET not in command.shown
    assert command.env["HPCDL_SECRET"] == SECRET and "HPCDL_RANK" not in command.env


def test_openmpi_tcp_and_non_root() -> None:
    argv = _build(OPENMPI, tcp=True, is_root=False).argv
    assert "--allow-run-as-root" not in argv
    assert argv[argv.index("btl") + 1] == "self,tcp"


def test_openmpi_transport_given_in_mpi_args_replaces_the_default() -> None:
    """mpirun refuses an MCA parameter listed twice ("MCA parameters can only be listed once")."""
    argv = _build(OPENMPI, extra_args="--mca btl self,vader,tcp -mca btl_tcp_sndbuf 4194304").argv
    assert _after(argv, "-mca").count("btl") + _after(argv, "--mca").count("btl") == 1
    assert argv[argv.index("btl") + 1] == "self,vader,tcp" and _after(argv, "-mca").count("pml") == 1


def test_mpich_line() -> None:
    command = _build(MPICH, network_interface="eth1")
    argv = command.argv
    assert argv[:2] == ["mpirun", "-l"]
    assert _after(argv, "-n") == ["4"] and _after(argv, "-hosts") == ["node1:2,node2:2"]
    assert _after(argv, "-iface") == ["eth1"]
    assert "--allow-run-as-root" not in argv and "--tag-output" not in argv
    names = _after(argv, "-genvlist")[0].split(",")
    assert {"HPCDL_SECRET", "HPCDL_CYCLE_TIME", "PATH"} <= set(names)
    assert "-p 2222 -i /k/id" in command.env["HYDRA_LAUNCHER_EXTRA_ARGS"]
    assert command.shown.startswith("HYDRA_LAUNCHER_EXTRA_ARGS=")
    assert SECRET not in command.shown
