"""Fetch a source archive (from a mirror first, then its URL), verify its sha256, resume broken downloads.

The cache is a directory only the user may use (made mode 0700, refused if it is a link or another
user's), so a file verified there is the file that is unpacked. A download goes to ``<file>.part`` beside
the cache entry. When it breaks off (a dropped connection, a
timeout, Ctrl-C), the part stays, and the next fetch of a file whose sha256 the recipe names asks the server
for the rest only (an HTTP Range request; a server without ranges sends the whole file again). The completed
file is verified either way; a resumed file that fails verification is downloaded once more from its start.
No download may grow beyond ``max_bytes`` (a cap a hostile or broken server cannot make us exceed).
"""

from __future__ import annotations

import hashlib
import http.client
import os
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Optional
from urllib.parse import urlparse

from hpcdl.common.exceptions import HpcdlError
from hpcdl.common.output_file import OutputFileError, private_directory
from hpcdl.stack.names import file_name_problem
from hpcdl.stack.recipe import UNKNOWN_CHECKSUM, Source

DOWNLOAD_TIMEOUT_S = 120.0  # per connect and per read, not for the whole file
DEFAULT_MAX_DOWNLOAD_BYTES = 8 << 30  # well above the largest archive of the built-in recipes (cuDNN, ~1 GiB)
BLOCK = 1 << 20
MAX_DOWNLOAD_SETTING = "--max-download (HPCDL_STACK_MAX_DOWNLOAD)"
_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")


class FetchError(HpcdlError):
    """No candidate location delivered the file."""


class ChecksumError(HpcdlError):
    """A fetched file is not the one the recipe names."""


class DownloadTooLargeError(FetchError):
    """A download is larger than the cap; a larger cap is the user's decision."""


@dataclass(frozen=True)
class Transfer:
    """Where one download stands; reported as bytes arrive, and once more when it ends."""

    filename: str
    url: str
    received: int  # bytes of the file on disk now, a resumed part included
    total: Optional[int]  # the file's size, when the server says it
    resumed_from: int  # bytes that were already in the .part file when this transfer began
    elapsed: float  # seconds since this transfer began
    finished: bool = False

    @property
    def rate(self) -> float:
        """Bytes per second fetched by this transfer (the resumed part does not count)."""
        return (self.received - self.resumed_from) / self.elapsed if self.elapsed > 0 else 0.0


TransferCallback = Callable[[Transfer], None]


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()


def candidate_urls(source: Source, package: str, mirror: str | None) -> list[str]:
    """Where to look, in order: MIRROR/<package>/<file>, MIRROR/<file>, then the recipe's URL."""
    urls = []
    if mirror:
        base = mirror if "://" in mirror else Path(mirror).resolve().as_uri()
        base = base.rstrip("/")
        urls += [f"{base}/{package}/{source.filename}", f"{base}/{source.filename}"]
    urls.append(source.url)
    return urls


def _too_large(filename: str, size: int, max_bytes: int) -> DownloadTooLargeError:
    return DownloadTooLargeError(
        f"{filename} is larger than the download cap of {max_bytes} bytes ({size} bytes or more); if the "
        f"file is genuine, raise the cap with {MAX_DOWNLOAD_SETTING}"
    )


def _open_part(part: Path, append: bool):
    """The .part file for writing, never through a link planted in its place."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_APPEND if append else os.O_TRUNC)
    return os.fdopen(os.open(part, flags, 0o644), "wb")


def _body_start(response, offset: int) -> tuple[Optional[int], Optional[int]]:
    """(where the body starts in the file, the file's size) from the answer to a request at `offset`.

    The start is None when the server answered with a range other than the one asked for.
    """
    status = getattr(response, "status", None) or 200  # file: and ftp: answers carry no status
    if offset and status == 206:
        match = _CONTENT_RANGE.match(response.headers.get("Content-Range", ""))
        if not match or int(match.group(1)) != offset:
            return None, None
        return offset, int(match.group(3)) if match.group(3) != "*" else None
    length = response.headers.get("Content-Length")
    return 0, int(length) if length and length.isdigit() else None


def _complete_size(error: urllib.error.HTTPError) -> Optional[int]:
    """The file's size from a 416 answer ("bytes */SIZE"): the part may already hold all of it."""
    match = re.match(r"^bytes \*/(\d+)$", error.headers.get("Content-Range", "") if error.headers else "")
    return int(match.group(1)) if match else None


@dataclass
class _Meter:
    """Counts one transfer's bytes and reports them."""

    filename: str
    url: str
    received: int
    total: Optional[int]
    started: float
    on_transfer: Optional[TransferCallback]
    resumed_from: int = 0

    def report(self, finished: bool = False) -> Transfer:
        state = Transfer(
            self.filename,
            self.url,
            self.received,
            self.total,
            self.resumed_from,
            time.monotonic() - self.started,
            finished,
        )
        if self.on_transfer is not None:
            self.on_transfer(state)
        return state


def _receive(response, part: Path, meter: _Meter, max_bytes: int) -> None:
    """Append the body to `part`; a broken connection keeps what arrived, an oversized body deletes it."""
    with _open_part(part, append=meter.received > 0) as out:
        while True:
            try:
                block = response.read(BLOCK)
            except (http.client.HTTPException, OSError) as exc:
                raise FetchError(
                    f"{meter.filename}: the download broke off after {meter.received} bytes ({exc}); "
                    f"the part is kept in {part} and the next run resumes it"
                ) from None
            if not block:
                return
            meter.received += len(block)
            if meter.received > max_bytes:
                out.close()
                part.unlink(missing_ok=True)
                raise _too_large(meter.filename, meter.received, max_bytes)
            out.write(block)
            meter.report()


def download(
    url: str,
    target: Path,
    resume: bool,
    max_bytes: int = DEFAULT_MAX_DOWNLOAD_BYTES,
    on_transfer: Optional[TransferCallback] = None,
) -> Transfer:
    """Download `url` into `target` through `target.part`; with `resume`, continue a part left behind.

    A transfer that breaks off keeps its part and raises FetchError; one over `max_bytes` deletes it and
    raises DownloadTooLargeError.
    """
    part = target.with_name(target.name + ".part")
    offset = part.stat().st_size if resume and part.is_file() and not part.is_symlink() else 0
    request = urllib.request.Request(url, headers={"Range": f"bytes={offset}-"} if offset else {})
    meter = _Meter(target.name, url, offset, None, time.monotonic(), on_transfer, offset)
    try:
        response = urllib.request.urlopen(request, timeout=DOWNLOAD_TIMEOUT_S)
    except urllib.error.HTTPError as exc:
        if exc.code != 416 or not offset:
            raise
        if _complete_size(exc) == offset:  # the last run ended after the last byte, before the rename
            part.replace(target)
            meter.total = offset
            return meter.report(finished=True)
        part.unlink()  # the part is longer than the file the server has: start over
        return download(url, target, False, max_bytes, on_transfer)
    with response:
        start, meter.total = _body_start(response, offset)
        if start is None:  # not the range asked for: take the whole file instead
            part.unlink()
            return download(url, target, False, max_bytes, on_transfer)
        meter.received = meter.resumed_from = start
        if meter.total is not None and meter.total > max_bytes:
            part.unlink(missing_ok=True)
            raise _too_large(target.name, meter.total, max_bytes)
        meter.report()
        _receive(response, part, meter, max_bytes)
    if meter.total is not None and meter.received < meter.total:
        raise FetchError(
            f"{target.name}: the connection closed after {meter.received} of {meter.total} bytes; "
            f"the part is kept in {part} and the next run resumes it"
        )
    part.replace(target)
    return meter.report(finished=True)


def _reachable(url: str) -> bool:
    parsed = urlparse(url)
    return parsed.scheme != "file" or Path(urllib.request.url2pathname(parsed.path)).is_file()


def fetch(
    source: Source,
    package: str,
    cache: Path,
    mirror: str | None,
    verify: bool = True,
    max_bytes: int = DEFAULT_MAX_DOWNLOAD_BYTES,
    on_transfer: Optional[TransferCallback] = None,
) -> Path:
    """The verified archive in `cache`, downloading (or resuming) it when needed.

    Raises ChecksumError, FetchError or DownloadTooLargeError.
    """
    if source.sha256 == UNKNOWN_CHECKSUM and verify:
        raise ChecksumError(
            f"{package}: the recipe has no sha256 for {source.filename}; add it to the recipe, or pass "
            "--no-verify to build an unverified file"
        )
    if file_name_problem(source.filename):
        raise FetchError(f"{package}: {file_name_problem(source.filename)} (from {source.url})")
    try:  # what is verified there stays so: nobody else may replace it before it is used
        private_directory(cache, "download cache")
    except OutputFileError as exc:
        raise FetchError(f"{package}: {exc}") from None
    target = cache / source.filename
    if target.is_file() and (not verify or sha256_of(target) == source.sha256):
        return target
    target.unlink(missing_ok=True)
    # Only a file the recipe pins may be resumed: its checksum proves the pieces belong together.
    resumable = verify and source.sha256 != UNKNOWN_CHECKSUM
    tried = []
    for url in candidate_urls(source, package, mirror):
        if not _reachable(url):
            tried.append(f"{url} (no such file)")
            continue
        try:
            transfer = download(url, target, resumable, max_bytes, on_transfer)
            if verify and sha256_of(target) != source.sha256 and transfer.resumed_from > 0:
                target.unlink()  # the kept part may have come from another file: fetch it whole once
                download(url, target, False, max_bytes, on_transfer)
        except DownloadTooLargeError as exc:
            raise DownloadTooLargeError(f"{package}: {exc} (from {url})") from None
        except (urllib.error.URLError, OSError, TimeoutError, FetchError) as exc:
            tried.append(f"{url} ({getattr(exc, 'reason', exc)})")
            continue
        if verify:
            got = sha256_of(target)
            if got != source.sha256:
                target.unlink()
                raise ChecksumError(
                    f"{package}: checksum mismatch for {source.filename} from {url}\n"
                    f"  expected sha256 {source.sha256}\n  got      sha256 {got}\n"
                    "the file is not the one the recipe names: replace it in the mirror, or fix the recipe"
                )
        return target
    raise FetchError(f"{package}: could not fetch {source.filename}; tried:\n  " + "\n  ".join(tried))
