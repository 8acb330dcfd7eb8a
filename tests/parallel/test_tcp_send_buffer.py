"""The send buffer of TCP data connections: 192 KiB unless HPCDL_TCP_SEND_BUFFER_BYTES or ``hpcdl run
--tcp-send-buffer-bytes`` says otherwise, read back from the real sockets of two ranks over TCP (Linux reports
twice the size asked for, its bookkeeping included). The other connections (the engine's doorbells, the
rendezvous) keep their 4 MiB."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from runner_helpers import hpcdl_run, rank_lines

RANK = str(Path(__file__).with_name("tcp_send_buffer_rank.py"))


@pytest.mark.parametrize(
    ("options", "env", "asked"),
    [
        ((), {}, 192 << 10),
        ((), {"HPCDL_TCP_SEND_BUFFER_BYTES": "300000"}, 300000),
        (("--tcp-send-buffer-bytes", "100000"), {}, 100000),
        ((), {"HPCDL_TCP_SEND_BUFFER_BYTES": "0"}, 4 << 20),
    ],
)
def test_tcp_data_connections_send_buffer(options: tuple[str, ...], env: dict[str, str], asked: int) -> None:
    done, _ = hpcdl_run(*options, "-np", "2", sys.executable, RANK, HPCDL_TRANSPORT="tcp", **env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for rank in range(2):
        (line,) = [line for line in rank_lines(done.stdout, rank) if line.startswith("SNDBUF")]
        sizes = [int(size) for size in line.split()[1:]]
        assert sizes.count(2 * asked) >= 1, sizes  # this process's data connection(s) to its peer
        assert set(sizes) <= {2 * asked, 8 << 20}, sizes  # every other connection keeps 4 MiB
