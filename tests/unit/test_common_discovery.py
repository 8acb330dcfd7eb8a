"""Rank discovery from every launcher's variables, and where the ranks meet."""

from __future__ import annotations

import pytest

from hpcdl.common import discovery
from hpcdl.common.exceptions import HpcdlConfigError
from hpcdl.platforms import slurm as slurm_platform

LAUNCHERS = [
    ({"HPCDL_RANK": "3", "HPCDL_SIZE": "4"}, "hpcdl run"),
    ({"HOROVOD_RANK": "3", "HOROVOD_SIZE": "4"}, "horovodrun"),
    (
        {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1"},
        "OpenMPI mpirun",
    ),
    ({"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1"}, "MPICH/PMI mpiexec"),
    ({"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1"}, "Slurm srun"),
    ({"ALPS_APP_PE": "3", "PMI_SIZE": "4"}, "Cray aprun"),
    ({"PALS_RANKID": "3", "PMI_SIZE": "4", "PALS_LOCAL_RANKID": "1"}, "PALS"),
    ({"JSM_NAMESPACE_RANK": "3", "JSM_NAMESPACE_SIZE": "4"}, "LSF jsrun"),
    ({"FLUX_TASK_RANK": "3", "FLUX_JOB_SIZE": "4", "FLUX_TASK_LOCAL_ID": "1"}, "Flux"),
    ({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}, "torchrun"),
]


@pytest.mark.parametrize(("env", "launcher"), LAUNCHERS)
def test_each_launcher(env: dict, launcher: str) -> None:
    info = discovery.discover({**env, "HPCDL_HOSTNAME": "n1"})
    assert (info.rank, info.size, info.host, info.launcher) == (3, 4, "n1", launcher)


def test_hpcdl_variables_win_and_no_launcher_is_a_job_of_one() -> None:
    env = {"HPCDL_RANK": "1", "HPCDL_SIZE": "2", "OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8"}
    assert discovery.discover(env).rank == 1
    alone = discovery.discover({})
    assert (alone.rank, alone.size, alone.launcher) == (0, 1, "none")
    assert discovery.discover({"HOROVOD_HOSTNAME": "h"}).host == "h"


def test_inconsistent_launcher_variables() -> None:
    with pytest.raises(HpcdlConfigError, match="SLURM_NTASKS"):
        discovery.discover({"SLURM_PROCID": "0"})
    with pytest.raises(HpcdlConfigError, match="do not describe a rank"):
        discovery.discover({"HPCDL_RANK": "4", "HPCDL_SIZE": "4"})
    with pytest.raises(HpcdlConfigError, match="not an integer"):
        discovery.discover({"HPCDL_RANK": "x", "HPCDL_SIZE": "4"})


def info(launcher: str, rank: int = 1) -> discovery.RankInfo:
    return discovery.RankInfo(rank, 4, "h", launcher)


def test_meeting_places_in_order() -> None:
    env = {"HPCDL_RENDEZVOUS_ADDR": "10.0.0.1", "HPCDL_RENDEZVOUS_PORT": "5000", "HPCDL_SECRET": "ab",
           "MASTER_ADDR": "10.0.0.2", "MASTER_PORT": "6000"}  # fmt: skip
    meet = discovery.meeting(info("hpcdl run"), env)
    assert (meet.bootstrap, meet.addr, meet.ports, meet.serve, meet.secret) == (
        "tcp",
        "10.0.0.1",
        (5000,),
        False,
        "ab",
    )
    assert meet.job == ""  # one port given: no walk
    del env["HPCDL_RENDEZVOUS_ADDR"]
    meet = discovery.meeting(info("torchrun"), env)
    assert (meet.addr, meet.ports, meet.serve) == ("10.0.0.2", tuple(range(6001, 6017)), True)
    slurm = {"SLURM_JOB_NODELIST": "gpu[07-09,12],cpu1", "SLURM_JOB_ID": "123456", "HPCDL_SECRET": "ab"}
    meet = discovery.meeting(info("Slurm srun"), slurm)
    assert (meet.addr, meet.ports, meet.serve) == ("gpu07", slurm_platform.step_ports("123456", ""), True)
    assert discovery.meeting(info("OpenMPI mpirun"), {}, mpi_vendor="Open MPI").bootstrap == "mpi"
    assert discovery.meeting(info("MPICH/PMI mpiexec"), {}, mpi_vendor="MPICH").bootstrap == "mpi"


def test_walked_ports_are_the_same_on_every_rank_and_leave_master_port_to_torch() -> None:
    env = {"MASTER_ADDR": "node1", "MASTER_PORT": "29500", "HPCDL_SECRET": "ab", "SLURM_JOB_ID": "7"}
    first = discovery.meeting(info("torchrun", rank=0), env)
    last = discovery.meeting(info("torchrun", rank=3), env)
    assert first.ports == last.ports and first.job == last.job != ""
    assert 29500 not in first.ports and len(set(first.ports)) == discovery.WALK_LENGTH
    assert discovery.ports_after(65530) == (65531, 65532, 65533, 65534, 65535, *range(1024, 1035))
    other_job = discovery.meeting(info("torchrun"), {**env, "SLURM_JOB_ID": "8"})
    assert other_job.ports == first.ports and other_job.job != first.job


def test_slurm_ports_lie_below_the_ephemeral_range_and_differ_per_step() -> None:
    steps = [slurm_platform.step_ports("4242", str(step)) for step in range(3)]
    for ports in steps:
        assert len(set(ports)) == discovery.WALK_LENGTH and all(20000 <= p < 32768 for p in ports)
    assert len({ports[0] for ports in steps}) == 3


def test_slurm_rendezvous_is_on_the_first_node_of_the_step() -> None:
    env = {"SLURM_JOB_NODELIST": "node[1-4]", "SLURM_STEP_NODELIST": "node[3-4]", "SLURM_JOB_ID": "9",
           "SLURM_STEP_ID": "2", "HPCDL_SECRET": "ab"}  # fmt: skip
    meet = discovery.meeting(info("Slurm srun"), env)
    assert (meet.addr, meet.ports) == ("node3", slurm_platform.step_ports("9", "2"))


def test_no_meeting_place_says_how_to_launch() -> None:
    with pytest.raises(HpcdlConfigError, match="hpcdl run -np N") as err:
        discovery.meeting(info("MPICH/PMI mpiexec"), {}, mpi_vendor="Open MPI")
    assert "MASTER_ADDR" in str(err.value) and "can use Open MPI here" in str(err.value)


@pytest.mark.parametrize(
    ("launcher", "env"),
    [
        ("torchrun", {"MASTER_ADDR": "10.0.0.2", "MASTER_PORT": "6000"}),
        ("Slurm srun", {"SLURM_JOB_NODELIST": "node[1-2]", "SLURM_JOB_ID": "77"}),
        ("Slurm srun", {"HPCDL_RENDEZVOUS_ADDR": "node1", "HPCDL_RENDEZVOUS_PORT": "29555"}),
    ],
)
@pytest.mark.parametrize("secret", [None, ""])
def test_ranks_meeting_over_tcp_without_a_secret_refuse_and_say_how_to_make_one(
    launcher: str, env: dict, secret: str | None
) -> None:
    """A secret derived from the job id, the rendezvous address and the uid (what ranks used to share without
    HPCDL_SECRET) is known to every other user of the cluster too; an empty one is no secret either."""
    if secret is not None:
        env = {**env, "HPCDL_SECRET": secret}
    with pytest.raises(HpcdlConfigError, match="HPCDL_SECRET is not set") as err:
        discovery.meeting(info(launcher, rank=0), env)
    assert "secrets.token_hex(32)" in str(err.value) and "hpcdl run" in str(err.value)


def test_a_job_of_one_and_an_mpi_bootstrap_need_no_secret() -> None:
    assert discovery.meeting(discovery.RankInfo(0, 1, "h", "none"), {}).bootstrap == "tcp"
    meet = discovery.meeting(info("OpenMPI mpirun"), {}, mpi_vendor="Open MPI")
    assert (meet.bootstrap, meet.secret) == ("mpi", "")  # rank 0 makes one and sends it over MPI


def test_rendezvous_serve_makes_rank_zero_host_the_given_address() -> None:
    env = {"HPCDL_RENDEZVOUS_ADDR": "node1", "HPCDL_RENDEZVOUS_PORT": "29555", "HPCDL_SECRET": "ab" * 32}
    launched = discovery.meeting(info("Slurm srun"), env)
    assert (launched.addr, launched.ports, launched.serve) == ("node1", (29555,), False)
    served = discovery.meeting(info("Slurm srun"), {**env, "HPCDL_RENDEZVOUS_SERVE": "1"})
    assert (served.addr, served.ports, served.serve) == ("node1", (29555,), True)


def test_ranks_started_with_another_size_share_the_job_tag_and_get_told_at_the_rendezvous() -> None:
    env = {"MASTER_ADDR": "node1", "MASTER_PORT": "29500", "HPCDL_SECRET": "ab"}
    four = discovery.meeting(discovery.RankInfo(1, 4, "h", "torchrun"), env)
    eight = discovery.meeting(discovery.RankInfo(1, 8, "h", "torchrun"), env)
    assert four.job == eight.job and four.ports == eight.ports
