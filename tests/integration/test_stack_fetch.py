"""Downloads of `hpcdl stack build` against a real local HTTP server: resuming a half-written `.part` with a
Range request (and without, from a server that has no ranges), verifying the completed file either way,
keeping the part of a broken transfer for the next run, and the download size cap."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import pytest
from http_mirror import http_mirror

from hpcdl.stack.fetch import DownloadTooLargeError, FetchError, Transfer, fetch
from hpcdl.stack.recipe import UNKNOWN_CHECKSUM, Source

MIB = 1 << 20
NAME = "payload-1.0.tar.gz"


@pytest.fixture
def served(tmp_path: Path) -> tuple[Path, bytes]:
    """A 3 MiB file in a served directory; returns (that directory, the file's bytes)."""
    root = tmp_path / "served"
    root.mkdir()
    data = random.Random(27).randbytes(3 * MIB)
    (root / NAME).write_bytes(data)
    return root, data


def cache_holding_part(tmp_path: Path, part: bytes) -> Path:
    """A download cache where an interrupted download left `part`."""
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / (NAME + ".part")).write_bytes(part)
    return cache


def source(base: str, data: bytes, pinned: bool = True) -> Source:
    return Source(f"{base}/{NAME}", hashlib.sha256(data).hexdigest() if pinned else UNKNOWN_CHECKSUM)


def test_a_half_written_part_is_resumed_with_a_range_request(
    served: tuple[Path, bytes], tmp_path: Path
) -> None:
    root, data = served
    half = len(data) // 2
    cache = cache_holding_part(tmp_path, data[:half])
    seen: list[Transfer] = []
    with http_mirror(root) as (base, server):
        got = fetch(source(base, data), "payload", cache, None, on_transfer=seen.append)
    assert got.read_bytes() == data
    assert server.requests == [(f"/{NAME}", f"bytes={half}-")]
    assert server.body_bytes == len(data) - half  # only the missing half crossed the wire
    assert not (cache / (NAME + ".part")).exists()
    assert seen[0].resumed_from == half and seen[0].total == len(data)
    assert [t.received for t in seen] == sorted(t.received for t in seen)
    assert seen[-1].finished and seen[-1].received == len(data) and seen[-1].rate > 0


def test_a_server_without_ranges_sends_the_whole_file(served: tuple[Path, bytes], tmp_path: Path) -> None:
    root, data = served
    cache = cache_holding_part(tmp_path, data[: MIB // 2])
    with http_mirror(root) as (base, server):
        server.ranges = False
        got = fetch(source(base, data), "payload", cache, None)
    assert got.read_bytes() == data  # the part was replaced, not appended to
    assert server.body_bytes == len(data)


def test_a_part_from_another_file_fails_verification_and_is_fetched_whole(
    served: tuple[Path, bytes], tmp_path: Path
) -> None:
    root, data = served
    cache = cache_holding_part(tmp_path, bytes(MIB))  # zeros: not a prefix of the file
    with http_mirror(root) as (base, server):
        got = fetch(source(base, data), "payload", cache, None)
    assert hashlib.sha256(got.read_bytes()).hexdigest() == hashlib.sha256(data).hexdigest()
    assert [r[1] for r in server.requests] == [f"bytes={MIB}-", None]


def test_a_broken_transfer_keeps_its_part_and_the_next_fetch_resumes(
    served: tuple[Path, bytes], tmp_path: Path
) -> None:
    root, data = served
    cache = tmp_path / "cache"
    with http_mirror(root) as (base, server):
        server.cut_after = MIB + 12345
        with pytest.raises(FetchError, match="the next run resumes it"):
            fetch(source(base, data), "payload", cache, None)
        part = cache / (NAME + ".part")
        kept = part.stat().st_size
        assert 0 < kept <= MIB + 12345 and data.startswith(part.read_bytes())
        got = fetch(source(base, data), "payload", cache, None)
        assert server.requests[-1] == (f"/{NAME}", f"bytes={kept}-")
    assert got.read_bytes() == data


def test_an_unpinned_file_is_never_resumed(served: tuple[Path, bytes], tmp_path: Path) -> None:
    root, data = served
    cache = cache_holding_part(tmp_path, data[:MIB])
    with http_mirror(root) as (base, server):
        got = fetch(source(base, data, pinned=False), "payload", cache, None, verify=False)
    assert server.requests == [(f"/{NAME}", None)]  # nothing could prove the pieces belong together
    assert got.read_bytes() == data


@pytest.mark.parametrize("send_length", [True, False], ids=["declared-size", "size-unknown"])
def test_a_download_over_the_cap_is_refused(
    served: tuple[Path, bytes], tmp_path: Path, send_length: bool
) -> None:
    root, data = served
    cache = tmp_path / "cache"
    with http_mirror(root) as (base, server):
        server.send_length = send_length
        with pytest.raises(DownloadTooLargeError) as caught:
            fetch(source(base, data), "payload", cache, None, max_bytes=2 * MIB)
    message = str(caught.value)
    assert f"larger than the download cap of {2 * MIB} bytes" in message
    assert "--max-download (HPCDL_STACK_MAX_DOWNLOAD)" in message
    assert not (cache / NAME).exists() and not (cache / (NAME + ".part")).exists()
