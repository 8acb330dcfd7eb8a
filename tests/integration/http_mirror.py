"""A real HTTP mirror for download tests: Python's http.server on 127.0.0.1 (an ephemeral port, so tests
running at once never collide), serving a directory, with byte ranges (RFC 9110 Range / Content-Range) that
a test can switch off, a connection it can cut after some bytes, and a log of what each request asked for."""

from __future__ import annotations

import re
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Optional

_RANGE = re.compile(r"^bytes=(\d+)-$")


@dataclass
class MirrorBehaviour:
    ranges: bool = True  # answer Range requests with 206; False: always the whole file (200)
    cut_after: Optional[int] = None  # close the next answer after this many body bytes (then reset)
    send_length: bool = True  # False: no Content-Length, the body ends when the connection closes
    requests: list[tuple[str, Optional[str]]] = field(default_factory=list)  # (path, Range header)
    body_bytes: int = 0  # body bytes sent over all answers


def _handler(root: Path, behaviour: MirrorBehaviour) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:  # keep test output clean
            return

        def do_GET(self) -> None:
            behaviour.requests.append((self.path, self.headers.get("Range")))
            path = root / self.path.lstrip("/")
            if not path.is_file():
                self.send_error(404)
                return
            data = path.read_bytes()
            start = 0
            match = _RANGE.match(self.headers.get("Range", ""))
            if match and behaviour.ranges:
                start = int(match.group(1))
                if start >= len(data):
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{len(data)}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            else:
                self.send_response(200)
            body = data[start:]
            if behaviour.send_length:
                self.send_header("Content-Length", str(len(body)))
            self.send_header("Accept-Ranges", "bytes" if behaviour.ranges else "none")
            self.end_headers()
            if behaviour.cut_after is not None:
                body, behaviour.cut_after = body[: behaviour.cut_after], None
                self.close_connection = True
            self.wfile.write(body)
            self.wfile.flush()
            behaviour.body_bytes += len(body)
            if self.close_connection or not behaviour.send_length:
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True

    return Handler


@contextmanager
def http_mirror(root: Path) -> Iterator[tuple[str, MirrorBehaviour]]:
    """Serve `root`; yields (base URL, behaviour to tweak and inspect). Stopped on exit, also on failure."""
    behaviour = MirrorBehaviour()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(root, behaviour))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", behaviour
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
