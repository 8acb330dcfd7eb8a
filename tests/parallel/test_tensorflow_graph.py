"""hpcdl.tensorflow in graph mode on 2 and 3 real ranks (``tf_graph_checks.py``): collectives that each
rank's executor submits in its own order all complete; unnamed collectives meet on ranks whose graphs
differ elsewhere; collectives only some ranks create fail at once, saying to name them; failures raise
Horovod's TensorFlow error classes; SyncBatchNormalization normalizes with the global batch."""

from __future__ import annotations

import pytest
from test_tensorflow_ranks import NO_TENSORFLOW, run_checks


@pytest.mark.parametrize("ranks", [2, 3])
def test_graph_collectives_in_any_order_names_and_errors(ranks: int) -> None:
    pytest.importorskip("tensorflow", reason=NO_TENSORFLOW)
    run_checks("tf_graph_checks.py", "graph", ranks)
