"""The checker rejects what PBS, Cobalt, LSF, Flux (and Slurm) would reject, and accepts what they take."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcdl.schedulers import JobSpecError, SiteConfig, cobalt, flux, get_scheduler, lsf, pbs, slurm
from hpcdl.schedulers.job import ArraySpec, SignalSpec, Sweep

GOLDEN = Path(__file__).parent / "golden" / "batch"


def golden(name: str) -> str:
    return (GOLDEN / name).read_text()


def with_lines(script: str, *replacements: tuple[str, str]) -> str:
    for old, new in replacements:
        assert old in script, old
        script = script.replace(old, new, 1)
    return script


# ---- PBS ------------------------------------------------------------------------------------------------
PBS = golden("pbs-gpu-train.sh")


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (("#PBS -N train", "#PBS -N train\n#PBS -Z x"), "does not know the option '-Z'"),
        (("select=2:ncpus=32", "select=2:ncpus"), "'ncpus' is not RESOURCE=VALUE"),
        (("select=2:ncpus=32", "select=2:gpus=4:ncpus=32"), "unknown resource 'gpus'"),
        (("select=2:ncpus=32", "select=2:ncpus=lots"), "ncpus=lots must be a whole number"),
        (("select=2:ncpus=32", "select=0:ncpus=32"), "chunk count must be at least 1"),
        (("walltime=02:00:00", "walltime=2h"), "walltime=2h is not [[HH:]MM:]SS"),
        (("place=scatter", "place=spread"), "place=spread is not ARRANGEMENT"),
        (("#PBS -j oe", "#PBS -j both"), "-j both must be oe, eo or n"),
        (("#PBS -r n", "#PBS -r n\n#PBS -l nodes=2"), "cannot be combined with old-style nodes"),
        (("#PBS -r n", "#PBS -r n\n#PBS -J 5-1"), "-J 5-1 must be START-END"),
        (("mpiexec -n 8", "mpiexec -n 16"), "mpiexec -n 16 asks for more ranks than select provides (8"),
        (("--depth 8", "--depth 16"), "needs 64 CPUs; chunks have 32"),
        (("--cpu-bind depth", "--cpu-bind depth --bogus"), "mpiexec: unknown option '--bogus'"),
        (("|| exit 1\n", "|| exit 1\n#PBS -q late\n"), "directive after the first command is ignored"),
    ],
)
def test_pbs_checker_rejects(change: tuple[str, str], problem: str) -> None:
    problems = pbs.check_script(with_lines(PBS, change))
    assert any(problem in p for p in problems), problems


def test_pbs_site_defined_chunk_resources_are_accepted_when_declared() -> None:
    script = with_lines(PBS, ("ompthreads=8", "ompthreads=8:system=polaris"))
    assert any("unknown resource 'system'" in p for p in pbs.check_script(script))
    assert pbs.check_script(script, {"system"}) == []
    site = SiteConfig.from_mapping(
        {"pbs_chunk_resources": ["system=polaris"], "extra_directives": ["-l filesystems=home:eagle"]}, "site"
    )
    rendered = get_scheduler("pbs").parts(site.make_job(["x"], nodes=2), site)
    assert "-l select=2:ncpus=1:mpiprocs=1:ompthreads=1:system=polaris" in rendered.directives


def test_pbs_select_with_several_chunk_kinds() -> None:
    chunks, problems = pbs.parse_select("1:ncpus=64:ngpus=4+3:ncpus=32:mem=16gb", set())
    assert problems == [] and [c.count for c in chunks] == [1, 3] and chunks[1].resources["mem"] == "16gb"


# ---- Cobalt ------------------------------------------------------------------------------------------
COBALT = golden("cobalt-gpu-train.sh")


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (("aprun -n 8 -N 4", "aprun -n 12 -N 4"), "aprun -n 12 -N 4 needs 3 nodes; the job has 2"),
        (("aprun -n 8 -N 4", "aprun -n 4 -N 4"), "leaves nodes of the 2-node job idle"),
        (("-d 8 -cc depth", "-d 8"), "without -cc depth"),
        (("-cc depth -e", "-cc depth -Z 1 -e"), "aprun: unknown option '-Z'"),
        (("#COBALT -t 120", "#COBALT -t 2h"), "-t 2h must be minutes or HH:MM:SS"),
        (("#COBALT -n 2", "#COBALT -n two"), "-n two must be a positive node count"),
        (("#COBALT -q gpu", "#COBALT --walltime 30"), "does not know the option '--walltime'"),
        (("#COBALT -A proj", "#COBALT -A proj\n#COBALT --attrs mcdram"), "--attrs mcdram must be KEY=VALUE"),
    ],
)
def test_cobalt_checker_rejects(change: tuple[str, str], problem: str) -> None:
    problems = cobalt.check_script(with_lines(COBALT, change))
    assert any(problem in p for p in problems), problems


def test_cobalt_checker_knows_the_node_size() -> None:
    assert cobalt.check_script(COBALT, cpus_per_node=64) == []
    assert any("needs 32 CPUs; a node has 16" in p for p in cobalt.check_script(COBALT, cpus_per_node=16))


# ---- LSF -------------------------------------------------------------------------------------------
LSF = golden("lsf-gpu-train.sh")


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (("#BSUB -W 2:00", "#BSUB -W 2:75"), "-W 2:75 must be [HOURS:]MINUTES"),
        (("#BSUB -J train", "#BSUB -J train[0-3]"), "LSF array indices start at 1"),
        (("#BSUB -nnodes 2", "#BSUB -nnodes 1"), "jsrun -n 8 -r 4 needs 2 nodes; the job has 1"),
        (("#BSUB -J train", "#BSUB -J train\n#BSUB -foo"), "does not know the option '-foo'"),
        (("jsrun -n 8", "jsrun --frobnicate -n 8"), "jsrun: unknown option '--frobnicate'"),
        (("#BSUB -nnodes 2\n", ""), "no #BSUB -nnodes"),
    ],
)
def test_lsf_checker_rejects(change: tuple[str, str], problem: str) -> None:
    problems = lsf.check_script(with_lines(LSF, change))
    assert any(problem in p for p in problems), problems


def test_lsf_checker_knows_gpus_per_node() -> None:
    assert lsf.check_script(LSF, gpus_per_node=4) == []
    assert any("needs 4 GPUs per node; nodes have 2" in p for p in lsf.check_script(LSF, gpus_per_node=2))


# ---- Flux ------------------------------------------------------------------------------------------
FLUX = golden("flux-gpu-train.sh")


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (("# flux: -t 120m", "# flux: -t 2:00:00"), "-t 2:00:00 is not a Flux duration"),
        (("# flux: -N 2", "# flux: -N 1"), "flux run -N 2 asks for more nodes than the batch job has (1)"),
        (
            ("# flux: --exclusive", "# flux: --exclusive\n# flux: --cc=0-9:2"),
            "--cc=0-9:2 is not a Flux idset",
        ),
        (("# flux: --exclusive", "# flux: --gpus=4"), "does not know the option '--gpus=4'"),
        (("flux run -N 2 -n 8", "flux run -N 2 -n 1"), "fewer tasks than nodes"),
    ],
)
def test_flux_checker_rejects(change: tuple[str, str], problem: str) -> None:
    problems = flux.check_script(with_lines(FLUX, change))
    assert any(problem in p for p in problems), problems


# ---- Slurm (the integration tests also ask a real sbatch --test-only) ----------------------------------
SLURM = golden("slurm-gpu-train.sh")


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (("--time=02:00:00", "--time=2h"), "--time=2h is not a Slurm time"),
        (("--gpus-per-node=4", "--gpu=4"), "sbatch does not know the option '--gpu=4'"),
        (("--nodes=2", "--nodes=two"), "--nodes=two must be a whole number"),
    ],
)
def test_slurm_checker_rejects(change: tuple[str, str], problem: str) -> None:
    problems = slurm.check_script(with_lines(SLURM, change))
    assert any(problem in p for p in problems), problems


def test_a_script_without_interpreter_line_is_rejected() -> None:
    assert any("#! interpreter" in p for p in slurm.check_script(SLURM.replace("#!/bin/bash\n", "")))


# ---- what a scheduler cannot express is refused before rendering -------------------------------------
@pytest.mark.parametrize(
    ("scheduler", "settings", "message"),
    [
        ("cobalt", dict(array=ArraySpec.parse("0-3")), "cobalt has no job arrays"),
        ("cobalt", dict(signal=SignalSpec.parse("USR2@60"), requeue=True), "Cobalt cannot requeue"),
        ("flux", dict(signal=SignalSpec.parse("USR2@60"), requeue=True), "Flux cannot requeue"),
        ("flux", dict(array=ArraySpec.parse("0-6:2")), "without :STEP or %LIMIT"),
        ("lsf", dict(array=ArraySpec.parse("0-3")), "LSF array indices start at 1"),
        ("pbs", dict(array=ArraySpec.parse("1,3,5")), "must be a range"),
        ("pbs", dict(output="{name}-{job_id}.out"), "PBS cannot put the job id"),
        ("pbs", dict(qos="high"), "PBS has no QoS"),
        (
            "flux",
            dict(output="x-{array_index}.out", sweep=Sweep.parse(["A=1,2"])),
            "cannot hold {array_index}",
        ),
    ],
)
def test_requests_a_scheduler_cannot_express_are_refused(
    scheduler: str, settings: dict, message: str
) -> None:
    site = SiteConfig()
    job = site.make_job(["x"], walltime="10m", **settings)
    with pytest.raises(JobSpecError, match=message.replace("(", "\\(")):
        get_scheduler(scheduler).parts(job, site)
