"""hpcdl submit / hpcdl jobs against a real Slurm 22.05 cluster started on this machine."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Optional

import pytest
from slurm_cluster import SlurmCluster, missing_requirements, pals_mpiexec

from hpcdl.schedulers import ArraySpec, Pbs, SignalSpec, SiteConfig, Slurm, Sweep

pytestmark = pytest.mark.skipif(missing_requirements() is not None, reason=str(missing_requirements()))


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmCluster]:
    with tempfile.TemporaryDirectory(prefix="hpcdl-slurm-") as base:
        running = SlurmCluster(Path(base), nodes=2, gpus_per_node=2)
        try:
            yield running.start()
        finally:
            running.stop()


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return tmp_path


def hpcdl(cluster: SlurmCluster, workdir: Path, *args: str) -> tuple[int, str, str]:
    """``hpcdl ARGS`` on the cluster's login host."""
    done = cluster.run(
        [sys.executable, "-m", "hpcdl", *args], cwd=workdir, env={"XDG_STATE_HOME": str(workdir / "state")}
    )
    return done.returncode, done.stdout, done.stderr


def submit(cluster: SlurmCluster, workdir: Path, *args: str) -> str:
    code, out, err = hpcdl(cluster, workdir, "submit", "--scheduler", "slurm", *args)
    assert code == 0, err
    job_id = out.strip()
    assert re.fullmatch(r"\d+", job_id), out
    return job_id


SITE = SiteConfig()
VARIANTS = {
    "one rank on one node": dict(),
    "two nodes, two ranks each": dict(nodes=2, ranks_per_node=2),
    "gpus by gres, one rank per gpu": dict(nodes=2, gpus_per_node=2),
    "two ranks sharing one gpu": dict(gpus_per_node=1, ranks_per_node=2),
    "one rank with two gpus": dict(gpus_per_node=2, ranks_per_node=1, cpus_per_rank=2),
    "array range": dict(array=ArraySpec.parse("0-3")),
    "array step and limit": dict(array=ArraySpec.parse("0-6:2%2")),
    "array list": dict(array=ArraySpec.parse("1,3,5")),
    "sweep": dict(sweep=Sweep.parse(["LR=0.1,0.01", "BS=32,64"])),
    "signal and requeue": dict(signal=SignalSpec.parse("USR2@90"), requeue=True, walltime="10m"),
    "signal only": dict(signal=SignalSpec.parse("TERM@30"), walltime="2h"),
    "constraint, partition, qos, account": dict(
        constraint="fast", partition="debug", qos="normal", account="proj"
    ),
    "day-long walltime": dict(walltime="1-00:00:00"),
    "custom output and error": dict(output="logs-{name}.{job_id}.out", error="err-{job_id}.txt"),
    "env, modules, setup": dict(env={"NCCL_DEBUG": "INFO"}, modules=["gcc"], setup=["echo ready"]),
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_sbatch_test_only_accepts_every_variant(cluster: SlurmCluster, tmp_path: Path, variant: str) -> None:
    job = SITE.make_job(["python3", "-c", "print(1)"], **VARIANTS[variant])
    script = tmp_path / "job.sh"
    script.write_text(Slurm().render(job, SITE))
    done = cluster.run(["sbatch", "--test-only", str(script)], cwd=tmp_path)
    assert done.returncode == 0 and "to start at" in done.stderr, done.stderr


def test_sbatch_test_only_accepts_site_directives_and_launcher_arguments(
    cluster: SlurmCluster, tmp_path: Path
) -> None:
    site = SiteConfig.from_mapping(
        {
            "extra_directives": ["--exclusive", "--mail-type=END"],
            "launcher_args": ["--cpu-bind=cores"],
            "gpus_per_node": 2,
            "cpus_per_node": 2,
        },
        "test site",
    )
    job = site.make_job(["python3", "-c", "print(1)"], nodes=2)
    script = tmp_path / "job.sh"
    script.write_text(Slurm().render(job, site))
    assert "#SBATCH --exclusive" in script.read_text() and "--cpu-bind=cores" in script.read_text()
    done = cluster.run(["sbatch", "--test-only", str(script)], cwd=tmp_path)
    assert done.returncode == 0 and "to start at" in done.stderr, done.stderr


@pytest.mark.parametrize(
    ("request_", "refusal"),
    [
        (dict(nodes=3), "node configuration is not available"),
        (dict(gpus_per_node=3), "node configuration is not available"),
        (dict(constraint="slow"), "Invalid feature specification"),
    ],
)
def test_sbatch_test_only_refuses_what_the_cluster_lacks(
    cluster: SlurmCluster, tmp_path: Path, request_: dict, refusal: str
) -> None:
    script = tmp_path / "job.sh"
    script.write_text(Slurm().render(SITE.make_job(["true"], **request_), SITE))
    done = cluster.run(["sbatch", "--test-only", str(script)], cwd=tmp_path)
    assert done.returncode != 0 and refusal in done.stderr, done.stderr


def test_ranks_get_their_gpu_threads_rendezvous_and_torch_variables(
    cluster: SlurmCluster, workdir: Path
) -> None:
    probe = (
        'echo "rank=$SLURM_PROCID cvd=$CUDA_VISIBLE_DEVICES omp=$OMP_NUM_THREADS '
        "secret=$HPCDL_SECRET at=$HPCDL_RENDEZVOUS_ADDR:$HPCDL_RENDEZVOUS_PORT "
        "serve=${HPCDL_RENDEZVOUS_SERVE:-unset} "
        'master=$MASTER_ADDR:$MASTER_PORT torch=$RANK/$WORLD_SIZE/$LOCAL_RANK/$LOCAL_WORLD_SIZE"'
    )
    job_id = submit(cluster, workdir, "--gpus", "2", "--cpus-per-rank", "1", "-t", "5", "bash", "-c", probe)
    assert cluster.wait_done(job_id) == "COMPLETED"
    lines = sorted((workdir / f"hpcdl-{job_id}.out").read_text().split("\n"))[1:]
    assert len(lines) == 2, lines
    fields = [dict(item.split("=", 1) for item in line.split()) for line in lines]
    assert [f["rank"] for f in fields] == ["0", "1"]
    assert [f["cvd"] for f in fields] == ["0", "1"]  # Slurm gave the job gpus 0,1; each rank keeps its own
    assert {f["omp"] for f in fields} == {"1"}
    assert len({f["secret"] for f in fields}) == 1 and re.fullmatch(r"[0-9a-f]{64}", fields[0]["secret"])
    host, port = fields[0]["at"].split(":")
    assert host and 1024 <= int(port) < 65536
    assert {f["serve"] for f in fields} == {"unset"}  # the script serves the rendezvous, not rank 0
    master_host, master_port = fields[0]["master"].split(":")
    assert {f["master"] for f in fields} == {fields[0]["master"]}
    assert master_host == host and master_port != port  # rank 0's host; not the rendezvous port
    assert [f["torch"] for f in fields] == ["0/2/0/2", "1/2/1/2"]

    code, out, err = hpcdl(cluster, workdir, "jobs", "logs", job_id)
    assert code == 0, err
    assert "rank=0 cvd=0" in out and "rank=1 cvd=1" in out


def _runtime_unavailable() -> Optional[str]:
    """Why the compiled runtime cannot run here (the ranks load the same library), or None."""
    try:
        from hpcdl.common import library

        library.load()
    except Exception as exc:  # an out-of-date or missing build: report it as the skip reason
        return f"hpcdl's compiled runtime does not load here ({exc}); reinstall with pip install -e ."
    return None


@pytest.mark.parametrize(
    "layout", [["--ranks-per-node", "2"], ["--nodes", "2"]], ids=["one-node", "two-nodes"]
)
def test_two_rank_allreduce_through_srun(cluster: SlurmCluster, workdir: Path, layout: list[str]) -> None:
    reason = _runtime_unavailable()
    if reason:
        pytest.skip(reason)
    rank_code = (
        "import numpy as np, hpcdl.common as c; c.init(); "
        "y = c.allreduce(np.array([c.rank() + 1.0])); "
        "print(f'rank {c.rank()} of {c.size()} sum {float(y[0])}', flush=True); c.shutdown()"
    )
    job_id = submit(cluster, workdir, *layout, "-t", "5", "python3", "-c", rank_code)
    state = cluster.wait_done(job_id, timeout=120)
    output = (workdir / f"hpcdl-{job_id}.out").read_text()
    assert state == "COMPLETED", output
    assert sorted(re.findall(r"rank \d of 2 sum 3\.0", output)) == [
        "rank 0 of 2 sum 3.0",
        "rank 1 of 2 sum 3.0",
    ]


PARALLEL = Path(__file__).parents[1] / "parallel"


def _results(output: str) -> list[dict]:
    found = [json.loads(line.partition("RESULT ")[2]) for line in output.splitlines() if "RESULT " in line]
    return sorted(found, key=lambda r: r["rank"])


def test_ddp_script_runs_unchanged_through_a_generated_script(cluster: SlurmCluster, workdir: Path) -> None:
    reason = _runtime_unavailable()
    if reason:
        pytest.skip(reason)
    job_id = submit(cluster, workdir, "--nodes", "2", "-t", "5", "python3", str(PARALLEL / "ddp_train.py"))
    state = cluster.wait_done(job_id, timeout=120)
    output = (workdir / f"hpcdl-{job_id}.out").read_text()
    assert state == "COMPLETED", output
    found = _results(output)
    assert [(r["rank"], r["local_rank"], r["world"], r["local_world"]) for r in found] == [
        (0, 0, 2, 1),
        (1, 0, 2, 1),
    ]
    assert all(r["weights_agree"] and r["weights_moved"] for r in found)  # DDP averaged the gradients
    assert {r["hpcdl_sum"] for r in found} == {3.0}


# Stands in front of srun in the job: takes the ports the script announced for the rendezvous and for
# torch.distributed (as any program on the node might, between choosing and binding), keeps them for the
# whole job, and runs the real srun.
PORT_GRABBER = """#!PYTHON
import os, socket, sys
here = os.path.dirname(os.path.abspath(__file__))
held, refused = [], []
for name in ("HPCDL_RENDEZVOUS_PORT", "MASTER_PORT"):
    value = os.environ.get(name, "")
    if not value.isdigit():
        continue
    grab = socket.socket()
    try:
        grab.bind(("0.0.0.0", int(value)))
        grab.listen()
        grab.set_inheritable(True)
        held.append((name, grab))
    except OSError:
        grab.close()
        refused.append(name)
print(f"port grabber: took {[n for n, _ in held]}, could not take {refused}", file=sys.stderr, flush=True)
os.environ["PATH"] = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if p != here)
os.execvp("srun", ["srun", *sys.argv[1:]])
"""


def test_the_job_starts_although_a_program_grabs_the_announced_ports(
    cluster: SlurmCluster, workdir: Path
) -> None:
    """#30: a script used to pick a free port, and rank 0 bound it later; a program that took it in between
    made the job fail. Now the script's own server holds it before announcing it."""
    reason = _runtime_unavailable()
    if reason:
        pytest.skip(reason)
    grabber = workdir / "grabber"
    grabber.mkdir()
    (grabber / "srun").write_text(PORT_GRABBER.replace("#!PYTHON", "#!" + sys.executable, 1))
    (grabber / "srun").chmod(0o755)
    job_id = submit(
        cluster, workdir, "--nodes", "2", "-t", "5", "--setup", f"export PATH={grabber}:$PATH",
        "python3", str(PARALLEL / "ddp_train.py"),
    )  # fmt: skip
    state = cluster.wait_done(job_id, timeout=120)
    output = (workdir / f"hpcdl-{job_id}.out").read_text()
    assert "port grabber: took [], could not take ['HPCDL_RENDEZVOUS_PORT', 'MASTER_PORT']" in output, output
    assert state == "COMPLETED", output
    assert [r["hpcdl_sum"] for r in _results(output)] == [3.0, 3.0]
    assert all(r["weights_agree"] for r in _results(output))


def _rendezvous_servers_of(job_id: str) -> list[int]:
    """Processes of job `job_id` that run the script's rendezvous server."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"hpcdl.runner.batch_rendezvous" in cmdline and f"SLURM_JOB_ID={job_id}".encode() in environ:
            found.append(int(proc.name))
    return found


def _rendezvous_servers_gone(job_id: str, timeout: float = 10.0) -> bool:
    """Whether the job's rendezvous servers end within `timeout` s (they stop within half a second)."""
    deadline = time.monotonic() + timeout
    while _rendezvous_servers_of(job_id) and time.monotonic() < deadline:
        time.sleep(0.1)
    return _rendezvous_servers_of(job_id) == []


def test_the_rendezvous_server_lives_as_long_as_the_job(cluster: SlurmCluster, workdir: Path) -> None:
    marker = workdir / "running"
    job_id = submit(
        cluster,
        workdir,
        "-t",
        "5",
        "bash",
        "-c",
        f"touch {marker}; while [ -e {marker} ]; do sleep 0.1; done",
    )
    deadline = time.monotonic() + 60
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marker.exists(), "the job did not start"
    assert len(_rendezvous_servers_of(job_id)) == 1  # serving while the ranks run
    marker.unlink()
    assert cluster.wait_done(job_id) == "COMPLETED"
    assert _rendezvous_servers_gone(job_id)  # and gone with the job


# A job's program: an hpcdl allreduce over the job's ranks, run as a *.py command.
ALLREDUCE_PY = """import numpy as np, sys, hpcdl.common as c
c.init()
y = c.allreduce(np.array([c.rank() + 1.0]))
print(f"rank {c.rank()} of {c.size()} sum {float(y[0])} python {sys.executable}", flush=True)
c.shutdown()
"""


def test_a_venvs_hpcdl_called_by_its_path_submits_a_job_that_finds_its_python(
    cluster: SlurmCluster, workdir: Path
) -> None:
    """hpcdl installed in a virtual environment that is not activated: its ``hpcdl`` called by its path,
    with neither the environment nor hpcdl's interpreter on PATH (as scripts, cron and workflow tools call
    it). The job's helpers and its *.py command run with that environment's Python on the nodes."""
    reason = _runtime_unavailable()
    if reason:
        pytest.skip(reason)
    venv_hpcdl = Path(sys.executable).parent / "hpcdl"
    bare_path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    system = subprocess.run(
        ["python3", "-c", "import hpcdl"], env={"PATH": bare_path}, capture_output=True, cwd=workdir
    )
    assert system.returncode != 0, "the system Python has hpcdl: this test needs one without it"
    (workdir / "job.py").write_text(ALLREDUCE_PY)
    env = {"XDG_STATE_HOME": str(workdir / "state"), "PATH": bare_path}
    done = cluster.run(
        [str(venv_hpcdl), "submit", "-s", "slurm", "--nodes", "2", "-t", "5", "job.py"], cwd=workdir, env=env
    )
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()
    state = cluster.wait_done(job_id, timeout=120)
    output = (workdir / f"hpcdl-{job_id}.out").read_text()
    assert state == "COMPLETED", output
    assert sorted(re.findall(r"rank \d of 2 sum 3\.0 python \S+", output)) == [
        f"rank 0 of 2 sum 3.0 python {sys.executable}",
        f"rank 1 of 2 sum 3.0 python {sys.executable}",
    ]


def _run_seconds(cluster: SlurmCluster, job_id: str) -> int:
    hours, minutes, seconds = cluster.job_field(job_id, "RunTime").split("-")[-1].split(":")
    return int(hours) * 3600 + int(minutes) * 60 + int(seconds)


def test_a_job_whose_python_lacks_hpcdl_stops_at_once_saying_what_to_do(
    cluster: SlurmCluster, workdir: Path
) -> None:
    """The job's Python lacks hpcdl (the commonest way to get it wrong): the job stops in its first
    second, before its rendezvous and its ranks, with the interpreter's error and what to change."""
    bare = workdir / "bare-venv"  # a virtual environment of the base Python, without site packages
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    probe = subprocess.run(
        [str(bare / "bin" / "python"), "-c", "import hpcdl"], capture_output=True, cwd=workdir
    )
    if probe.returncode == 0:
        pytest.skip("the base Python has hpcdl installed; this test needs a Python without it")
    python = str(bare / "bin" / "python")
    job_id = submit(cluster, workdir, "--python", python, "-t", "5", "echo", "the ranks ran")
    assert cluster.wait_done(job_id) == "FAILED"
    output = (workdir / f"hpcdl-{job_id}.out").read_text()
    assert "No module named 'hpcdl'" in output
    assert f"hpcdl: the Python of this job, {python}, cannot import hpcdl on node1 (its error" in output
    assert "hpcdl submit --python PATH, python: in a site file, or a --module/--setup" in output
    assert "rendezvous" not in output and "the ranks ran" not in output
    assert _run_seconds(cluster, job_id) <= 2


def test_sweep_runs_one_array_task_per_point(cluster: SlurmCluster, workdir: Path) -> None:
    job_id = submit(cluster, workdir, "--sweep", "LR=0.1,0.01", "-t", "5", "bash", "-c", 'echo "lr=$LR"')
    for task in (0, 1):
        cluster.wait_done(f"{job_id}_{task}")
    outputs = {task: (workdir / f"hpcdl-{job_id}_{task}.out").read_text().strip() for task in (0, 1)}
    assert outputs == {0: "lr=0.1", 1: "lr=0.01"}
    code, out, err = hpcdl(cluster, workdir, "jobs", "status", job_id)
    assert code == 0, err
    assert sorted(line.split()[:2] for line in out.splitlines()) == [
        [f"{job_id}_0", "COMPLETED"],
        [f"{job_id}_1", "COMPLETED"],
    ]


def test_status_and_cancel_of_a_running_job(cluster: SlurmCluster, workdir: Path) -> None:
    job_id = submit(cluster, workdir, "-J", "sleeper", "-t", "5", "sleep", "300")
    cluster.wait_state(job_id, {"RUNNING"})
    code, out, err = hpcdl(cluster, workdir, "jobs", "status", job_id)
    assert code == 0 and out.split() == [job_id, "RUNNING", "RUNNING"], err

    code, out, err = hpcdl(cluster, workdir, "jobs", "cancel", job_id)
    assert code == 0, err
    assert cluster.wait_done(job_id) == "CANCELLED"
    code, out, _ = hpcdl(cluster, workdir, "jobs", "status", job_id)
    assert out.split() == [job_id, "CANCELLED", "CANCELLED"]


def test_status_of_an_unknown_job_says_so(cluster: SlurmCluster, workdir: Path) -> None:
    code, _, err = hpcdl(cluster, workdir, "jobs", "status", "999999", "--scheduler", "slurm")
    assert code == 2 and "Slurm does not know job 999999" in err


@pytest.mark.slow  # Slurm's commands try the stopped controller for seconds; slurmctld then restarts
def test_a_stopped_controller_is_reported_never_taken_for_an_ended_job(
    cluster: SlurmCluster, workdir: Path
) -> None:
    """During an outage of slurmctld, ``jobs status`` and ``jobs watch`` quote Slurm's own error and say
    the job may still run; neither turns "cannot ask" into "ended"."""
    started = workdir / "started"
    job_id = submit(cluster, workdir, "-J", "outage", "-t", "5", "bash", "-c", f"touch {started}; sleep 300")
    deadline = time.monotonic() + 60
    while not started.exists() and time.monotonic() < deadline:  # its step runs: the outage cannot stop it
        time.sleep(0.1)
    try:
        with cluster.controller_stopped():
            code, out, err = hpcdl(cluster, workdir, "jobs", "status", job_id)
            assert code == 2 and out == "", err
            assert f"could not ask Slurm about {job_id}: squeue" in err
            assert "Unable to contact slurm controller" in err  # squeue's own words
            assert f"job {job_id} may still be queued or running: ask again once Slurm's controller" in err
            assert "does not know" not in err and "MinJobAge" not in err
            watching = ("--no-progress", "--interval", "1", "--timeout", "2")
            code, out, err = hpcdl(cluster, workdir, "jobs", "watch", job_id, *watching)
            assert code == 2 and f" {job_id} NO ANSWER (could not ask Slurm about {job_id}" in out, err
            assert "had not finished after 2 s" in err and "ended" not in err
        code, out, err = hpcdl(cluster, workdir, "jobs", "status", job_id)
        assert code == 0 and out.split() == [job_id, "RUNNING", "RUNNING"], err  # it ran on all along
    finally:
        hpcdl(cluster, workdir, "jobs", "cancel", job_id)


# Submits a scaling study's jobs as hpcdl scaling run --submit does, and deactivates the partition once the
# first job is in, so that Slurm refuses the second: a group refused part-way.
GROUP_DRIVER = """import subprocess, sys
from pathlib import Path
from hpcdl.scaling import cluster, study
from hpcdl.schedulers import SchedulerError

directory = Path(sys.argv[1])
spec = study.StudySpec(mode="strong", workers=[1, 2], workload=study.Workload(command=("true",)),
                       global_batch=4, repeats=1, launch="batch").fill_defaults(2).validate()
plan = cluster.plan_jobs(spec, directory, cluster.BatchOptions(scheduler="slurm", walltime="5"))
study.create(directory, spec, False)

def close_partition(job):
    print("SUBMITTED", job.job_id, flush=True)
    subprocess.run(["scontrol", "update", "PartitionName=debug", "State=INACTIVE"], check=True)

try:
    cluster.submit_study(plan, directory, on_submitted=close_partition)
except SchedulerError as exc:
    print("REFUSED", exc, flush=True)
"""


def test_a_group_refused_part_way_cancels_what_it_submitted(cluster: SlurmCluster, workdir: Path) -> None:
    driver = workdir / "driver.py"
    driver.write_text(GROUP_DRIVER)
    try:
        done = cluster.run([sys.executable, str(driver), str(workdir / "study")], cwd=workdir, timeout=120)
    finally:
        cluster.run(["scontrol", "update", "PartitionName=debug", "State=UP"])
    assert done.returncode == 0, done.stderr
    first = re.search(r"^SUBMITTED (\d+)$", done.stdout, re.MULTILINE)
    assert first, done.stdout + done.stderr
    refusal = done.stdout.partition("REFUSED ")[2]
    assert refusal.startswith("job 2 of 2 was refused: could not submit the job to Slurm"), done.stdout
    assert f"cancelled the 1 job(s) submitted before it ({first.group(1)})" in refusal
    assert cluster.wait_done(first.group(1)) == "CANCELLED"
    assert json.loads((workdir / "study" / "jobs.json").read_text()) == []  # the study lists no job


def test_a_group_slurm_would_refuse_is_not_submitted_at_all(cluster: SlurmCluster, workdir: Path) -> None:
    """Every job of a study is checked by Slurm (sbatch --test-only) before the first is submitted: the
    8-node point of a 2-node cluster stops the study before its 1-node point is queued."""
    code, _, err = hpcdl(
        cluster, workdir, "scaling", "run", "--strong", "-W", "1,8", "--repeats", "1", "--submit",
        "--ranks-per-node", "1", "-t", "5", "-o", "refused", "--", "true",
    )  # fmt: skip
    assert code == 2
    assert "job 2 of 2" in err and "would be refused, so none was submitted" in err, err
    assert "node configuration is not available" in err  # Slurm's own reason
    queued = cluster.run(["squeue", "-h", "-o", "%j"]).stdout.split()
    assert not any(name.startswith("scaling-W") for name in queued), queued
    assert not (workdir / "refused" / "jobs.json").exists()


@pytest.mark.slow
def test_signal_before_walltime_reaches_ranks_and_requeues(cluster: SlurmCluster, workdir: Path) -> None:
    """Slurm itself signals the job 90 s before its 2-minute walltime (it checks about every 30 s): the
    ranks have at least 30 s to start (a loaded machine needs them) and 60 s to checkpoint and leave."""
    rank_code = (
        "import os, signal, sys, time\n"
        "rank = os.environ['SLURM_PROCID']\n"
        "def checkpoint(*_):\n"
        "    print(f'checkpointed rank {rank}', flush=True); sys.exit(0)\n"
        "signal.signal(signal.SIGUSR2, checkpoint)\n"
        "print(f'ready rank {rank}', flush=True)\n"
        "time.sleep(120)\n"
    )
    job_id = submit(
        cluster, workdir, "--ranks-per-node", "2", "-t", "2", "--signal", "USR2@90", "--requeue",
        "python3", "-c", rank_code,
    )  # fmt: skip
    output = workdir / f"hpcdl-{job_id}.out"
    _wait_for_text(output, ["ready rank 0", "ready rank 1"])
    _wait_for_text(output, ["checkpointed rank 0", "checkpointed rank 1", "requeueing the job"], timeout=120)
    assert "TIMEOUT" not in cluster.job_field(job_id, "JobState")
    state = cluster.wait_state(job_id, {"PENDING", "REQUEUED", "RUNNING"}, timeout=30)
    assert int(cluster.job_field(job_id, "Restarts") or 0) >= 1, state
    cluster.run(["scancel", job_id])
    cluster.wait_done(job_id)


def test_a_signal_during_set_up_keeps_the_ranks_from_starting(cluster: SlurmCluster, workdir: Path) -> None:
    """The signal can come while the script still sets up (modules, the rendezvous server): it is kept, and
    the ranks are not started so close to the walltime. Before, bash died of it at once, saying nothing."""
    job_id = submit(
        cluster, workdir, "-t", "5", "--signal", "USR2@60", "--setup", "kill -s USR2 $$",
        "echo", "the ranks ran",
    )  # fmt: skip
    assert cluster.wait_done(job_id) == "FAILED"
    output = (workdir / f"hpcdl-{job_id}.out").read_text()
    assert "hpcdl: SIGUSR2 came before the ranks started (the walltime is near); not starting them" in output
    assert "the ranks ran" not in output and "Traceback" not in output, output
    assert _rendezvous_servers_gone(job_id)  # stopped with the script


def test_pbs_script_runs_through_slurms_pbs_front_end(tmp_path: Path) -> None:
    qsub = Path("/usr/bin/qsub")
    if not qsub.exists() or "SchedMD" not in qsub.read_text(errors="replace")[:4000]:
        pytest.skip("Slurm's PBS wrappers are not installed (apt-get install slurm-wlm-torque)")
    shim = pals_mpiexec(tmp_path / "pals")
    with tempfile.TemporaryDirectory(prefix="hpcdl-slurm-pbs-") as base:
        cluster = SlurmCluster(Path(base), nodes=2, gpus_per_node=2, pbs_plugin=True).start()
        try:
            site = SiteConfig.from_mapping({"setup": [f"export PATH={shim}:$PATH"]}, "test site")
            probe = (
                'echo "rank=$PALS_RANKID local=$PALS_LOCAL_RANKID cvd=$CUDA_VISIBLE_DEVICES pbs=$PBS_JOBID"'
            )
            job = site.make_job(
                ["bash", "-c", probe], nodes=2, gpus_per_node=2, walltime="5m", job_name="pbsjob"
            )
            (tmp_path / "job.pbs").write_text(Pbs().render(job, site))
            done = cluster.run(["qsub", "job.pbs"], cwd=tmp_path)
            assert done.returncode == 0, done.stderr
            job_id = done.stdout.strip()
            assert cluster.wait_done(job_id) == "COMPLETED"
            assert cluster.job_field(job_id, "NumNodes") == "2"  # from "-l select=2:..."
            assert cluster.job_field(job_id, "JobName") == "pbsjob"
            assert cluster.job_field(job_id, "TimeLimit") == "00:05:00"
            output = "".join(p.read_text() for p in sorted(tmp_path.glob(f"*.o{job_id}")))
            lines = sorted(line for line in output.splitlines() if line.startswith("rank="))
            # two nodes x two GPUs: four ranks placed block-wise, each pinned to its node-local GPU
            assert lines == [f"rank={r} local={r % 2} cvd={r % 2} pbs={job_id}" for r in range(4)], output
        finally:
            cluster.stop()


def _wait_for_text(path: Path, needles: list[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        if all(n in text for n in needles):
            return
        time.sleep(0.2)
    raise AssertionError(f"{path} did not show {needles} within {timeout:.0f}s; it holds:\n{text}")


def test_ranks_of_a_generated_script_leave_their_last_words_in_the_jobs_debug_directory(
    cluster: SlurmCluster, workdir: Path
) -> None:
    """The script sets HPCDL_DEBUG_DIR (./hpcdl-debug/<job id>): rank 1's error is kept there, the other rank
    says its own failure came from rank 1's, and hpcdl debug analyze names rank 1 as the first failure."""
    reason = _runtime_unavailable()
    if reason:
        pytest.skip(reason)
    ranks = PARALLEL / "first_failure_ranks.py"
    job_id = submit(
        cluster, workdir, "--nodes", "2", "-t", "5", "-e", "CULPRIT=1", "python3", str(ranks), "raise"
    )
    state = cluster.wait_done(job_id, timeout=120)
    output = (workdir / f"hpcdl-{job_id}.out").read_text()
    assert state == "FAILED", output
    directory = workdir / "hpcdl-debug" / job_id
    assert json.loads((directory / "exit.rank1.json").read_text())["error"] == "ValueError: boom on rank 1"
    pointer = (
        "hpcdl: rank 0's error above is a consequence of rank 1's end, not its cause. Rank 1 failed first, "
        "on host node2: ValueError: boom on rank 1"
    )
    assert pointer in output
    code, out, err = hpcdl(cluster, workdir, "debug", "analyze", str(directory))
    assert code == 0, err
    assert "- rank 1 failed first, on host node2: ValueError: boom on rank 1" in out.splitlines()
