"""torch.distributed under ``hpcdl run``: an unchanged DDP (gloo) script meets through the MASTER_ADDR /
MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE hpcdl run gives every rank, beside hpcdl's
own rendezvous; what the user set is kept."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from runner_helpers import hpcdl_run, rank_lines

pytest.importorskip("torch")

DDP = str(Path(__file__).with_name("ddp_train.py"))


def results(stdout: str) -> list[dict]:
    found = [
        json.loads(line.partition("<stdout>:RESULT ")[2]) for line in stdout.splitlines() if "RESULT " in line
    ]
    return sorted(found, key=lambda r: r["rank"])


@pytest.mark.parametrize("num_proc", [2, 3])
def test_ddp_script_runs_unchanged(num_proc: int) -> None:
    done, _ = hpcdl_run("-np", str(num_proc), "python", DDP, timeout=180)
    assert done.returncode == 0, done.stderr
    found = results(done.stdout)
    assert [(r["rank"], r["hpcdl_rank"], r["local_rank"]) for r in found] == [
        (i, i, i) for i in range(num_proc)
    ]
    assert {(r["world"], r["local_world"]) for r in found} == {(num_proc, num_proc)}
    assert all(r["weights_agree"] and r["weights_moved"] for r in found)  # DDP averaged the gradients
    assert {r["hpcdl_sum"] for r in found} == {num_proc * (num_proc + 1) / 2}
    masters = {r["master"] for r in found}
    assert len(masters) == 1
    host, port = masters.pop().split(":")
    assert host == "127.0.0.1" and port != found[0]["rendezvous_port"]  # not the rendezvous port


SHOW = "echo $MASTER_ADDR $MASTER_PORT $WORLD_SIZE $RANK $LOCAL_RANK $LOCAL_WORLD_SIZE"


def test_what_the_user_set_is_kept_and_inherited_ranks_are_not() -> None:
    done, _ = hpcdl_run(
        "-np", "2", "-x", "MASTER_PORT=29555", "-x", "LOCAL_WORLD_SIZE=8", "--", "sh", "-c", SHOW,
        MASTER_ADDR="node-ib0", RANK="5", LOCAL_RANK="5",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    # MASTER_ADDR (inherited) and -x values stay; an inherited RANK cannot be right for every rank
    assert rank_lines(done.stdout, 0) == ["node-ib0 29555 2 0 0 8"]
    assert rank_lines(done.stdout, 1) == ["node-ib0 29555 2 1 1 8"]


IFNAMES = "echo $GLOO_SOCKET_IFNAME $NCCL_SOCKET_IFNAME"


@pytest.mark.parametrize("launch", [[], ["--mpi"]], ids=["agents", "mpirun"])
def test_ranks_get_the_interface_the_launcher_chose_unless_the_user_set_it(launch: list[str]) -> None:
    """torch.distributed's gloo and NCCL use the interface of the job's rendezvous (here: the loopback), not
    what the host's name resolves to; a GLOO_SOCKET_IFNAME or NCCL_SOCKET_IFNAME of the user's is kept."""
    if launch and shutil.which("mpirun") is None:
        pytest.skip("no mpirun on PATH")
    done, _ = hpcdl_run(*launch, "-np", "2", "--", "sh", "-c", IFNAMES)
    assert done.returncode == 0, done.stderr
    assert [rank_lines(done.stdout, r) for r in (0, 1)] == [["lo lo"], ["lo lo"]]
    done, _ = hpcdl_run(*launch, "-np", "2", "-x", "NCCL_SOCKET_IFNAME=ib0", "--", "sh", "-c", IFNAMES,
                        GLOO_SOCKET_IFNAME="eth7")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert [rank_lines(done.stdout, r) for r in (0, 1)] == [["eth7 ib0"], ["eth7 ib0"]]
