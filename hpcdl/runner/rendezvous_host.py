"""The one rendezvous server of a job, hosted in the launcher (``hpcdl.common.rendezvous``)."""

from __future__ import annotations

import sys
from typing import Protocol

from hpcdl.common.exceptions import HpcdlError


class RendezvousHandle(Protocol):
    @property
    def port(self) -> int: ...

    def arrived(self) -> list[int]: ...

    def stop(self) -> None: ...


def host_rendezvous(size: int, host: str) -> tuple[RendezvousHandle, str] | None:
    """Start the server on `host` (the address the ranks are given, not every interface) with a new job
    secret; return it and the secret.

    None (with a warning) when the runtime cannot host it: plain programs need no rendezvous, and
    hpcdl ranks then fail on their own with the runtime's error.
    """
    try:
        from hpcdl.common.rendezvous import RendezvousServer, make_secret

        secret = make_secret()
        server = RendezvousServer(size, secret, host)
        server.start()
    except (ImportError, HpcdlError, OSError) as exc:
        print(f"hpcdl run: warning: no rendezvous server for the ranks ({exc})", file=sys.stderr)
        return None
    except AttributeError as exc:  # a runtime library older than this Python code
        print(
            f"hpcdl run: warning: no rendezvous server for the ranks: the installed runtime library lacks "
            f"{exc.args[0].rsplit(' ', 1)[-1]}; rebuild it with 'pip install -e .' in the source tree",
            file=sys.stderr,
        )
        return None
    return server, secret
