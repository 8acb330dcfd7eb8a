"""Another user of the cluster, for tests of what hpcdl does when someone else can write where it works: an
unprivileged user the test session creates when it runs as root (one for the whole session, removed at its
end), which plants files and links with its own rights."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class OtherUser:
    name: str
    uid: int
    gid: int

    def run(self, script: str, check: bool = True) -> subprocess.CompletedProcess:
        """`script` run by /bin/sh as this user (with none of the test's groups)."""
        return subprocess.run(
            ["/bin/sh", "-c", script],
            user=self.uid,
            group=self.gid,
            extra_groups=[],
            cwd="/",
            env={"PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=30,
            check=check,
        )


@contextmanager
def shared_directory(user: OtherUser) -> Iterator[Path]:
    """A directory of `user`'s that everyone may write (mode 0777, no sticky bit: a project directory
    shared too widely), in a fresh directory under /tmp that both users reach; removed afterwards."""
    base = Path(tempfile.mkdtemp(prefix="hpcdl-shared-", dir="/tmp"))
    try:
        base.chmod(0o755)
        shared = base / "shared"
        shared.mkdir()
        os.chown(shared, user.uid, user.gid)
        shared.chmod(0o777)
        yield shared
    finally:
        shutil.rmtree(base, ignore_errors=True)


def why_not() -> str | None:
    """Why no other user can be made here (None: it can)."""
    if os.geteuid() != 0:
        return "needs root, to create an unprivileged second user (another user of a shared cluster)"
    if shutil.which("useradd") is None or shutil.which("userdel") is None:
        return "needs useradd and userdel, to create a second user"
    return None


@contextmanager
def other_user() -> Iterator[OtherUser]:
    """A new system user without a home or a login shell, removed afterwards."""
    name = f"hpcdlt{os.getpid()}"
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
        check=True,
        capture_output=True,
    )
    try:
        entry = pwd.getpwnam(name)
        yield OtherUser(name, entry.pw_uid, entry.pw_gid)
    finally:
        subprocess.run(["userdel", name], check=False, capture_output=True)
