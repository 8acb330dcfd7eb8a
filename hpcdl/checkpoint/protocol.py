"""Writing and restoring a checkpoint together: every rank takes part, and every rank ends the same way
(done, or the same ``CheckpointError``), so that none is left waiting.

Write (at a commit every rank reached): rank 0 makes the checkpoint's directory under a dot name and
broadcasts it; rank 0 writes the replicated state and every rank its own part (``shard``), each file
atomically; an allgather brings rank 0 each file's size and SHA-256, or each rank's failure; rank 0
writes the manifest, renames the directory into place and removes older checkpoints; a broadcast tells
every rank the outcome. A rank killed on the way makes the others' collective fail (the engine reports the
lost peer); the directory stays a dot name, and the previous checkpoint stays the one to resume from.

Restore: rank 0 finds the newest checkpoint whose state passes its checks, refuses one of another
training (its layout differs) or of another world size where per-rank parts cannot be resharded, and
loads it; each rank loads its own part; ``State.sync`` then gives every rank rank 0's state.
"""

from __future__ import annotations

import json
import pickle
import socket
import sys
import time
from pathlib import Path
from typing import Any, Optional, Protocol

from hpcdl.checkpoint.errors import CheckpointError
from hpcdl.checkpoint.files import FileRecord, read_verified, write_atomic
from hpcdl.checkpoint.store import STATE_FILE, CheckpointStore, Found, Manifest, shard_file
from hpcdl.common import basics, objects
from hpcdl.common.elastic_state import State
from hpcdl.common.exceptions import HpcdlError

PICKLE_PROTOCOL = 5


class Shard(Protocol):
    """A rank's own part of the state (its random generators, its part of a sharded optimizer...)."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> None: ...


def say(message: str) -> None:
    """A line on rank 0's standard error (the job's log), or this process's outside a job."""
    if not basics.is_initialized() or basics.rank() == 0:
        print(f"hpcdl checkpoint: {message}", file=sys.stderr, flush=True)


def _where() -> str:
    return f"rank {basics.rank()} on {socket.gethostname()}"


def _pickle_to(directory: Path, name: str, value: Any) -> FileRecord:
    return write_atomic(directory, name, lambda out: pickle.dump(value, out, protocol=PICKLE_PROTOCOL))


def _agree(problem: Optional[str], name: str) -> list[str]:
    """Every rank's problem (or none), known to every rank."""
    return [p for p in objects.allgather_object(problem, name=name) if p]


class Writer:
    """The checkpointer ``hpcdl.checkpoint.run`` attaches to a state: writes at the commits where the
    ranks agreed to stop or that ``every`` (commits) or ``interval`` (seconds) make due."""

    def __init__(
        self,
        store: CheckpointStore,
        shard: Optional[Shard],
        keep: int,
        job: str,
        every: Optional[int] = None,
        interval: Optional[float] = None,
    ) -> None:
        self.store = store
        self.shard = shard
        self.keep = keep
        self.job = job
        self.every = every
        self.interval = interval
        self.last: Optional[Path] = None
        self._last_time = time.monotonic()

    def due(self, state: State) -> bool:
        if self.every and state.commit_count % self.every == 0:
            return True
        return bool(self.interval) and time.monotonic() - self._last_time >= float(self.interval or 0)

    def write(self, state: State, reason: str) -> Path:
        rank, size = basics.rank(), basics.size()
        step, started = state.commit_count, time.monotonic()
        partial, problem = "", None
        if rank == 0:
            try:
                partial = str(self.store.begin(step))
            except OSError as exc:
                problem = f"cannot make a checkpoint directory in {self.store.root}: {exc.strerror or exc}"
            except HpcdlError as exc:  # a link another user could have planted on the way, and the like
                problem = str(exc)
        partial, problem = objects.broadcast_object((partial, problem), 0, name="checkpoint.begin")
        if problem:
            raise CheckpointError(f"{problem}; give a checkpoint path you can write")
        directory = Path(partial)
        records: list[FileRecord] = []
        problem = None
        try:
            if rank == 0:
                records.append(_pickle_to(directory, STATE_FILE, state.checkpoint_payload()))
            if self.shard is not None:
                records.append(_pickle_to(directory, shard_file(rank), self.shard.state_dict()))
        except OSError as exc:
            problem = f"{_where()} cannot write into {directory}: {exc.strerror or exc}"
            if rank != 0:
                problem += " (each rank writes its part there: use a file system that every rank shares)"
        except Exception as exc:  # a value that cannot be pickled: the user's to fix, said on every rank
            problem = f"{_where()} cannot pickle its state: {type(exc).__name__}: {exc}"
        gathered = objects.allgather_object((records, problem), name="checkpoint.files")
        problems = [p for _, p in gathered if p]
        outcome: Optional[str] = "; ".join(problems) or None
        final = ""
        if rank == 0:
            try:
                if problems:
                    self.store.abandon(directory)
                else:
                    manifest = Manifest(
                        step=step,
                        reason=reason,
                        world_size=size,
                        job=self.job,
                        layout=_normal(state.checkpoint_layout()),
                        files=[record for part, _ in gathered for record in part],
                        sharded=self.shard is not None,
                    )
                    final = str(self.store.finish(directory, manifest, self.keep))
                    seconds = time.monotonic() - started
                    event = {"event": "checkpoint", "job": self.job, "step": step, "reason": reason}
                    self.store.append_history({**event, "directory": Path(final).name, "seconds": seconds})
                    megabytes = sum(r.size for r in manifest.files) / 1e6
                    what = f"{reason}; {_ranks(size)}, {megabytes:.1f} MB, {seconds:.2f} s"
                    say(f"step {step} saved to {final} ({what})")
            except OSError as exc:
                outcome = f"rank 0 cannot complete {directory}: {exc.strerror or exc}"
            except HpcdlError as exc:
                outcome = f"rank 0 cannot complete {directory}: {exc}"
        outcome, final = objects.broadcast_object((outcome, final), 0, name="checkpoint.done")
        if outcome:
            raise CheckpointError(
                f"the checkpoint of step {step} was not written: {outcome}. The previous checkpoint in "
                f"{self.store.root} (if any) is kept"
            )
        self._last_time = time.monotonic()
        self.last = Path(final)
        return self.last


def _ranks(count: int) -> str:
    return f"{count} rank" if count == 1 else f"{count} ranks"


def _normal(value: Any) -> Any:
    """``value`` as it reads back from JSON (tuples become lists, keys strings)."""
    return json.loads(json.dumps(value))


def _differences(saved: Any, here: Any, where: str = "") -> list[str]:
    if isinstance(saved, dict) and isinstance(here, dict):
        found = []
        for key in sorted(set(saved) | set(here), key=str):
            if key not in here:
                found.append(f"{where}{key} is only in the checkpoint")
            elif key not in saved:
                found.append(f"{where}{key} is not in the checkpoint")
            else:
                found += _differences(saved[key], here[key], f"{where}{key}.")
        return found
    if saved == here:
        return []
    return [f"{where.rstrip('.') or 'the state'}: {saved} in the checkpoint, {here} here"]


def check_compatible(
    found: Found, state: State, shard: Optional[Shard], size: int, allow_resize: bool
) -> None:
    """Refuse a checkpoint that this training cannot continue from (raises CheckpointError)."""
    manifest = found.manifest
    differences = _differences(manifest.layout, _normal(state.checkpoint_layout()))
    if differences:
        shown = "; ".join(differences[:5]) + ("; ..." if len(differences) > 5 else "")
        raise CheckpointError(
            f"{found.directory} holds the state of another training (job {manifest.job or 'unknown'}): "
            f"{shown}. Give this training its own checkpoint path, or remove that one to start afresh"
        )
    if manifest.sharded != (shard is not None):
        has, passes = ("has", "passes no") if manifest.sharded else ("has no", "passes a")
        raise CheckpointError(
            f"{found.directory} {has} per-rank parts (shard=) and this run {passes} shard; pass the same "
            "shard= as the run that wrote it, or use another checkpoint path"
        )
    if manifest.world_size != size:
        if manifest.sharded:
            raise CheckpointError(
                f"{found.directory} was written by {manifest.world_size} ranks, each with its own part "
                f"(shard=), and this job has {size}; per-rank parts cannot be resharded: run with "
                f"{manifest.world_size} ranks"
            )
        if not allow_resize:
            raise CheckpointError(
                f"{found.directory} was written by {manifest.world_size} ranks and this job has {size}; run "
                f"with {manifest.world_size} ranks, or pass allow_resize=True to continue the data-parallel "
                "state on this many"
            )
        say(
            f"continuing {_ranks(manifest.world_size)}' checkpoint on {_ranks(size)}: the model and "
            "optimizer are replicated, an ElasticSampler shares the samples left in the epoch among the ranks"
        )


def _newest_readable(store: CheckpointStore) -> tuple[Optional[Found], Any]:
    """The newest complete checkpoint whose replicated state reads back intact, and that state."""
    for _, directory in reversed(store.complete()):
        try:
            manifest = store.manifest(directory)
            record = manifest.record(STATE_FILE)
            if record is None:
                raise CheckpointError(f"{directory} lists no {STATE_FILE}")
            data = read_verified(directory, record)
        except CheckpointError as exc:
            say(f"passing over a checkpoint: {exc}")
            continue
        return Found(directory, manifest), data
    return None, None


def restore(
    store: CheckpointStore, state: State, shard: Optional[Shard], allow_resize: bool
) -> Optional[Manifest]:
    """Load the newest checkpoint into ``state`` on every rank (and each rank's ``shard``); None when
    there is none yet. The state is synchronized and committed on every rank either way."""
    rank, size = basics.rank(), basics.size()
    decision: dict[str, Any] = {}
    if rank == 0:
        try:
            if store.root.exists() and not store.root.is_dir():
                raise CheckpointError(f"checkpoint path {store.root} is not a directory; give a directory")
            store.remove_leftovers()
            found, data = _newest_readable(store)
            if found is not None:
                check_compatible(found, state, shard, size, allow_resize)
                state.load_checkpoint_payload(pickle.loads(data))
                decision = {"directory": str(found.directory), "manifest": found.manifest}
        except CheckpointError as exc:
            decision = {"error": str(exc)}
        except Exception as exc:  # the pickle names a class this program lacks, and the like
            decision = {"error": f"cannot load the checkpoint in {store.root}: {type(exc).__name__}: {exc}"}
    decision = objects.broadcast_object(decision, 0, name="checkpoint.restore")
    if "error" in decision:
        raise CheckpointError(decision["error"])
    manifest: Optional[Manifest] = decision.get("manifest")
    if manifest is not None and shard is not None:
        problem = None
        try:
            directory = Path(decision["directory"])
            shard.load_state_dict(pickle.loads(read_verified(directory, _shard_record(manifest, rank))))
        except CheckpointError as exc:
            problem = f"{_where()}: {exc}"
        except Exception as exc:
            problem = f"{_where()} cannot load its part: {type(exc).__name__}: {exc}"
        problems = _agree(problem, "checkpoint.restore_shards")
        if problems:
            raise CheckpointError("; ".join(problems))
    state.sync()
    state.save()
    return manifest


def _shard_record(manifest: Manifest, rank: int) -> FileRecord:
    record = manifest.record(shard_file(rank))
    if record is None:
        raise CheckpointError(f"the checkpoint has no part for rank {rank}")
    return record


def load(path: Path) -> tuple[Found, Any, dict[int, Any]]:
    """The newest complete checkpoint under ``path`` read back in this process, every file checked: its
    directory and manifest, the replicated state, and each rank's part. No collectives."""
    store = CheckpointStore(path)
    found, data = _newest_readable(store)
    if found is None:
        raise CheckpointError(f"no complete checkpoint in {path}")
    shards = {}
    if found.manifest.sharded:
        for rank in range(found.manifest.world_size):
            shards[rank] = pickle.loads(read_verified(found.directory, _shard_record(found.manifest, rank)))
    return found, pickle.loads(data), shards
