"""``hpcdl run`` inside a real Slurm allocation (``salloc`` on the test cluster's login host, and ``sbatch``):
the hosts and slots come from SLURM_JOB_NODELIST / SLURM_TASKS_PER_NODE and the ranks start as one ``srun``
job step (not over ssh), each under the step agent; elastic workers start as srun steps of their own. The
nodes are separate hosts (network namespaces with their own hostname and address, see ``slurm_cluster``)."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from slurm_cluster import SlurmCluster, missing_requirements

_MISSING = missing_requirements()
pytestmark = pytest.mark.skipif(_MISSING is not None, reason=f"no Slurm test cluster: {_MISSING}")

PARALLEL = Path(__file__).parents[1] / "parallel"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    made = SlurmCluster(tmp_path_factory.mktemp("slurm"), nodes=3, gpus_per_node=0)
    try:
        yield made.start()
    finally:
        made.stop()


def _salloc_hpcdl_run(salloc_args: str, run_args: str) -> list[str]:
    hpcdl_run = [sys.executable, "-m", "hpcdl", "run", *shlex.split(run_args)]
    return ["salloc", *shlex.split(salloc_args), *hpcdl_run]


def _in_allocation(
    cluster: SlurmCluster, salloc_args: str, run_args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``salloc SALLOC_ARGS hpcdl run RUN_ARGS`` on the cluster's login host."""
    return cluster.run(_salloc_hpcdl_run(salloc_args, run_args), env=env, timeout=180)


def _in_batch_job(cluster: SlurmCluster, tmp_path: Path, sbatch_args: str, run_args: str) -> tuple[str, str]:
    """sbatch a job whose script is ``hpcdl run RUN_ARGS``; its final state and output."""
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m hpcdl run {run_args}\n")
    output = tmp_path / "job.out"
    done = cluster.run(["sbatch", "--parsable", "-o", str(output), *shlex.split(sbatch_args), str(script)])
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip().split(";")[0]
    state = cluster.wait_done(job_id, timeout=120)
    return state, output.read_text()


_VARIABLES = ("RANK", "SIZE", "HOSTNAME", "LOCAL_RANK", "CROSS_RANK", "CROSS_SIZE")
SHOW = "sh -c 'echo " + " ".join(f"$HPCDL_{name}" for name in _VARIABLES) + "'"


def test_ranks_fill_the_allocation(cluster: SlurmCluster) -> None:
    done = _in_allocation(cluster, "-N3 --ntasks-per-node=2", f"--verbose -- {SHOW}")
    assert done.returncode == 0, done.stderr
    assert "hosts from the Slurm allocation (SLURM_JOB_NODELIST=node[1-3]); launcher srun" in done.stderr
    assert sorted(done.stdout.splitlines()) == [
        f"[{r}]<stdout>:{r} 6 node{r // 2 + 1} {r % 2} {r // 2} 3" for r in range(6)
    ]


def test_np_below_the_allocation_and_above_it(cluster: SlurmCluster) -> None:
    done = _in_allocation(cluster, "-N2 --ntasks-per-node=2", f"-np 3 -- {SHOW}")
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == [
        "[0]<stdout>:0 3 node1 0 0 2",
        "[1]<stdout>:1 3 node1 1 0 1",
        "[2]<stdout>:2 3 node2 0 1 2",
    ]
    done = _in_allocation(cluster, "-N2 --ntasks-per-node=1", "-np 3 true")
    assert done.returncode == 2
    assert "-np 3 asks for more ranks than the 2 slots of node1:1,node2:1" in done.stderr


# Each rank reports where it runs: its step, the parent of its agent, and (rank 0) the step as Slurm sees it.
WHERE = r"""
import json, os, subprocess
agent = os.getppid()
with open(f"/proc/{agent}/stat") as stat:
    launcher_pid = int(stat.read().rsplit(")", 1)[1].split()[1])
with open(f"/proc/{launcher_pid}/comm") as comm:
    parent_of_agent = comm.read().strip()
report = {k: os.environ.get(k) for k in ("HPCDL_RANK", "SLURM_PROCID", "SLURM_STEP_ID", "SLURMD_NODENAME",
                                         "SLURM_JOB_ID", "RANK", "MASTER_PORT")}
report["parent_of_agent"] = parent_of_agent
if report["HPCDL_RANK"] == "0":
    step = f"{os.environ['SLURM_JOB_ID']}.{os.environ['SLURM_STEP_ID']}"
    shown = subprocess.run(["scontrol", "-o", "show", "step", step], capture_output=True, text=True)
    report["step"] = shown.stdout
print("WHERE " + json.dumps(report), flush=True)
"""


def _reports(stdout: str) -> list[dict]:
    found = [json.loads(line.partition("WHERE ")[2]) for line in stdout.splitlines() if "WHERE " in line]
    return sorted(found, key=lambda r: int(r["HPCDL_RANK"]))


def _check_one_step(reports: list[dict], size: int) -> None:
    assert [r["HPCDL_RANK"] for r in reports] == [str(r) for r in range(size)]
    assert all(r["SLURM_PROCID"] == r["HPCDL_RANK"] == r["RANK"] for r in reports)  # placed exactly
    assert len({(r["SLURM_JOB_ID"], r["SLURM_STEP_ID"]) for r in reports}) == 1  # one step of the job
    assert {r["parent_of_agent"] for r in reports} == {"slurmstepd"}  # started by Slurm, not ssh
    assert [r["SLURMD_NODENAME"] for r in reports] == [f"node{1 + r // 2}" for r in range(size)]
    step = reports[0]["step"]
    assert f"Tasks={size} " in step and "Dist=arbitrary" in step and "NodeList=node[1-2]" in step, step


def test_ranks_run_as_one_srun_step_inside_salloc(cluster: SlurmCluster, tmp_path: Path) -> None:
    (tmp_path / "where.py").write_text(WHERE)
    done = _in_allocation(cluster, "-N2 --ntasks-per-node=2", f"python3 {tmp_path / 'where.py'}")
    assert done.returncode == 0, done.stderr
    _check_one_step(_reports(done.stdout), 4)


def test_ranks_run_as_one_srun_step_inside_sbatch(cluster: SlurmCluster, tmp_path: Path) -> None:
    (tmp_path / "where.py").write_text(WHERE)
    state, output = _in_batch_job(
        cluster, tmp_path, "-N2 --ntasks-per-node=2", f"python3 {tmp_path / 'where.py'}"
    )
    assert state == "COMPLETED", output
    _check_one_step(_reports(output), 4)


def test_ranks_get_their_environment_in_a_job_submitted_with_export_none(
    cluster: SlurmCluster, tmp_path: Path
) -> None:
    """sbatch --export=NONE leaves SLURM_EXPORT_ENV=NONE to the steps: srun must still pass the secret."""
    show = "sh -c 'echo $HPCDL_RANK ${#HPCDL_SECRET} ${HPCDL_RENDEZVOUS_PORT:+port}'"
    state, output = _in_batch_job(cluster, tmp_path, "-N2 --ntasks-per-node=1 --export=NONE", f"-- {show}")
    assert state == "COMPLETED", output
    assert sorted(line for line in output.splitlines() if line.startswith("[")) == [
        "[0]<stdout>:0 64 port",
        "[1]<stdout>:1 64 port",
    ]


def test_a_failing_rank_ends_the_batch_job_with_the_summary(cluster: SlurmCluster, tmp_path: Path) -> None:
    fail = "sh -c 'if [ $HPCDL_RANK = 3 ]; then echo rank 3 gives up >&2; exit 3; fi; sleep 60'"
    started = time.monotonic()
    state, output = _in_batch_job(cluster, tmp_path, "-N2 --ntasks-per-node=2", f"-- {fail}")
    assert state == "FAILED", output
    assert "hpcdl run: rank 3 on host node2 exited with code 3; stopped the other 3 rank(s)" in output
    assert "    rank 3 gives up" in output
    assert time.monotonic() - started < 45  # not the ranks' 60 s


def test_ctrl_c_reaches_every_rank_through_the_step(cluster: SlurmCluster, tmp_path: Path) -> None:
    started = tmp_path / "started"
    started.mkdir()
    program = tmp_path / "wait.py"
    program.write_text(
        "import os, time\n"
        f"open(os.path.join({str(started)!r}, os.environ['HPCDL_RANK']), 'w').close()\n"
        "try:\n    time.sleep(60)\n"
        "except KeyboardInterrupt:\n    print('rank', os.environ['HPCDL_RANK'], 'got SIGINT', flush=True)\n"
    )
    salloc = cluster.popen(
        _salloc_hpcdl_run("-N2 --ntasks-per-node=2", f"python3 {program}"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while len(list(started.iterdir())) < 4 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(list(started.iterdir())) == 4, "the ranks did not start"
        children = subprocess.run(["pgrep", "-P", str(salloc.pid)], capture_output=True, text=True).stdout
        os.kill(int(children.split()[0]), signal.SIGINT)  # salloc's child: hpcdl run
        stdout, stderr = salloc.communicate(timeout=60)
    finally:
        if salloc.poll() is None:
            salloc.kill()
            salloc.wait()
    assert sorted(re.findall(r"rank \d got SIGINT", stdout)) == [f"rank {r} got SIGINT" for r in range(4)], (
        stderr
    )
    assert "hpcdl run received SIGINT; stopped all ranks" in stderr


def test_ddp_script_across_nodes_inside_salloc(cluster: SlurmCluster) -> None:
    done = _in_allocation(cluster, "-N2 --ntasks-per-node=1", f"python3 {PARALLEL / 'ddp_train.py'}")
    assert done.returncode == 0, done.stderr
    found = sorted(
        (json.loads(line.partition("RESULT ")[2]) for line in done.stdout.splitlines() if "RESULT " in line),
        key=lambda r: r["rank"],
    )
    assert [(r["rank"], r["local_rank"], r["world"]) for r in found] == [(0, 0, 2), (1, 0, 2)]
    assert all(r["weights_agree"] and r["weights_moved"] for r in found)
    assert {r["hpcdl_sum"] for r in found} == {3.0}


def test_elastic_workers_start_and_are_replaced_as_srun_steps(cluster: SlurmCluster) -> None:
    """Worker 1 fails at epoch 2; after the blacklist cooldown a new worker takes its node, as a new step."""
    elastic = "--min-np 2 --max-np 3 --blacklist-cooldown-range 1 1"
    done = _in_allocation(
        cluster,
        "-N3 --ntasks-per-node=1",
        f"--verbose {elastic} python3 {PARALLEL / 'elastic_train.py'}",
        env={"FAIL_WORKER": "1", "EPOCHS": "30", "PAUSE": "0.2"},
    )
    assert done.returncode == 0, done.stderr
    assert "elastic workers start with launcher srun" in done.stderr
    started = r"hpcdl run: worker (\d): srun --nodes=1 --ntasks=1 --nodelist=(node\d) "
    starts = re.findall(started, done.stderr)
    assert starts[:3] == [("0", "node1"), ("1", "node2"), ("2", "node3")]
    assert ("3", "node2") in starts  # the replacement, on the node whose worker failed
    results = {}
    for line in done.stdout.splitlines():
        if "<stdout>:RESULT " in line:
            result = json.loads(line.partition("<stdout>:RESULT ")[2])
            results[result["worker"]] = result
    assert set(results) == {0, 2, 3}
    assert len({json.dumps(r["weight"]) for r in results.values()}) == 1


FIRST_FAILURE = PARALLEL / "first_failure_ranks.py"


def test_the_raising_rank_is_named_every_time_through_the_srun_step(
    cluster: SlurmCluster, tmp_path: Path
) -> None:
    """Four jobs of four ranks on two nodes, a different culprit each time, then one whose culprit exits
    only after the others failed (srun, which ends the step at the first non-zero exit, sees it last)."""
    for run in range(5):
        culprit = (run + 1) % 4
        env = {"CULPRIT": str(culprit), **({"SLOW_EXIT": "1.0"} if run == 4 else {})}
        salloc = _salloc_hpcdl_run("-N2 --ntasks-per-node=2", f"{sys.executable} {FIRST_FAILURE} raise")
        done = cluster.run(salloc, env=env, cwd=tmp_path, timeout=180)
        ours = [line for line in done.stderr.splitlines() if line.startswith("hpcdl run: ")]
        assert done.returncode == 1, done.stderr
        host = f"node{1 + culprit // 2}"
        head = (
            f"hpcdl run: rank {culprit} on host {host} failed first, with ValueError: boom on rank {culprit}"
        )
        assert ours[0].startswith(f"{head} ("), f"run {run}: {done.stderr}"
        assert ours[1] == f"hpcdl run: its error (rank {culprit} on host {host}):"
        assert all("HpcdlShutdownError" in line for line in ours[2:]), ours


def test_bare_srun_ranks_point_at_the_raising_rank(cluster: SlurmCluster, tmp_path: Path) -> None:
    """Under srun alone (no hpcdl run), srun names each task that exited non-zero; the ranks that failed
    because of the culprit say so and quote its error, read from its last words in the job's debug
    directory (a file system the nodes share)."""
    secret = "0123456789abcdef" * 4
    for run in range(3):
        culprit = (run + 1) % 3
        workdir = tmp_path / f"job{run}"
        workdir.mkdir()
        done = cluster.run(
            ["salloc", "-N2", "-n3", "srun", sys.executable, str(FIRST_FAILURE), "raise"],
            env={"CULPRIT": str(culprit), "HPCDL_SECRET": secret}, cwd=workdir, timeout=120,
        )  # fmt: skip
        output = done.stdout + done.stderr
        assert done.returncode != 0, output
        pointers = [line for line in output.splitlines() if line.startswith("hpcdl: rank ")]
        assert len(pointers) == 2, f"run {run}:\n{output}"
        # Which node holds two tasks is Slurm's choice (usually node1, not always while other jobs of the
        # shared cluster come and go): the culprit's host is the one its own record names.
        (job,) = (workdir / "hpcdl-debug").iterdir()
        host = json.loads((job / f"exit.rank{culprit}.json").read_text())["host"]
        assert host in ("node1", "node2"), host
        for line in pointers:
            assert (
                f"Rank {culprit} failed first, on host {host}: ValueError: boom on rank {culprit} (" in line
            )


def test_every_ranks_stack_through_the_srun_step(cluster: SlurmCluster, tmp_path: Path) -> None:
    """hpcdl debug stacks reaches the ranks through srun (whose stdin reaches every task's agent): rank 3,
    on node2, sleeps in the user's function while the others wait in a collective."""
    job = cluster.popen(
        _salloc_hpcdl_run("-N2 --ntasks-per-node=2", f"{sys.executable} {FIRST_FAILURE} stuck"),
        cwd=tmp_path, env={"CULPRIT": "3"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        # Until every rank is where it stays: a rank may still be in init() while rank 3 already sleeps.
        deadline, shown, parts = time.monotonic() + 90, "", []
        while not (len(parts) == 5 and "in stuck_in_dataloader" in parts[4] and
                   all("in synchronize" in part for part in parts[1:4])):  # fmt: skip
            assert time.monotonic() < deadline, f"no stacks showed where every rank is:\n{shown}"
            asked = cluster.run([sys.executable, "-m", "hpcdl", "debug", "stacks"], cwd=tmp_path, timeout=60)
            shown = asked.stdout + asked.stderr
            parts = shown.split("=== rank ")
    finally:
        job.terminate()
        job.communicate(timeout=60)
    assert [part.split(" ===")[0] for part in parts[1:]] == [
        f"{r} on host node{1 + r // 2}" for r in range(4)
    ]
