"""What the ranks' TCP connections are set to, read back from the real sockets of two ranks over TCP.

The send buffer of data connections: 192 KiB unless HPCDL_TCP_SEND_BUFFER_BYTES or ``hpcdl run
--tcp-send-buffer-bytes`` says otherwise (Linux reports twice the size asked for, its bookkeeping included);
the other connections (the engine's doorbells, the rendezvous) keep their 4 MiB. The congestion control of
the connections between ranks: cubic unless HPCDL_TCP_CONGESTION or ``--tcp-congestion`` names another, or
``system`` keeps the system's default (which the connection to the rendezvous always has); a name the system
does not offer is a warning, and the system's default."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from runner_helpers import hpcdl_run, rank_lines

RANK = str(Path(__file__).with_name("tcp_connections_rank.py"))
SYSTEM = Path("/proc/sys/net/ipv4/tcp_congestion_control").read_text().strip()


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


def congestion_of(options: tuple[str, ...], env: dict[str, str]) -> tuple[list[list[str]], str]:
    """Each rank's connections' congestion control, and what the job wrote to stderr."""
    done, _ = hpcdl_run(*options, "-np", "2", sys.executable, RANK, HPCDL_TRANSPORT="tcp", **env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    names = []
    for rank in range(2):
        lines = rank_lines(done.stdout, rank)
        (line,) = [line for line in lines if line.startswith("CONGESTION")]
        names.append(line.split()[1:])
        (uses,) = [line.split()[1] for line in lines if line.startswith("USES")]
        assert names[-1].count(uses) >= 6, (uses, names[-1])  # hpcdl.common.tcp_congestion() tells the truth
    return names, done.stderr


@pytest.mark.parametrize(
    ("options", "env", "asked"),
    [
        ((), {}, "cubic"),
        ((), {"HPCDL_TCP_CONGESTION": "reno"}, "reno"),
        (("--tcp-congestion", "reno"), {}, "reno"),
        ((), {"HPCDL_TCP_CONGESTION": "system"}, SYSTEM),
    ],
)
def test_tcp_connections_congestion_control(
    options: tuple[str, ...], env: dict[str, str], asked: str
) -> None:
    names, _ = congestion_of(options, env)
    for mine in names:
        # the data connection and doorbell of each of three channels to the peer, at least
        assert mine.count(asked) >= 6, mine
        assert set(mine) <= {asked, SYSTEM}, mine  # the rendezvous connection: the system's


def test_a_congestion_control_the_system_lacks_is_a_warning() -> None:
    names, stderr = congestion_of((), {"HPCDL_TCP_CONGESTION": "no-such-algorithm"})
    assert all(set(mine) == {SYSTEM} for mine in names), names
    assert "TCP congestion control 'no-such-algorithm' (HPCDL_TCP_CONGESTION) is not available" in stderr, (
        stderr
    )
    assert f"its connections use '{SYSTEM}'" in stderr, stderr
