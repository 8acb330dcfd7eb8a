"""What object collectives send is unpickled by the ranks that receive it. Rank 0 of a real two-rank job
tampers with the bytes it puts on the wire (object_attack_checks.py), as something on the network between
the ranks could: rank 1 must refuse the payload before cloudpickle.loads runs, so the forged pickle's code
never runs, and a payload replayed from an earlier operation is refused like an altered one. Both
frameworks' object collectives (hpcdl.torch, hpcdl.tensorflow) are attacked."""

from __future__ import annotations

from pathlib import Path

import pytest
from _ranks import run_ranks

CHECKS = str(Path(__file__).with_name("object_attack_checks.py"))


@pytest.mark.parametrize("mode", ["altered-broadcast", "altered-allgather", "replayed-broadcast"])
@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_a_tampered_object_payload_is_refused_before_unpickling(
    framework: str, mode: str, tmp_path: Path
) -> None:
    pytest.importorskip(framework)
    marker = tmp_path / "planted"
    results = run_ranks(2, CHECKS, args=(framework, mode, str(marker)), timeout=180)
    report = results[1].result
    assert report is not None, results[1].stderr
    assert report["outcome"][:2] == ["raised", "HpcdlIntegrityError"], report
    assert "failed its integrity check" in report["outcome"][2] and "rank 0" in report["outcome"][2]
    assert report["unpickled"] == 0 and not report["marker"] and not marker.exists(), report
