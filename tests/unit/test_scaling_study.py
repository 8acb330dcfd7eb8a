"""Study definitions, step records, the report files and the terminal plots, without running ranks."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from hpcdl.common.steps import StepRecordError, StepTimer, parameter_bytes, read_rank_steps
from hpcdl.scaling import costmodel, publish, report, textplot
from hpcdl.scaling.results import RunResult, collect, summarize
from hpcdl.scaling.study import StudyError, StudySpec, Workload, create, load, mark_failed, plan, repeat_dir


def spec(**changes) -> StudySpec:
    values = dict(mode="strong", workers=[1, 2, 4], workload=Workload(model="small"), global_batch=64)
    values.update(changes)
    return StudySpec(**values)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (dict(mode="both"), "use --strong or --weak"),
        (dict(workload=Workload(model="big")), "no built-in model 'big'; choose small or resnet50"),
        (dict(workers=[]), "no worker counts"),
        (dict(workers=[2, 2]), "repeat a value"),
        (dict(workers=[0, 2]), "at least 1"),
        (
            dict(global_batch=100, workers=[1, 2, 8]),
            r"does not split evenly over 8 workers; use a multiple of 8 \(e\.g\. --global-batch 96\)",
        ),
        (dict(batch=8), "--strong takes --global-batch"),
        (dict(mode="weak", global_batch=64, batch=8), "--global-batch belongs to --strong"),
        (dict(repeats=0), "--repeats must be at least 1"),
        (dict(steps=0), "--steps must be at least 1"),
        (dict(global_batch=None), "the built-in model needs a batch"),
        (
            dict(
                mode="weak", global_batch=None, workload=Workload(command=("t.py",)), params={"N": ["1", "2"]}
            ),
            "--param N has 2 values for 3 worker counts",
        ),
        (
            dict(mode="weak", global_batch=None, batch=8, params={"N": ["1", "2", "3"]}),
            "parameter of your own script",
        ),
        (
            dict(workload=Workload(command=("t.py",)), global_batch=None, params={"N": ["1", "2", "4"]}),
            "that is a --weak study",
        ),
    ],
)
def test_impossible_studies_are_refused_with_what_to_change(changes: dict, message: str) -> None:
    with pytest.raises(StudyError, match=message):
        spec(**changes).validate()


def test_built_in_defaults_share_the_cores_over_the_largest_count() -> None:
    strong = spec(global_batch=None, threads=-1).fill_defaults(cpus=8).validate()
    assert strong.global_batch == 32 * 4 and strong.threads == 2
    weak = spec(mode="weak", global_batch=None, threads=-1, launch="batch").fill_defaults(cpus=8).validate()
    assert weak.batch == 32 and weak.threads == 0  # batch jobs: OMP_NUM_THREADS from --cpus-per-rank


def test_a_users_command_gets_its_values_per_point(tmp_path: Path) -> None:
    study = spec(
        mode="weak",
        global_batch=None,
        batch=16,
        workload=Workload(
            command=("train.py", "--layers", "{LAYERS}", "--bs={batch}", "{unknown}", "{workers}")
        ),
        params={"LAYERS": ["2", "4", "8"]},
    ).validate()
    assert study.rank_command(4, "py") == [
        "py", "-m", "hpcdl.scaling.runtimer", "train.py", "--layers", "8", "--bs=16", "{unknown}", "4",
    ]  # fmt: skip
    env = study.environment(tmp_path, 4, 2)
    assert (
        env["LAYERS"] == "8"
        and env["HPCDL_SCALING_BATCH"] == "16"
        and env["HPCDL_SCALING_GLOBAL_BATCH"] == "64"
    )
    assert env["HPCDL_SCALING_DIR"] == str((tmp_path / "points" / "W4").resolve())
    assert env["HPCDL_SCALING_REPEAT"] == "2" and "HPCDL_SCALING_REPEAT" not in study.environment(
        tmp_path, 4, None
    )


def test_repeats_are_interleaved_over_the_points() -> None:
    order = [(r.workers, r.repeat) for r in plan(spec(repeats=2).validate())]
    assert order == [(1, 1), (2, 1), (4, 1), (1, 2), (2, 2), (4, 2)]


def test_a_study_directory_is_never_reused_without_force(tmp_path: Path) -> None:
    study = spec().validate()
    create(tmp_path / "s", study, force=False)
    assert load(tmp_path / "s").workers == [1, 2, 4]
    with pytest.raises(StudyError, match="already holds a study; choose another --output, or add --force"):
        create(tmp_path / "s", study, force=False)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with pytest.raises(StudyError, match="already holds files"):
        create(tmp_path / "mine", study, force=False)
    (tmp_path / "s" / "points" / "W1").mkdir(parents=True)
    create(tmp_path / "s", study, force=True)
    assert not (tmp_path / "s" / "points").exists()
    with pytest.raises(StudyError, match="not a scaling study"):
        load(tmp_path / "mine")


def test_a_study_whose_runs_failed_is_rerun_in_place_unless_the_user_left_files_there(tmp_path: Path) -> None:
    study, directory = spec().validate(), tmp_path / "s"
    create(directory, study, force=False)
    (directory / "points" / "W1" / "repeat-1").mkdir(parents=True)
    (directory / "points" / "W1" / "repeat-1" / "output.log").write_text("Traceback ...")
    mark_failed(directory, "W=1 repeat 1 failed")
    assert (directory / "failed.txt").read_text() == "W=1 repeat 1 failed\n"
    create(directory, study, force=False)  # the failed run's outputs are replaced
    assert not (directory / "points").exists() and not (directory / "failed.txt").exists()
    mark_failed(directory, "again")
    (directory / "notes.txt").write_text("mine")
    with pytest.raises(StudyError, match="already holds a study"):
        create(directory, study, force=False)
    assert (directory / "notes.txt").read_text() == "mine"


class _Param:
    def __init__(self, numel: int, requires_grad: bool = True) -> None:
        self._numel, self.requires_grad = numel, requires_grad

    def numel(self) -> int:
        return self._numel

    def element_size(self) -> int:
        return 4


class _Optimizer:
    def __init__(self) -> None:
        shared = _Param(10)
        self.param_groups = [{"params": [shared, _Param(5)]}, {"params": [shared, _Param(7, False)]}]
        self.waited = 0

    def synchronize(self) -> str:
        time.sleep(0.02)
        self.waited += 1
        return "done"


def test_step_timer_records_steps_and_the_waits_inside_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HPCDL_RANK", "1")
    monkeypatch.setenv("HPCDL_SIZE", "2")
    optimizer = _Optimizer()
    assert parameter_bytes(optimizer) == 60  # the shared tensor once, the frozen one not at all
    with StepTimer(samples_per_step=8, directory=tmp_path) as timer:
        timer.watch(optimizer)
        for _ in range(3):
            with timer.step():
                time.sleep(0.01)
                assert optimizer.synchronize() == "done"
        with timer.step(samples=4):
            pass
    assert optimizer.waited == 3
    records = read_rank_steps(tmp_path / "steps.rank1.jsonl")
    assert (records.rank, records.size, records.reduced_bytes) == (1, 2, 60)
    assert [s["samples"] for s in records.steps] == [8, 8, 8, 4]
    for s in records.steps[:3]:
        assert 0.02 <= s["comm"] < s["seconds"] and len(s["waits"]) == 1
        offset, duration = s["waits"][0]
        assert offset >= 0.009 and duration == pytest.approx(s["comm"], abs=1e-5)
    assert records.steps[3]["comm"] == 0.0
    assert timer.last_comm_seconds == 0.0 and timer.steps_done == 4
    assert timer.total_comm_seconds == pytest.approx(sum(s["comm"] for s in records.steps))


def test_step_timer_outside_a_study_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HPCDL_SCALING_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    timer = StepTimer()
    with timer.step():
        pass
    timer.close()
    assert timer.steps_done == 1 and not list(tmp_path.iterdir())
    with pytest.raises(StepRecordError, match="has no method 'synchronize'"):
        timer.watch(object())
    with pytest.raises(StepRecordError, match="cannot nest"), timer.step(), timer.step():
        pass


def test_a_record_cut_short_by_a_killed_run_ends_the_records(tmp_path: Path) -> None:
    path = tmp_path / "steps.rank0.jsonl"
    header = {"format": 1, "kind": "header", "rank": 0, "size": 1, "host": "h", "reduced_bytes": None}
    path.write_text(
        json.dumps(header) + "\n" + json.dumps({"step": 0, "seconds": 0.1}) + '\n{"step": 1, "sec'
    )
    assert len(read_rank_steps(path).steps) == 1
    path.write_text('{"step": 0}\n')
    with pytest.raises(StepRecordError, match="not written by hpcdl's StepTimer"):
        read_rank_steps(path)


def _write_run(directory: Path, workers: int, repeat: int, step_s: float, comm_s: float, ranks: int) -> None:
    where = repeat_dir(directory, workers, repeat)
    where.mkdir(parents=True)
    for rank in range(ranks):
        header = {
            "format": 1,
            "kind": "header",
            "rank": rank,
            "size": workers,
            "host": "h",
            "cpus": 2,
            "reduced_bytes": 1000,
        }
        steps = [{"step": i, "seconds": step_s, "comm": comm_s, "samples": 64 // workers} for i in range(4)]
        text = "\n".join(json.dumps(r) for r in [header, *steps]) + "\n"
        (where / f"steps.rank{rank}.jsonl").write_text(text)


def test_collection_checks_every_rank_and_the_warmup(tmp_path: Path) -> None:
    study = spec(workers=[1, 2], repeats=1, warmup=1, steps=3).validate()
    _write_run(tmp_path, 1, 1, 0.100, 0.001, 1)
    _write_run(tmp_path, 2, 1, 0.060, 0.010, 1)
    with pytest.raises(StudyError, match=r"W=2 repeat 1: rank\(s\) 1 of 2 wrote no step records"):
        collect(study, tmp_path)
    _write_run(tmp_path / "other", 2, 1, 0.060, 0.010, 2)
    (repeat_dir(tmp_path, 2, 1) / "steps.rank1.jsonl").write_text(
        (repeat_dir(tmp_path / "other", 2, 1) / "steps.rank1.jsonl").read_text()
    )
    results = collect(study, tmp_path)
    two = results.point(2)
    assert two.step.mean == pytest.approx(0.060) and two.comm_s == pytest.approx(0.010)
    assert two.throughput == pytest.approx(64 / 0.060) and two.efficiency == pytest.approx(0.1 / (2 * 0.06))
    assert results.notes == []  # 2 ranks on 2 cores: not crowded
    with pytest.raises(StudyError, match="no more than the 4 warm-up steps"):
        collect(spec(workers=[1, 2], repeats=1, warmup=4).validate(), tmp_path)


def _report(tmp_path: Path) -> report.Report:
    study = spec(workers=[1, 2, 4, 8], repeats=2).validate()
    runs = []
    for w in study.workers:
        for r in (1, 2):
            step = 0.2 / w + 2 * (w - 1) / w * 0.004 + 2 * (w - 1) * 1e-4
            runs.append(
                RunResult(
                    w, r, "steps", step * (1 + 0.01 * r), 0.5 * (step - 0.2 / w), 64, 5, 0.0, 10**7, 1, w, 64
                )
            )
    return report.build(summarize(study, runs), threshold=0.7)


def test_report_files_are_written_and_user_files_are_kept(tmp_path: Path) -> None:
    built = _report(tmp_path)
    written = publish.publish(built, tmp_path)
    names = {p.name for p in written.files}
    assert {
        "report.md",
        "report.txt",
        "results.csv",
        "results.json",
        "speedup.png",
        "efficiency.svg",
    } <= names
    data = json.loads((tmp_path / "results.json").read_text())
    assert [p["workers"] for p in data["points"]] == [1, 2, 4, 8] and data["limit_workers"] == built.limit
    assert data["model"]["compute_s"]["value"] == pytest.approx(0.2 * 1.015)
    csv_lines = (tmp_path / "results.csv").read_text().splitlines()
    assert csv_lines[0].startswith("workers,batch_per_worker,repeats,step_s") and len(csv_lines) == 5
    markdown = (tmp_path / "report.md").read_text()
    assert "![speedup](speedup.png)" in markdown and f"up to W = {built.limit}" in markdown
    publish.publish(built, tmp_path)  # hpcdl's own files are simply replaced
    (tmp_path / "report.md").write_text("my notes")
    with pytest.raises(StudyError, match=r"report.md exist\(s\) and hpcdl did not write them"):
        publish.publish(built, tmp_path)
    assert (tmp_path / "report.md").read_text() == "my notes"
    publish.publish(built, tmp_path, force=True)
    assert (tmp_path / "report.md").read_text() == markdown


def test_terminal_plots_draw_every_curve(tmp_path: Path) -> None:
    built = _report(tmp_path)
    text = textplot.render(built)
    speedup, efficiency, breakdown = text.split("\n\n")
    assert speedup.count("o") >= 4 and "*" in speedup and "." in speedup and "o measured" in speedup
    assert "--- threshold 0.7" in efficiency and "-" * 40 in efficiency
    bars = [line.split("|")[1] for line in breakdown.splitlines() if line.startswith("W=")]
    assert len(bars) == 4 and "#" in bars[0] and "=" in bars[-1]
    assert bars[0].count("#") + bars[0].count("=") == textplot.WIDTH  # the slowest step fills the width


def test_plots_refuse_clearly_without_matplotlib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name: str, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    written = publish.publish(_report(tmp_path), tmp_path)
    assert written.plot_error and "pip install 'hpcdl[plot]'" in written.plot_error
    assert not list(tmp_path.glob("*.png")) and "(no pictures: " in (tmp_path / "report.md").read_text()


def test_efficiency_limit_in_the_report_matches_the_model(tmp_path: Path) -> None:
    built = _report(tmp_path)
    assert built.model is not None and built.limit == built.model.limit(0.7)
    assert max(p.workers for p in built.predictions) < costmodel.MAX_PREDICTED_WORKERS
    assert [p.workers for p in built.predictions] == [16, 32, 64, 128, 256, 512, 1024]


def test_a_submitted_studys_jobs_run_its_helpers_with_hpcdls_python_or_the_one_chosen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hpcdl.scaling import cluster
    from hpcdl.schedulers import site as site_module

    monkeypatch.setattr(site_module, "SYSTEM_SITE_FILE", tmp_path / "none.yaml")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("HPCDL_SITE", raising=False)
    study = StudySpec(mode="strong", workers=[1, 2], workload=Workload(command=("train.py",)),
                      global_batch=4, repeats=2, launch="batch").fill_defaults(2).validate()  # fmt: skip
    for chosen, expected in ((None, sys.executable), ("/opt/env/bin/python", "/opt/env/bin/python")):
        options = cluster.BatchOptions(scheduler="slurm", python=chosen)
        plan = cluster.plan_jobs(study, tmp_path / "s", options)
        for planned in plan.jobs:
            assert planned.job.python == expected
            assert planned.job.argv[:3] == [expected, "-m", "hpcdl.scaling.runtimer"]
