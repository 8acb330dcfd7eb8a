"""Integrity of object payloads: what the object collectives send (``broadcast_object``,
``allgather_object`` of :mod:`hpcdl.common.objects` and ``hpcdl.torch``, optimizer options, elastic state)
is unpickled by the ranks that receive it, and unpickling runs code. So every payload travels with an
HMAC-SHA-256 that receivers check before anything reads it.

The key is the job's object key (``hpcdl_object_key`` in c_api.h: derived from the job secret and the nonce
of this job's rendezvous round, the same on every rank and new with every ``init``). The MAC covers the
operation (its kind, process set, name and sequence number: the how-manieth operation of that name on that
set, counted alike by every member), the rank that sent it and the payload. A payload altered on the way,
or replayed from another operation, job or round, is refused with :class:`HpcdlIntegrityError` and is never
unpickled. The job's own ranks hold the key: object collectives trust every rank of the job, as they must,
since any rank may send any object.

Python computes the MAC (hashlib's SHA-256 runs at about 1.4 GB/s here against the runtime's portable
0.3 GB/s), with the key the runtime derived. A sealed payload is the pickle followed by its 32-byte MAC.
"""

from __future__ import annotations

import ctypes
import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Union

import cloudpickle

from hpcdl.common import library
from hpcdl.common.exceptions import HpcdlIntegrityError

MAC_BYTES = 32
BytesLike = Union[bytes, bytearray, memoryview]


@dataclass(frozen=True)
class ObjectOperation:
    """One object collective as every member sees it; seals what a rank sends and opens what it receives."""

    key: bytes
    context: bytes  # kind, process set, sequence number and name, each delimited
    description: str  # for messages: "broadcast_object 'x' on process set 0"

    def seal(self, sender: int, payload: BytesLike) -> bytearray:
        """``payload`` followed by its MAC as sent by rank ``sender`` (its rank in the set), in a new
        writeable buffer (what a broadcast's root sends is also where it receives)."""
        sealed = bytearray(payload)
        sealed += self._mac(sender, payload)
        return sealed

    def open(self, sender: int, sealed: BytesLike) -> memoryview:
        """The payload inside ``sealed``, which rank ``sender`` sent; raises when its MAC is wrong."""
        view = memoryview(sealed).cast("B")
        if len(view) < MAC_BYTES:
            raise self._refusal(sender, f"it has {len(view)} bytes, fewer than its MAC alone")
        payload, mac = view[:-MAC_BYTES], view[-MAC_BYTES:]
        if not hmac.compare_digest(mac.tobytes(), self._mac(sender, payload)):
            raise self._refusal(sender, "its MAC does not match")
        return payload

    def pickle(self, sender: int, obj: Any) -> bytearray:
        """``obj`` serialized with cloudpickle and sealed, as rank ``sender`` sends it."""
        return self.seal(sender, cloudpickle.dumps(obj))

    def unpickle(self, sender: int, sealed: BytesLike) -> Any:
        """The object rank ``sender`` sent, unpickled only once its MAC checked out."""
        return cloudpickle.loads(self.open(sender, sealed))

    def unpickle_pieces(self, lengths: Sequence[int], gathered: BytesLike) -> list[Any]:
        """Every member's object from the concatenation of their sealed payloads (member i's is lengths[i]
        bytes long): all are checked before any is unpickled."""
        view, pieces, start = memoryview(gathered).cast("B"), [], 0
        for sender, length in enumerate(lengths):
            self.check_length(sender, length)
            pieces.append(self.open(sender, view[start : start + length]))
            start += length
        return [cloudpickle.loads(piece) for piece in pieces]

    def check_length(self, sender: int, length: int) -> int:
        """A sealed payload's length as announced before it travels (at least its MAC)."""
        if length < MAC_BYTES:
            raise self._refusal(sender, f"its announced length {length} cannot hold its MAC")
        return length

    def _mac(self, sender: int, payload: BytesLike) -> bytes:
        mac = hmac.new(self.key, self.context, hashlib.sha256)
        mac.update(b"sender=%d\0" % sender)
        mac.update(payload)
        return mac.digest()

    def _refusal(self, sender: int, why: str) -> HpcdlIntegrityError:
        return HpcdlIntegrityError(
            f"the payload rank {sender} sent for {self.description} failed its integrity check ({why}): it "
            "was altered or replayed on the way, so it was not unpickled. Something between the ranks "
            "interferes with the job's connections, or the ranks run different versions of hpcdl."
        )


def operation(kind: str, process_set: int, name: str) -> ObjectOperation:
    """The next object operation ``kind`` named ``name`` on ``process_set``; every member calls this once
    per operation, in the same order for one name."""
    lib = library.load()
    key = (ctypes.c_uint8 * MAC_BYTES)()
    library.check(lib.hpcdl_object_key(key))
    sequence = lib.hpcdl_object_sequence(process_set, name.encode())
    if sequence < 0:
        library.check(int(-sequence))
    named = name.encode()
    context = b"%s\0set=%d\0seq=%d\0name=%d:%s\0" % (kind.encode(), process_set, sequence, len(named), named)
    description = f"{kind} '{name}' on process set {process_set}"
    return ObjectOperation(bytes(key), context, description)
