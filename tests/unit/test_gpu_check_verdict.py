"""scripts/gpu-check.sh's verdict: the rows steps print and the table they make, the exit status's rule,
how the driver reads pytest's summary and a step that timed out or failed silently, and how the NVTX
probe's log is judged."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "gpu_check"))

import check
import verdict
from one_rank import nvtx_verdict
from verdict import FAIL, MEASURED, PASS, SKIP, Row


def test_rows_printed_by_a_step_come_back_in_order_among_other_output(capsys) -> None:
    verdict.emit("one | two", PASS, "3 cases")
    print("some other line")
    verdict.emit("nvtx", SKIP, "dry")
    rows = verdict.parse("[0]<stdout>:" + capsys.readouterr().out)
    assert rows == [Row("one | two", PASS, "3 cases"), Row("nvtx", SKIP, "dry")]
    text = verdict.table(rows)
    assert text.splitlines()[0] == "| check | result | figure |"
    assert "| one \\| two | pass | 3 cases |" in text  # a pipe in a cell does not break the table


def test_an_unknown_result_is_refused() -> None:
    with pytest.raises(ValueError, match="result 'ok'"):
        Row("x", "ok", "")


def test_skips_pass_only_in_the_dry_mode_and_failures_never() -> None:
    rows = [Row("a", PASS, ""), Row("b", MEASURED, ""), Row("c", SKIP, "")]
    assert verdict.passed(rows, allow_skips=True)
    assert not verdict.passed(rows, allow_skips=False)
    assert not verdict.passed([*rows, Row("d", FAIL, "")], allow_skips=True)
    assert not verdict.passed([], allow_skips=True)


def _outcome(stdout: str = "", stderr: str = "", returncode: int | None = 0) -> check.Outcome:
    return check.Outcome(returncode, 1.0, stdout, stderr, 60.0)


PYTEST_OUTPUT = """\
..s.F
SKIPPED [1] tests/unit/test_gpu_cuda.py:63: needs a second GPU to submit from
FAILED tests/unit/test_gpu_cuda.py::test_several_nccl_streams - AssertionError
1 failed, 3 passed, 1 skipped in 12.31s
"""


def test_pytest_summary_gives_the_row() -> None:
    (row,) = check.pytest_rows(dry=False)(_outcome(PYTEST_OUTPUT, returncode=1))
    assert row.result == FAIL
    assert row.figure.startswith("3 passed, 1 failed, 1 skipped")
    assert "test_several_nccl_streams" in row.figure
    ok = PYTEST_OUTPUT.replace("1 failed, ", "").replace("FAILED", "")
    (row,) = check.pytest_rows(dry=False)(_outcome(ok))
    assert row == Row(row.check, PASS, "3 passed, 0 failed, 1 skipped (needs a second GPU to submit from)")
    (row,) = check.pytest_rows(dry=True)(_outcome("sssss\n5 skipped in 3.20s\n"))
    assert row.result == SKIP and "5 skipped" in row.figure
    (row,) = check.pytest_rows(dry=False)(_outcome("sssss\n5 skipped in 3.20s\n"))
    assert row.result == FAIL  # on a GPU machine nothing may be skipped wholesale


def test_a_step_that_timed_out_or_failed_silently_gets_a_failed_row() -> None:
    step = check.Step("one_rank", "1 rank", ["true"], 60, check.step_rows)
    emitted = verdict.PREFIX + '{"check": "1 rank, dtypes", "result": "pass", "figure": "9 cases"}\n'
    rows = check.rows_of(step, _outcome(emitted, returncode=None))
    assert [r.result for r in rows] == [PASS, FAIL] and "timed out after 60 s" in rows[1].figure
    rows = check.rows_of(step, _outcome("", "Traceback...\nImportError: no hpcdl", returncode=1))
    assert rows == [Row("1 rank", FAIL, "exit 1: Traceback... / ImportError: no hpcdl")]
    assert check.rows_of(step, _outcome())[0].figure.startswith("the step reported nothing")
    bench = check.Step("gpu_overhead", "overhead", ["true"], 60, check.overhead_rows)
    (row,) = check.rows_of(bench, _outcome("not json"))
    assert row.result == FAIL and "unreadable output" in row.figure


def test_the_overhead_row_names_the_smallest_the_mebibyte_and_the_largest_size() -> None:
    sizes = [
        {"bytes": b, "hpcdl_us": 50.0 + i, "torch_us": 10.0, "overhead_us": 40.0 + i, "hpcdl_vs_torch": 5.0}
        for i, b in enumerate(4 * 4**k for k in range(14))
    ]
    report = {"mode": "nccl", "backend": "nccl", "sizes": sizes}
    (row,) = check.overhead_rows(_outcome(json.dumps(report)))
    assert row.result == MEASURED and "CUDA" in row.check
    assert [part.split(":")[0] for part in row.figure.split("; ")] == ["4 B", "1 MiB", "256 MiB"]


ENABLED = """\
loaded
start 1 hpcdl ALLREDUCE (1 tensor)
start 2 hpcdl FUSED_ALLREDUCE (3 tensors)
end 1
end 2
start 3 hpcdl ALLGATHER (1 tensor)
end 3
start 4 hpcdl BROADCAST (1 tensor)
start 5 hpcdl ALLTOALL (1 tensor)
start 6 hpcdl REDUCESCATTER (2 tensors)
start 7 someone else's range
end 4
end 5
end 6
""".splitlines()


def test_nvtx_ranges_must_cover_every_kind_be_closed_and_stop_when_disabled() -> None:
    result, figure = nvtx_verdict(ENABLED, [])
    assert result == PASS and figure.startswith("6 ranges, all closed, of 6 kinds"), figure
    result, figure = nvtx_verdict([line for line in ENABLED if line != "end 3"], [])
    assert result == FAIL and "1 ranges never closed (ALLGATHER)" in figure
    result, figure = nvtx_verdict([line for line in ENABLED if "ALLTOALL" not in line], [])
    assert result == FAIL and "no range for ALLTOALL" in figure
    result, figure = nvtx_verdict(ENABLED, ["start 8 hpcdl ALLREDUCE (1 tensor)", "end 8"])
    assert result == FAIL and "1 ranges with HPCDL_DISABLE_NVTX_RANGES=1" in figure
    result, figure = nvtx_verdict(ENABLED[1:], [])
    assert result == FAIL and "not loaded" in figure


def test_the_install_row_gives_the_build_time_and_cmake_or_the_failure(tmp_path: Path) -> None:
    log = tmp_path / "install.log"
    log.write_text("==> pip install -e /tree\ncmake version 3.31.6\n==> built and installed in 71 s\n")
    row = check.install_row(argparse.Namespace(install_rc=0, install_seconds=83.2, install_log=str(log)))
    assert (row.result, row.figure) == (PASS, "83 s, CMake 3.31.6")
    log.write_text(
        "ERROR: No matching distribution found for numpy>=1.21\ninstall: failed; if a package ...\n"
    )
    row = check.install_row(argparse.Namespace(install_rc=1, install_seconds=5.0, install_log=str(log)))
    assert row.result == FAIL and row.figure.startswith(
        "exit 1: ERROR: No matching distribution found for numpy"
    )
    row = check.install_row(argparse.Namespace(install_rc=None, install_seconds=0.0, install_log=None))
    assert row.result == SKIP


def test_a_failed_rank_scenario_keeps_its_whole_output_and_its_row_says_where(tmp_path: Path, capsys) -> None:
    import ranks

    output = "".join(f"output line {i}\n" for i in range(200))

    def failing() -> None:
        raise AssertionError(f"order failed:\n{output}the last line")

    log = tmp_path / "ranks" / "2-ranks-order.txt"
    assert not ranks.row("2 ranks: order", failing, log)
    (row,) = verdict.parse(capsys.readouterr().out)
    assert row.result == FAIL and row.figure.endswith(f"(all of it: {log})") and len(row.figure) <= 400
    kept = log.read_text()
    assert kept.startswith("2 ranks: order\n") and output in kept
    assert kept.rstrip().endswith("the last line")
