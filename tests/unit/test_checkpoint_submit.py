"""``hpcdl submit --checkpoint PATH``: every scheduler's script gets the warning signal and lead time of that
scheduler (unless ``--signal`` or the site's ``checkpoint_signal`` says otherwise), requeue where the
scheduler can requeue, and the environment ``hpcdl.checkpoint.run`` reads (path, signals, requeue
command, job id); what cannot work is refused. The scripts are checked as their schedulers would."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hpcdl.checkpoint import contract
from hpcdl.cli.main import app
from hpcdl.schedulers import ArraySpec, JobSpecError, SignalSpec, SiteConfig, SiteConfigError, get_scheduler
from hpcdl.schedulers import site as site_module

# scheduler -> (signal directive or timer, requeue command, job id variable)
EXPECTED = {
    "slurm": ("#SBATCH --signal=B:USR2@180", 'scontrol requeue "$SLURM_JOB_ID"', "SLURM_JOB_ID"),
    "pbs": ("{ sleep 3480; kill -s USR2 $$; } &", 'qrerun "$PBS_JOBID"', "PBS_JOBID"),
    "lsf": ("{ sleep 3480; kill -s USR2 $$; } &", 'brequeue "$LSB_JOBID"', "LSB_JOBID"),
    "flux": ("# flux: --signal=SIGUSR2@120s", "", "FLUX_JOB_ID"),
    "cobalt": ("{ sleep 3480; kill -s USR2 $$; } &", "", "COBALT_JOBID"),
}


def _exports(script: str) -> dict[str, str]:
    return dict(re.findall(r"^export (HPCDL_CHECKPOINT\w*|HPCDL_JOB_ID)=(.*)$", script, re.M))


@pytest.mark.parametrize("scheduler", sorted(EXPECTED))
def test_each_scheduler_gets_its_signal_requeue_and_the_training_its_environment(scheduler: str) -> None:
    site = SiteConfig()
    job = site.make_job(["train.py"], nodes=2, walltime="1h", checkpoint="/scratch/me/run 1")
    script = get_scheduler(scheduler).render(job, site)
    warning, requeue, job_id = EXPECTED[scheduler]
    assert warning in script
    assert _exports(script) == {
        contract.PATH_ENV: "'/scratch/me/run 1'",
        contract.SIGNALS_ENV: "USR2,TERM",
        contract.REQUEUE_ENV: f"'{requeue}'",
        contract.JOB_ID_ENV: f'"${{{job_id}}}"',
    }
    if requeue:  # the script requeues too when the signal reaches it before the ranks started
        assert f"  {requeue}\n" in script
    assert job.signal is None and not job.requeue  # the JobSpec itself is left as given


def test_signal_and_site_choices_win_over_the_schedulers_default() -> None:
    site = SiteConfig.from_mapping({"checkpoint_signal": "TERM@600"}, "site.yaml")
    job = site.make_job(["train.py"], walltime="2h", checkpoint="/ck")
    script = get_scheduler("slurm").render(job, site)
    assert "#SBATCH --signal=B:TERM@600" in script and _exports(script)[contract.SIGNALS_ENV] == "TERM,TERM"
    job = site.make_job(["train.py"], walltime="2h", checkpoint="/ck", signal=SignalSpec.parse("USR1@300"))
    assert "#SBATCH --signal=B:USR1@300" in get_scheduler("slurm").render(job, site)
    with pytest.raises(
        SiteConfigError, match=r"site\.yaml: checkpoint_signal: signal 'USR9@60': unknown signal"
    ):
        SiteConfig.from_mapping({"checkpoint_signal": "USR9@60"}, "site.yaml")


def test_what_cannot_work_is_refused() -> None:
    site = SiteConfig()
    with pytest.raises(JobSpecError, match="--checkpoint with --array or --sweep"):
        site.make_job(["train.py"], checkpoint="/ck", array=ArraySpec.parse("0-3"))
    short = site.make_job(["train.py"], walltime="2m", checkpoint="/ck")
    with pytest.raises(JobSpecError, match=r"signal 180s before the end is not inside the walltime \(120s\)"):
        get_scheduler("slurm").render(short, site)
    with pytest.raises(JobSpecError, match="checkpoint path"):
        site.make_job(["train.py"], checkpoint="/ck\nrm -rf ~")


def test_the_command_line_passes_an_absolute_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(site_module, "SYSTEM_SITE_FILE", tmp_path / "no-system-site.yaml")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("HPCDL_SITE", raising=False)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["submit", "-s", "slurm", "--dry-run", "--checkpoint", "ck", "train.py"])
    assert result.exit_code == 0, result.stderr
    assert _exports(result.stdout)[contract.PATH_ENV] == str(tmp_path / "ck")
    assert "#SBATCH --requeue" in result.stdout
