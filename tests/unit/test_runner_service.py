"""The launcher's service for its ranks (hpcdl.runner.service) with real sockets in this process: requests
answered only for the secret, a flood beyond its capacity shed so that a rank still gets in, answers that
wait not holding up the others, and malformed requests answered with an error."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from hpcdl.common import handshake
from hpcdl.common.exceptions import HpcdlAuthError
from hpcdl.common.rendezvous import make_secret
from hpcdl.runner.service import SHED_GRACE_SECONDS, ServiceServer

SECRET = make_secret()


def respond(request: dict) -> dict:
    time.sleep(float(request.get("sleep", 0)))
    return {"echo": request}


@pytest.fixture
def server() -> Iterator[ServiceServer]:
    service = ServiceServer(SECRET, respond, "127.0.0.1", capacity=8)
    service.start()
    yield service
    service.stop()


def ask(server: ServiceServer, message: dict, secret: str = SECRET, timeout: float = 10) -> dict:
    return handshake.request(("127.0.0.1", server.port), secret, message, timeout, "the test service")


def test_only_the_secret_is_answered(server: ServiceServer) -> None:
    assert ask(server, {"op": "x"}) == {"echo": {"op": "x"}}
    with pytest.raises(HpcdlAuthError, match="does not accept this job's secret"):
        ask(server, {"op": "x"}, secret=make_secret())


def test_a_flood_beyond_capacity_is_shed_for_a_rank_that_answers(server: ServiceServer) -> None:
    idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(20)]
    try:
        started = time.monotonic()
        assert ask(server, {"op": "in"}) == {"echo": {"op": "in"}}
        assert time.monotonic() - started < SHED_GRACE_SECONDS + 3
    finally:
        for sock in idle:
            sock.close()


def test_an_answer_that_waits_holds_up_no_other(server: ServiceServer) -> None:
    slow = threading.Thread(target=ask, args=(server, {"sleep": 3}))
    slow.start()
    started = time.monotonic()
    assert ask(server, {"op": "quick"}) == {"echo": {"op": "quick"}}
    assert time.monotonic() - started < 2
    slow.join()


@pytest.mark.parametrize("header", [b"not json", b"[1, 2]"])
def test_a_malformed_request_gets_an_error(server: ServiceServer, header: bytes) -> None:
    sock, session = handshake.connect(("127.0.0.1", server.port), SECRET, header, 5, "the test service")
    with sock:
        answer = handshake.recv_frame(sock, session, 1 << 20, 5, "the test service")
    assert b"malformed request" in answer
