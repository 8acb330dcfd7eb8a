"""hpcdl.tensorflow in graph mode on 2 and 3 real ranks (``tf_graph_checks.py``): collectives that each
rank's executor submits in its own order all complete; unnamed collectives meet on ranks whose graphs
differ elsewhere; collectives only some ranks create fail at once, and those only some ranks run at the
engine's deadline, naming the ranks and the collective and saying to name it; failures raise Horovod's
TensorFlow error classes; SyncBatchNormalization normalizes with the global batch."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_tensorflow_ranks import NO_TENSORFLOW, run_checks


@pytest.mark.parametrize("ranks", [2, 3])
def test_graph_collectives_in_any_order_names_and_errors(ranks: int) -> None:
    pytest.importorskip("tensorflow", reason=NO_TENSORFLOW)
    run_checks("tf_graph_checks.py", "graph", ranks)


@pytest.mark.parametrize("ranks", [2, 3])
def test_graph_collective_only_some_ranks_run_fails_at_the_deadline(ranks: int, tmp_path: Path) -> None:
    pytest.importorskip("tensorflow", reason=NO_TENSORFLOW)
    run_checks(
        "tf_graph_checks.py", "deadline", ranks, {"HPCDL_TIMEOUT": "3", "HPCDL_CHECKS_DIR": str(tmp_path)}
    )
