"""``hpcdl submit`` (dry runs, script files, errors) and scheduler detection from PATH."""

from __future__ import annotations

import os
import shlex
import stat
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hpcdl.cli.main import app
from hpcdl.schedulers import SchedulerError, detect_scheduler
from hpcdl.schedulers import site as site_module


@pytest.fixture(autouse=True)
def no_site_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(site_module, "SYSTEM_SITE_FILE", tmp_path / "no-system-site.yaml")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("HPCDL_SITE", raising=False)


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_dry_run_prints_the_script_and_keeps_the_commands_own_options() -> None:
    code, out, err = invoke(
        "submit", "-s", "slurm", "--dry-run", "-N", "2", "-g", "4", "train.py", "--lr", "0.1", "-N", "9"
    )
    assert code == 0, err
    assert out.startswith("#!/bin/bash\n#SBATCH --job-name=hpcdl\n#SBATCH --nodes=2\n")
    assert "--gpus-per-node=4" in out
    assert out.rstrip().endswith(f"hpcdl-rank {shlex.quote(sys.executable)} train.py --lr 0.1 -N 9")


def test_the_script_runs_hpcdls_helpers_and_the_script_with_hpcdls_own_python(tmp_path: Path) -> None:
    """By default the interpreter hpcdl runs in (a venv's hpcdl called by its path, with no venv on PATH,
    still gets its venv on the nodes); --python and the site's python: choose another, and the script says
    which and why, and checks that it imports hpcdl before anything else."""
    python = shlex.quote(sys.executable)
    code, out, err = invoke("submit", "-s", "slurm", "--dry-run", "train.py")
    assert code == 0, err
    assert (
        f"# Python of hpcdl's helpers and of a *.py command: {python}\n# (the interpreter hpcdl runs in"
        in out
    )
    assert f"if ! hpcdl_python_error=$({python} -c 'import hpcdl' 2>&1); then" in out
    assert f"exec {python} -m hpcdl.runner.batch_rendezvous --size 1" in out
    assert "python3" not in out
    site = tmp_path / "site.yaml"
    site.write_text("python: /opt/site/bin/python3\n")
    code, out, _ = invoke("submit", "--site", str(site), "-s", "pbs", "--dry-run", "train.py")
    assert f"# (python: in {site})" in out and out.rstrip().endswith(
        "hpcdl-rank /opt/site/bin/python3 train.py"
    )
    code, out, _ = invoke(
        "submit", "--site", str(site), "-s", "lsf", "--python", "python3.12", "--dry-run", "x.py"
    )
    assert "# (chosen with --python)" in out and "/opt/site" not in out
    assert "jsrun -n 1 -r 1 -a 1 -c 1 python3.12 -m hpcdl.runner.batch_rendezvous --probe" in out


@pytest.mark.parametrize(
    ("command", "missing"),
    [
        (["nosuch.py", "--lr", "1"], "nosuch.py"),
        (["python3", "-u", "-W", "ignore", "nosuch.py"], "nosuch.py"),
        (["bash", "-o", "pipefail", "missing/run.sh"], "missing/run.sh"),
        (["./nosuch"], "./nosuch"),
    ],
)
def test_a_program_that_is_not_there_is_refused_before_submitting(command: list[str], missing: str) -> None:
    code, out, err = invoke("submit", "-s", "slurm", *command)
    assert code == 2 and out == ""
    assert f"{missing}: no such file in {Path.cwd()}, where the job would start" in err


def test_commands_that_name_no_file_of_ours_are_not_checked(tmp_path: Path) -> None:
    from hpcdl.schedulers.submission import missing_paths

    (tmp_path / "train.py").touch()
    for command in (["train.py"], ["python3", "-m", "pkg.train"], ["python", "-c", "pass"], ["hostname"],
                    ["bash", "-c", "x.sh"], ["python3", "train.py", "other.py"]):  # fmt: skip
        assert missing_paths(command, tmp_path) == [], command


def test_output_file_is_written_and_never_overwritten_without_force(tmp_path: Path) -> None:
    target = tmp_path / "job.sh"
    code, _, err = invoke("submit", "-s", "pbs", "--dry-run", "-o", str(target), "-t", "30", "x.py")
    assert code == 0 and "wrote" in err
    first = target.read_text()
    assert "#PBS -l walltime=00:30:00" in first and os.access(target, os.X_OK)

    code, _, err = invoke("submit", "-s", "pbs", "--dry-run", "-o", str(target), "-t", "45", "x.py")
    assert code == 2 and "already exists; pass --force" in err
    assert target.read_text() == first

    code, _, err = invoke(
        "submit", "-s", "pbs", "--dry-run", "-o", str(target), "--force", "-t", "45", "x.py"
    )
    assert code == 0 and "walltime=00:45:00" in target.read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-t", "5:00", "x.py"], "walltime '5:00' is not in a form"),
        (["--requeue", "x.py"], "--requeue needs --signal"),
        (["--env", "NOEQUALS", "x.py"], "must be NAME=VALUE"),
        (["--array", "3-1", "x.py"], "need START <= STOP"),
        (["-s", "sge", "x.py"], "unknown scheduler 'sge'"),
        (["-s", "cobalt", "--sweep", "A=1,2", "x.py"], "cobalt has no job arrays"),
    ],
)
def test_bad_requests_exit_2_with_a_message(args: list[str], message: str) -> None:
    code, out, err = invoke("submit", "--dry-run", *(["-s", "slurm"] if "-s" not in args else []), *args)
    assert code == 2 and message in err and out == ""


def test_site_file_given_on_the_command_line_sets_defaults_and_limits(tmp_path: Path) -> None:
    site = tmp_path / "site.yaml"
    site.write_text("scheduler: lsf\naccount: PROJ123\ngpus_per_node: 6\ncpus_per_node: 42\n")
    code, out, err = invoke("submit", "--site", str(site), "--dry-run", "-N", "2", "train.py")
    assert code == 0, err
    assert "#BSUB -P PROJ123" in out and "jsrun -n 12 -r 6 -a 1 -c 7 -g 1" in out
    code, _, err = invoke("submit", "--site", str(site), "--dry-run", "-g", "8", "train.py")
    assert code == 2 and "8 GPUs per node requested, but nodes here have 6" in err


# ---- detection ------------------------------------------------------------------------------------------
def _tool(directory: Path, name: str, output: str = "") -> None:
    path = directory / name
    path.write_text(f"#!/bin/sh\necho '{output}'\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.mark.parametrize(
    ("tools", "expected"),
    [
        ({"sbatch": "", "qsub": ""}, "slurm"),
        ({"bsub": ""}, "lsf"),
        ({"qsub": "pbs_version = 2022.1.1"}, "pbs"),
        ({"qsub": "", "cqstat": ""}, "cobalt"),
        ({"flux": ""}, "flux"),
    ],
)
def test_scheduler_detected_from_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tools: dict[str, str], expected: str
) -> None:
    for name, output in tools.items():
        _tool(tmp_path, name, output)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("FLUX_URI", raising=False)
    assert detect_scheduler() == expected


def test_flux_instance_wins_inside_another_schedulers_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _tool(tmp_path, "sbatch")
    _tool(tmp_path, "flux")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("FLUX_URI", "local:///tmp/flux")
    assert detect_scheduler() == "flux"


def test_no_scheduler_on_path_says_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _tool(tmp_path, "qsub", "something else")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SchedulerError, match="--scheduler slurm\\|pbs\\|cobalt\\|lsf\\|flux"):
        detect_scheduler()
    code, _, err = invoke("submit", "--dry-run", "x.py")
    assert code == 2 and "no batch scheduler found on PATH" in err


def test_the_readme_site_example_is_a_valid_site_file(tmp_path: Path) -> None:
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    example = readme.split("### Site configuration", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    site = tmp_path / "site.yaml"
    site.write_text(example)
    code, out, err = invoke("submit", "--site", str(site), "--dry-run", "-N", "2", "train.py")
    assert code == 0, err
    assert "#PBS -l select=2:ncpus=64:ngpus=4:mpiprocs=4:ompthreads=16:system=polaris" in out


def test_job_records_find_logs_after_the_scheduler_forgot_the_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hpcdl.schedulers.records import JobRecord, load_record

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    (tmp_path / "train.o77.3").write_text("task 3\n")
    (tmp_path / "train.o77.1").write_text("task 1\n")
    (tmp_path / "train.o78.1").write_text("another job\n")
    JobRecord("pbs", "77.pbs01", "train", str(tmp_path), "job.sh", ["train.o{job_number}.*"]).save()
    record = load_record("77.pbs01")
    assert record is not None and record.scheduler == "pbs"
    assert [p.name for p in record.log_files()] == ["train.o77.1", "train.o77.3"]
    assert load_record("78.pbs01") is None
