"""The shared progress bar: drawn only on a terminal, counts kept either way."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from hpcdl.common import progress


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_not_a_terminal_draws_nothing_but_counts(capsys: pytest.CaptureFixture[str]) -> None:
    assert not progress.enabled(stream=io.StringIO())
    with progress.bar("points", 3) as b:
        b.advance()
        b.advance(2)
        b.log("point 3 done")
    assert b.completed == 3 and b.total == 3
    err = capsys.readouterr().err
    assert err == "point 3 done\n"  # the line, and no bar characters


def test_no_progress_wins_over_a_terminal() -> None:
    assert progress.enabled(stream=_Tty())
    assert not progress.enabled(no_progress=True, stream=_Tty())


def test_a_terminal_gets_counts_and_eta(monkeypatch: pytest.MonkeyPatch) -> None:
    out = _Tty()
    monkeypatch.setattr(progress.sys, "stderr", out)
    monkeypatch.setattr(progress, "Console", lambda stderr: Console(file=out, force_terminal=True, width=100))
    with progress.bar("jobs", 4) as b:
        b.advance(4)
    assert "4/4" in out.getvalue() and "jobs" in out.getvalue()
    with progress.bar("download", 2048, kind="bytes") as b:
        b.update(completed=2048)
    assert "2.0/2.0 kB" in out.getvalue()


def test_a_count_bar_draws_every_step_even_when_steps_come_together(monkeypatch: pytest.MonkeyPatch) -> None:
    """Steps that finish within one redraw interval are each drawn (a benchmark's fast message sizes)."""
    out = _Tty()
    monkeypatch.setattr(progress.sys, "stderr", out)
    monkeypatch.setattr(progress, "Console", lambda stderr: Console(file=out, force_terminal=True, width=100))
    with progress.bar("sizes", 3) as b:
        b.update(completed=1)
        b.advance()
        b.update(completed=3)
    drawn = out.getvalue()
    assert all(f"{n}/3" in drawn for n in (1, 2, 3)), drawn
