"""``hpcdl.checkpoint.run``: resume, train, and on the scheduler's warning stop at a commit with the state
on disk, then have the job requeued.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar, Union

from hpcdl.checkpoint import contract
from hpcdl.checkpoint import signals as warning_signals
from hpcdl.checkpoint.errors import CheckpointError
from hpcdl.checkpoint.protocol import Shard, Writer, restore, say
from hpcdl.checkpoint.store import CheckpointStore, Manifest
from hpcdl.common import basics, objects
from hpcdl.common.elastic_state import PreemptionInterrupt, State, clear_stop

T = TypeVar("T")
REQUEUE_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Settings:
    path: Path
    signals: list[signal.Signals]
    requeue: str
    exit_code: int
    job: str


def settings(
    path: Union[str, os.PathLike, None],
    signal_names: Optional[Sequence[str]],
    requeue: Optional[str],
    exit_code: Optional[int],
) -> Settings:
    """Arguments, else the batch script's environment (:mod:`hpcdl.checkpoint.contract`), else defaults."""
    raw_path = path if path is not None else os.environ.get(contract.PATH_ENV, "")
    if not str(raw_path).strip():
        raise CheckpointError(
            f"no checkpoint path: pass path= to hpcdl.checkpoint.run, or set {contract.PATH_ENV} (hpcdl "
            "submit --checkpoint PATH sets it); use a directory on a file system every rank shares"
        )
    if signal_names is None:
        from_env = os.environ.get(contract.SIGNALS_ENV, "")
        signal_names = from_env.split(",") if from_env.strip() else list(contract.DEFAULT_SIGNALS)
    if exit_code is None:
        text = os.environ.get(contract.EXIT_CODE_ENV, "").strip()
        if text and not (text.isdigit() and int(text) <= 255):
            raise CheckpointError(f"{contract.EXIT_CODE_ENV}={text!r}: give an exit status from 0 to 255")
        exit_code = int(text) if text else contract.DEFAULT_EXIT_CODE
    return Settings(
        path=Path(raw_path).expanduser(),
        signals=warning_signals.parse(signal_names),
        requeue=requeue if requeue is not None else os.environ.get(contract.REQUEUE_ENV, ""),
        exit_code=exit_code,
        job=os.environ.get(contract.JOB_ID_ENV, ""),
    )


def run(
    train: Callable[[State], T],
    state: State,
    path: Union[str, os.PathLike, None] = None,
    *,
    shard: Optional[Shard] = None,
    every: Optional[int] = None,
    interval: Optional[float] = None,
    keep: int = 1,
    signals: Optional[Sequence[str]] = None,
    requeue: Optional[str] = None,
    exit_code: Optional[int] = None,
    allow_resize: bool = True,
    exit_on_stop: bool = True,
) -> T:
    """Run ``train(state)`` so that a preempted job loses no work: resume ``state`` from the newest
    checkpoint in ``path``; while training, a warning signal on any rank (``signals``, default USR2 and
    TERM) makes every rank stop at its next ``state.commit()``, the committed state written to ``path``
    (rank 0 the replicated state, every rank its ``shard``); rank 0 then runs ``requeue`` (a shell
    command) and every rank exits with ``exit_code`` (``exit_on_stop=False``: ``PreemptionInterrupt`` is
    raised instead). A finished training writes its final state too, and returns what ``train`` returned.

    ``every`` (commits) and ``interval`` (seconds) add checkpoints along the way; ``keep`` is how many
    complete checkpoints stay (older ones are removed once a newer one is complete). A checkpoint of
    another world size continues on this one (``allow_resize=False`` refuses it) unless it has shards.
    ``path``, ``signals``, ``requeue`` and ``exit_code`` default to what ``hpcdl submit --checkpoint`` puts
    in the environment (:mod:`hpcdl.checkpoint.contract`). Call it from the main thread, after ``init()``.
    """
    if keep < 1:
        raise CheckpointError(f"keep={keep}: keep at least the newest checkpoint (keep=1)")
    chosen = settings(path, signals, requeue, exit_code)
    store = CheckpointStore(chosen.path)
    writer = Writer(store, shard, keep, chosen.job, every, interval)
    with warning_signals.catching(chosen.signals):
        try:
            manifest = restore(store, state, shard, allow_resize)
            _started(store, chosen, manifest)
            state.attach_checkpointer(writer)
            try:
                result = train(state)
            finally:
                state.attach_checkpointer(None)
            state.save()
            writer.write(state, "finished")
            return result
        except PreemptionInterrupt:
            if basics.rank() == 0:
                _after_stop(store, chosen, writer)
            objects.broadcast_object(None, 0, name="checkpoint.stopped")  # rank 0 requeues before any exits
            if not exit_on_stop:
                raise
            raise SystemExit(chosen.exit_code) from None
        finally:
            clear_stop()


def preemptible(
    path: Union[str, os.PathLike, None] = None, **options: Any
) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Decorator form of :func:`run`: ``@hpcdl.checkpoint.preemptible(path)`` on ``train(state, ...)``."""

    def decorate(train: Callable[..., T]) -> Callable[..., T]:
        @functools.wraps(train)
        def wrapper(state: State, *args: Any, **kwargs: Any) -> T:
            return run(lambda s: train(s, *args, **kwargs), state, path, **options)

        return wrapper

    return decorate


def _started(store: CheckpointStore, chosen: Settings, manifest: Optional[Manifest]) -> None:
    if basics.rank() != 0:
        return
    step = manifest.step if manifest is not None else None
    if manifest is not None:
        by = f"job {manifest.job}, " if manifest.job else ""
        say(f"resuming from step {step} in {store.root} ({by}{manifest.reason})")
    store.append_history({"event": "start", "job": chosen.job, "ranks": basics.size(), "resumed_step": step})


def _after_stop(store: CheckpointStore, chosen: Settings, writer: Writer) -> None:
    """Rank 0, once the checkpoint is complete: run the requeue command (if any) and say what happens."""
    if not chosen.requeue:
        say(
            f"stopped; the state is in {writer.last}. Submit the job again with the same checkpoint path "
            f"to go on (exit status {chosen.exit_code})"
        )
        return
    say(f"requeueing the job: {chosen.requeue}")
    try:
        done = subprocess.run(
            ["/bin/sh", "-c", chosen.requeue], capture_output=True, text=True, timeout=REQUEUE_TIMEOUT_S
        )
        ok, detail = done.returncode == 0, (done.stderr or done.stdout).strip()
        if done.returncode < 0:
            # A requeue ends the job's processes, the command's own too, sometimes before it exits.
            ok, detail = True, f"ended by {signal.Signals(-done.returncode).name} as the job is being ended"
    except (OSError, subprocess.TimeoutExpired) as exc:
        ok, detail = False, str(exc)
    if not ok:
        say(
            f"the requeue command failed ({detail or 'no message'}). The state is in {writer.last}; unless "
            "the scheduler requeues the job itself (as after a preemption), submit it again with the same "
            "checkpoint path to go on"
        )
    store.append_history({"event": "requeue", "job": chosen.job, "ok": ok, "detail": detail[-500:]})
