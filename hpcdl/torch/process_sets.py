"""Horovod's process sets in ``hpcdl.torch``: the framework-free objects of :mod:`hpcdl.common.process_sets`
(one ``ProcessSet`` class and one ``global_process_set`` for every framework API, as in Horovod)."""

from __future__ import annotations

from hpcdl.common.process_sets import (
    ProcessSet,
    add_process_set,
    global_process_set,
    id_of,
    remove_process_set,
)

__all__ = ["ProcessSet", "add_process_set", "global_process_set", "id_of", "remove_process_set"]
