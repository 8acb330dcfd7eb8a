"""The scheduler-neutral job model and the site configuration."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from hpcdl.schedulers import (
    ArraySpec,
    JobSpecError,
    SignalSpec,
    SiteConfig,
    SiteConfigError,
    Sweep,
    load_site,
)
from hpcdl.schedulers import site as site_module
from hpcdl.schedulers.job import JobSpec, parse_walltime


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("01:00:00", 3600),
        ("1-02:03:04", 93784),
        ("90", 5400),
        ("2h", 7200),
        ("45s", 45),
        ("1d", 86400),
        ("36:00:00", 129600),
    ],
)
def test_walltime_forms(text: str, seconds: int) -> None:
    assert parse_walltime(text) == seconds


@pytest.mark.parametrize("text", ["5:00", "1:61:00", "2 hours", "-1", "0", "1.5h", ""])
def test_walltime_in_a_wrong_form_lists_the_valid_forms(text: str) -> None:
    with pytest.raises(JobSpecError, match="HH:MM:SS, D-HH:MM:SS"):
        parse_walltime(text)


def test_array_spec_forms() -> None:
    assert ArraySpec.parse("0-4").indices == (0, 1, 2, 3, 4)
    stepped = ArraySpec.parse("0-6:2%3")
    assert (stepped.indices, stepped.step, stepped.max_concurrent) == ((0, 2, 4, 6), 2, 3)
    listed = ArraySpec.parse("5,1,3")
    assert (listed.indices, listed.is_range) == ((1, 3, 5), False)
    for bad in ("4-1", "a-b", "1-3%0", "1-", "1-3:0"):
        with pytest.raises(JobSpecError, match="array"):
            ArraySpec.parse(bad)


def test_sweep_is_the_cartesian_product() -> None:
    sweep = Sweep.parse(["LR=0.1,0.01", "BS=32,64,128"])
    assert sweep.names == ("LR", "BS") and len(sweep) == 6
    assert sweep.points[0] == ("0.1", "32") and sweep.points[-1] == ("0.01", "128")
    for bad in (["LR"], ["1X=2"], ["LR=1", "LR=2"], ["LR="]):
        with pytest.raises(JobSpecError, match="sweep"):
            Sweep.parse(bad)


def test_signal_spec() -> None:
    assert SignalSpec.parse("SIGUSR2@90") == SignalSpec("USR2", 90)
    assert SignalSpec.parse("term") == SignalSpec("TERM", 90)
    with pytest.raises(JobSpecError, match="unknown signal 'NOPE'"):
        SignalSpec.parse("NOPE@10")
    with pytest.raises(JobSpecError, match="cannot be caught"):
        SignalSpec.parse("KILL@10")


def test_defaults_one_rank_per_gpu_else_per_node() -> None:
    assert JobSpec(["x"], nodes=2, gpus_per_node=4).validate().total_ranks == 8
    assert JobSpec(["x"], nodes=3).validate().total_ranks == 3
    assert JobSpec(["train.py", "-v"]).argv == [sys.executable, "train.py", "-v"]


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (dict(command=[]), "no command given"),
        (dict(nodes=0), "--nodes must be at least 1"),
        (dict(gpus_per_node=4, ranks_per_node=3), "cannot share 4 GPUs evenly"),
        (dict(job_name="9lives"), "job name"),
        (dict(signal=SignalSpec("USR2", 600), walltime="5m"), "not inside the walltime"),
        (dict(array=ArraySpec.parse("0-1"), sweep=Sweep.parse(["A=1,2"])), "either --array or --sweep"),
        (dict(env={"BAD-NAME": "1"}), "environment variable name"),
        (dict(requeue=True), "--requeue needs --signal"),
    ],
)
def test_impossible_jobs_are_refused(settings: dict, message: str) -> None:
    settings.setdefault("command", ["x"])
    with pytest.raises(JobSpecError, match=message):
        JobSpec(**settings).validate()


# ---- site configuration -------------------------------------------------------------------------------


@pytest.fixture
def site_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    files = {
        "system": tmp_path / "etc" / "site.yaml",
        "user": tmp_path / "home" / ".config" / "hpcdl" / "site.yaml",
        "env": tmp_path / "env-site.yaml",
        "explicit": tmp_path / "explicit.yaml",
    }
    for path in files.values():
        path.parent.mkdir(parents=True, exist_ok=True)
    monkeypatch.setattr(site_module, "SYSTEM_SITE_FILE", files["system"])
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("HPCDL_SITE", raising=False)
    return files


def test_site_files_merge_with_explicit_over_env_over_user_over_system(
    site_files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    site_files["system"].write_text(
        "scheduler: slurm\naccount: sys\npartition: batch\nqos: low\ngpus_per_node: 4\n"
    )
    site_files["user"].write_text("account: user\npartition: gpu\nqos: normal\n")
    site_files["env"].write_text("partition: debug\nqos: high\n")
    site_files["explicit"].write_text("qos: top\n")
    monkeypatch.setenv("HPCDL_SITE", str(site_files["env"]))
    site = load_site(site_files["explicit"])
    assert (site.scheduler, site.account, site.partition, site.qos, site.gpus_per_node) == (
        "slurm", "user", "debug", "top", 4,
    )  # fmt: skip
    assert site.origin("partition") == str(site_files["env"])


def test_no_site_files_means_plain_defaults(site_files: dict[str, Path]) -> None:
    site = load_site()
    assert site.scheduler == "auto" and site.gpus_per_node is None


def test_missing_named_site_file_is_an_error(
    site_files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HPCDL_SITE", str(site_files["env"]))
    with pytest.raises(SiteConfigError, match="does not exist"):
        load_site()


def test_unknown_site_key_lists_the_valid_ones(site_files: dict[str, Path]) -> None:
    site_files["user"].write_text("acount: typo\n")
    with pytest.raises(SiteConfigError, match="unknown key\\(s\\) acount") as info:
        load_site()
    assert "account: account / project charged" in str(info.value)
    assert "gpus_per_node:" in str(info.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("gpus_per_node: four\n", "gpus_per_node must be a int"),
        ("modules: cuda\n", "modules must be a list"),
        ("scheduler: sge\n", "scheduler 'sge' is not known"),
        ("max_walltime: 5:00\n", "max_walltime: walltime '5:00'"),
        ("max_walltime: 1:30\n", "max_walltime: walltime '1:30'"),
        ("- a\n- b\n", "must be a YAML mapping"),
        ("a: [\n", "cannot read it as YAML"),
    ],
)
def test_malformed_site_values_are_errors(site_files: dict[str, Path], text: str, message: str) -> None:
    site_files["user"].write_text(text)
    with pytest.raises(SiteConfigError, match=message):
        load_site()


def test_clock_walltimes_in_yaml_stay_clock_times(site_files: dict[str, Path]) -> None:
    site_files["user"].write_text("walltime: 1:30:00\nmax_walltime: 90\ngpus_per_node: 4\n")
    site = load_site()
    assert (site.walltime, site.max_walltime, site.gpus_per_node) == ("1:30:00", "90", 4)


def test_site_defaults_fill_the_job_and_flags_win() -> None:
    site = SiteConfig.from_mapping(
        {"account": "proj", "gpus_per_node": 4, "cpus_per_node": 64, "modules": ["cuda"], "env": {"A": "1"}},
        "site.yaml",
    )
    job = site.make_job(["train.py"], nodes=2, modules=["mine"], env={"B": "2"})
    assert (job.account, job.gpus_per_node, job.resolved_ranks_per_node, job.cpus_per_rank) == (
        "proj",
        4,
        4,
        16,
    )
    assert job.modules == ["cuda", "mine"] and job.env == {"A": "1", "B": "2"}
    assert site.make_job(["x"], account="other", gpus_per_node=0).account == "other"


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (dict(gpus_per_node=8), "8 GPUs per node requested, but nodes here have 4 .*ask for 0-4"),
        (dict(nodes=200), "at most 128 .*ask for 1-128"),
        (dict(walltime="2-00:00:00"), "longer than this site allows \\(24:00:00"),
        (dict(ranks_per_node=4, cpus_per_rank=32), "128 CPUs per node, but nodes here have 64"),
    ],
)
def test_requests_beyond_the_site_are_refused(request_: dict, message: str) -> None:
    site = SiteConfig.from_mapping(
        {"gpus_per_node": 4, "cpus_per_node": 64, "max_nodes": 128, "max_walltime": "24:00:00"}, "site.yaml"
    )
    with pytest.raises(SiteConfigError, match=message):
        site.make_job(["x"], **request_)
