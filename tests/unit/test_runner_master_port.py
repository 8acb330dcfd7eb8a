"""torch.distributed's MASTER_ADDR/MASTER_PORT under ``hpcdl run``: the port is held free on rank 0's host
from the moment it is chosen (real sockets), and the board through which rank 0's agent publishes it when
rank 0 runs on another host."""

from __future__ import annotations

import socket
import threading

import pytest

from hpcdl.common import handshake
from hpcdl.runner.board import BoardServer
from hpcdl.runner.hosts import HostSlots, assign_ranks
from hpcdl.runner.launch import torch_master
from hpcdl.runner.rank_agent import board_request, learn_master_port, reserve_port

SECRET = "ab" * 32


def test_a_held_port_is_given_to_nobody_else_but_torch_can_listen_on_it() -> None:
    holder = reserve_port()
    port = holder.getsockname()[1]
    try:
        plain = socket.socket()
        with pytest.raises(OSError, match="Address already in use"):
            plain.bind(("0.0.0.0", port))  # what a program that picked the port a moment later would do
        plain.close()
        chosen = set()
        for _ in range(2000):  # bind(port 0), the usual way to pick a free port, never hands it out
            with socket.socket() as probe:
                probe.bind(("", 0))
                chosen.add(probe.getsockname()[1])
        assert port not in chosen
        with socket.socket() as store:  # torch.distributed's TCPStore sets SO_REUSEADDR, then listens
            store.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            store.bind(("0.0.0.0", port))
            store.listen()
            with socket.create_connection(("127.0.0.1", port), timeout=5):
                pass
    finally:
        holder.close()


def test_rank0_publishes_its_port_and_the_others_wait_for_it() -> None:
    board = BoardServer(SECRET, "127.0.0.1", 4)
    address = f"127.0.0.1:{board.port}"
    try:
        learned: list[int] = []
        waiter = threading.Thread(target=lambda: learned.append(learn_master_port(address, SECRET, 1, 10)[1]))
        waiter.start()
        holder, port = learn_master_port(address, SECRET, 0, 10)
        waiter.join(timeout=10)
        assert holder is not None and holder.getsockname()[1] == port
        assert learned == [port]
        holder.close()
        with pytest.raises(OSError, match="does not accept this job's secret"):
            board_request(handshake, address, "cd" * 32, {"op": "get", "key": "MASTER_PORT", "wait": 1}, 5)
        with pytest.raises(OSError, match=r"nobody published OTHER within 0\.2 s"):
            board_request(handshake, address, SECRET, {"op": "get", "key": "OTHER", "wait": 0.2}, 5)
    finally:
        board.stop()


def test_a_stopped_board_ends_every_wait() -> None:
    board = BoardServer(SECRET, "127.0.0.1", 4)
    address = f"127.0.0.1:{board.port}"
    errors: list[Exception] = []

    def wait() -> None:
        try:
            learn_master_port(address, SECRET, 2, 60)
        except OSError as exc:
            errors.append(exc)

    waiting = threading.Event()  # the waiter's request has reached the board (not merely been started)
    get = board.board.get

    def noted_get(key: str, wait: float) -> str | None:
        waiting.set()
        return get(key, wait)

    board.board.get = noted_get  # type: ignore[method-assign]
    waiter = threading.Thread(target=wait)
    waiter.start()
    assert waiting.wait(30)
    board.stop()
    waiter.join(timeout=10)
    assert not waiter.is_alive() and len(errors) == 1


SLOTS = assign_ranks([HostSlots("node1", 2), HostSlots("node2", 2)], 4)


def test_rank0_here_gets_a_port_held_by_the_launcher() -> None:
    master = torch_master(SLOTS, {"node1"}, {}, "10.0.0.1", SECRET)
    try:
        assert master.env["MASTER_ADDR"] == "10.0.0.1" and master.env["WORLD_SIZE"] == "4"
        assert master.holder is not None and master.env["MASTER_PORT"] == str(master.holder.getsockname()[1])
        assert master.board is None
    finally:
        master.stop()


def test_rank0_elsewhere_publishes_through_the_board() -> None:
    master = torch_master(SLOTS, {"node2"}, {}, "127.0.0.1", SECRET)  # the address the ranks reach us at
    try:
        assert master.env == {"MASTER_ADDR": "node1", "WORLD_SIZE": "4"}
        assert master.holder is None and master.board_address == f"127.0.0.1:{master.board.port}"
    finally:
        master.stop()


def test_what_the_user_set_is_kept() -> None:
    master = torch_master(SLOTS, {"node2"}, {"MASTER_PORT": "29500", "WORLD_SIZE": "4"}, "10.0.0.2", SECRET)
    assert master.env == {"MASTER_ADDR": "node1"} and master.board is None and master.holder is None
    master = torch_master(SLOTS, {"node1"}, {"MASTER_ADDR": "node1-ib"}, "10.0.0.1", SECRET)
    try:
        assert set(master.env) == {"MASTER_PORT", "WORLD_SIZE"}
    finally:
        master.stop()
