"""Values that try to run commands through a generated batch script: the lines of a real rendered script
run under bash with the real Lmod (a module name carrying ``$(...)``, env and sweep values carrying
``$(...)`` and quotes), and values carrying a line break (directives, paths, site ``extra_directives``, env
values), which are refused before a script exists. Scripts holding ``--env`` values are the owner's only
and are never written through a planted link."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from module_systems import lmod_missing, run_lmod

from hpcdl.schedulers import JobSpecError, SiteConfig, Sweep, get_scheduler
from hpcdl.schedulers.errors import SchedulerError, SiteConfigError
from hpcdl.schedulers.submission import write_script

SCHEDULERS = ["slurm", "pbs", "cobalt", "lsf", "flux"]


def _render(scheduler: str, site: SiteConfig | None = None, **values: object) -> str:
    site = site or SiteConfig()
    job = site.make_job(["train.py"], **values)
    return get_scheduler(scheduler).render(job, site)


def _lines_with(script: str, *starts: str) -> str:
    return "\n".join(line for line in script.splitlines() if line.startswith(starts))


@pytest.mark.skipif(bool(lmod_missing()), reason=lmod_missing() or "Lmod present")
@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_a_module_name_carrying_a_command_is_printed_not_run(scheduler: str, tmp_path: Path) -> None:
    """The failure message of 'module load' quoted the name inside double quotes, where $(...) ran."""
    marker = tmp_path / "ran"
    module = f"nosuchmodule$(touch {marker})"
    script = _render(scheduler, modules=[module])
    done = run_lmod(f"set +e\n{_lines_with(script, 'module load ')}\ntrue", {"MODULEPATH": str(tmp_path)})
    assert not marker.exists(), script
    assert f"hpcdl: module load {module} failed" in done.stderr, done.stderr


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_env_values_with_commands_and_quotes_stay_values(scheduler: str, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    value = f'$(touch {marker})\'"`touch {marker}`";touch {marker}'
    script = _render(scheduler, env={"TOKEN": value})
    done = run_lmod(f"{_lines_with(script, 'export TOKEN=')}\nprintf '%s' \"$TOKEN\"")
    assert done.returncode == 0 and done.stdout == value and not marker.exists(), done.stderr


def test_sweep_values_with_commands_stay_values(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    value = f"$(touch {marker})"
    job = SiteConfig().make_job(["train.py"], sweep=Sweep.parse([f"LR=1,{value}"]))
    script = get_scheduler("slurm").render(job, SiteConfig())
    block = script[script.index('case "$SLURM_ARRAY_TASK_ID"') : script.index("esac") + 4]
    done = run_lmod(f"{block}\nprintf '%s' \"$LR\"", {"SLURM_ARRAY_TASK_ID": "1"})
    assert done.stdout == value and not marker.exists(), block + done.stderr


@pytest.mark.parametrize(
    ("values", "says"),
    [
        ({"account": "proj\ntouch /tmp/owned"}, "--account"),
        ({"partition": "gpu\rtouch /tmp/owned"}, "--partition"),
        ({"output": "out.txt\ntouch /tmp/owned"}, "--output"),
        ({"qos": "normal --uid=0"}, "may not contain spaces"),
        ({"env": {"TOKEN": "a\nb"}}, "the value of TOKEN"),
        ({"modules": ["cuda\ntouch /tmp/owned"]}, "module"),
        ({"modules": ["--force"]}, "names do not start with '-'"),
        ({"launcher_args": ["--x\ntouch /tmp/owned"]}, "launcher argument"),
    ],
)
@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_a_value_with_a_line_break_never_reaches_a_script(scheduler: str, values: dict, says: str) -> None:
    with pytest.raises(JobSpecError, match=says) as err:
        _render(scheduler, **values)
    assert "control character" in str(err.value) or "'-'" in str(err.value)


def test_site_directives_with_a_line_break_are_refused() -> None:
    with pytest.raises(SiteConfigError, match=r"extra_directives entry .* control character"):
        SiteConfig.from_mapping({"extra_directives": ["--mail-type=END\ntouch /tmp/owned"]}, "site.yaml")
    with pytest.raises(SiteConfigError, match="pbs_chunk_resources entry"):
        SiteConfig.from_mapping({"pbs_chunk_resources": ["system=polaris ncpus=1"]}, "site.yaml")
    site = SiteConfig.from_mapping({"extra_directives": ["--mail-type=END"]}, "site.yaml")
    assert "#SBATCH --mail-type=END\n" in _render("slurm", site)


def test_a_script_holding_env_values_is_its_owners_only(tmp_path: Path) -> None:
    old_mask = os.umask(0o022)
    try:
        path = write_script(_render("slurm", env={"WANDB_API_KEY": "s3cr3t"}), tmp_path / "job.sh", False)
    finally:
        os.umask(old_mask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o700 and "s3cr3t" in path.read_text()


def test_a_link_planted_at_the_script_path_is_not_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("the user's file\n")
    planted = tmp_path / "job.sh"
    planted.symlink_to(victim)
    script = _render("slurm", env={"TOKEN": "x"})
    with pytest.raises(SchedulerError, match="already exists; pass --force"):
        write_script(script, planted, False)
    write_script(script, planted, True)  # --force replaces the link itself
    assert victim.read_text() == "the user's file\n"
    assert not planted.is_symlink() and planted.read_text() == script
    assert stat.S_IMODE(planted.stat().st_mode) == 0o700
    dangling = tmp_path / "dangling.sh"
    dangling.symlink_to(tmp_path / "not-there")
    with pytest.raises(SchedulerError, match="already exists"):
        write_script(script, dangling, False)
    assert not (tmp_path / "not-there").exists()
