"""Fetch a source archive (from a mirror first, then its URL), verify its sha256 and unpack it safely."""

from __future__ import annotations

import hashlib
import shutil
import tarfile
import urllib.error
import urllib.request
import zipfile
from pathlib import Path
from urllib.parse import urlparse

from hpcdl.common.exceptions import HpcdlError
from hpcdl.stack.recipe import UNKNOWN_CHECKSUM, Source

DOWNLOAD_TIMEOUT_S = 120.0


class FetchError(HpcdlError):
    """No candidate location delivered the file."""


class ChecksumError(HpcdlError):
    """A fetched file is not the one the recipe names."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
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


def _download(url: str, target: Path) -> None:
    partial = target.with_name(target.name + ".part")
    try:
        with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response, partial.open("wb") as out:
            shutil.copyfileobj(response, out)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    partial.replace(target)


def fetch(source: Source, package: str, cache: Path, mirror: str | None, verify: bool = True) -> Path:
    """The verified archive in `cache`, downloading it when needed; raises ChecksumError or FetchError."""
    if source.sha256 == UNKNOWN_CHECKSUM and verify:
        raise ChecksumError(
            f"{package}: the recipe has no sha256 for {source.filename}; add it to the recipe, or pass "
            "--no-verify to build an unverified file"
        )
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / source.filename
    if target.is_file() and (not verify or sha256_of(target) == source.sha256):
        return target
    target.unlink(missing_ok=True)
    tried = []
    for url in candidate_urls(source, package, mirror):
        if (
            urlparse(url).scheme == "file"
            and not Path(urllib.request.url2pathname(urlparse(url).path)).is_file()
        ):
            tried.append(f"{url} (no such file)")
            continue
        try:
            _download(url, target)
        except (urllib.error.URLError, OSError, TimeoutError) as exc:
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


def _safe_zip_members(archive: zipfile.ZipFile) -> list[str]:
    names = archive.namelist()
    for name in names:
        if name.startswith("/") or ".." in Path(name).parts:
            raise FetchError(f"refusing to unpack {name}: it points outside the unpack directory")
    return names


def unpack(archive: Path, destination: Path, strip: str = "") -> Path:
    """Unpack into `destination`; return the package root (`strip`, or the archive's single top directory)."""
    destination.mkdir(parents=True, exist_ok=True)
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zipped:
            zipped.extractall(destination, members=_safe_zip_members(zipped))
            for info in zipped.infolist():  # zipfile drops Unix modes; executables (nvcc) need them back
                mode = info.external_attr >> 16
                if mode and not info.is_dir():
                    (destination / info.filename).chmod(mode & 0o777)
    elif tarfile.is_tarfile(archive):
        with tarfile.open(archive) as tarred:
            if hasattr(tarfile, "data_filter"):
                tarred.extractall(destination, filter="data")
            else:  # Python without extraction filters: check the names ourselves
                for member in tarred.getmembers():
                    if member.name.startswith("/") or ".." in Path(member.name).parts:
                        raise FetchError(f"refusing to unpack {member.name} from {archive.name}")
                tarred.extractall(destination)  # members checked above
    else:
        raise FetchError(f"{archive.name} is neither a tar nor a zip archive")
    if strip:
        root = destination / strip
        if not root.is_dir():
            raise FetchError(f"{archive.name} has no directory {strip} (the recipe's 'strip')")
        return root
    entries = list(destination.iterdir())
    return entries[0] if len(entries) == 1 and entries[0].is_dir() else destination
