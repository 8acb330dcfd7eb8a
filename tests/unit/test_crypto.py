"""The runtime's own SHA-256 and HMAC-SHA-256 (collectives/src/crypto/), which authenticate every rank and
data connection: published known answers, agreement with Python's hashlib/hmac on random inputs, and a
kernel that cannot give random bytes being an error with a message, not an endless loop."""

from __future__ import annotations

import errno
import hashlib
import hmac
import random
import subprocess
from pathlib import Path

import pytest
from native_programs import build_program


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    output = tmp_path_factory.mktemp("crypto") / "crypto_test"
    return build_program("crypto_test.cpp", ["crypto/sha256.cpp"], output)


def run(program: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(program), *args], input=stdin, capture_output=True, text=True, timeout=60, check=False
    )


def test_fips_180_4_and_rfc_4231_known_answers(program: Path) -> None:
    done = run(program, "known-answers")
    lines = done.stdout.splitlines()
    assert [line for line in lines if not line.startswith("ok ")] == [], done.stdout + done.stderr
    assert sum("sha256" in line for line in lines) == 5
    assert sum("rfc4231 case" in line for line in lines) == 7
    assert done.returncode == 0


def _lengths() -> list[int]:
    """Message and key lengths around every padding and block edge of SHA-256 (55/56, 63/64/65, 119/120,
    127/128), plus random ones."""
    edges = [0, 1, 31, 32, 33, 55, 56, 57, 63, 64, 65, 119, 120, 127, 128, 129, 200, 1000, 4096 + 3]
    rng = random.Random(26)
    return edges + [rng.randrange(0, 3000) for _ in range(60)]


def test_agrees_with_python_hashlib_and_hmac_on_random_inputs(program: Path) -> None:
    rng = random.Random(4231)
    cases = []
    for size in _lengths():
        key = rng.randbytes(rng.choice([0, 1, 20, 32, 63, 64, 65, 131, rng.randrange(0, 300)]))
        cases.append((key, rng.randbytes(size)))
    stdin = "".join(f"{key.hex() or '-'} {message.hex() or '-'}\n" for key, message in cases)
    done = run(program, "interop", stdin=stdin)
    assert done.returncode == 0, done.stderr
    got = [line.split() for line in done.stdout.splitlines()]
    expected = [
        [hashlib.sha256(message).hexdigest(), hmac.new(key, message, hashlib.sha256).hexdigest()]
        for key, message in cases
    ]
    assert len(got) == len(cases)
    mismatches = [(len(k), len(m)) for (k, m), a, b in zip(cases, got, expected) if a != b]
    assert mismatches == [], f"(key length, message length) where the runtime disagrees: {mismatches}"


def test_random_bytes_are_drawn(program: Path) -> None:
    done = run(program, "draw")
    assert done.returncode == 0, done.stdout + done.stderr
    first, second = done.stdout.split()
    assert len(first) == len(second) == 64 and first != second


@pytest.mark.parametrize("code", [errno.ENOSYS, errno.EPERM, errno.EINTR])
def test_getrandom_failure_is_an_error_with_a_message(program: Path, code: int) -> None:
    # the old loop retried without end: the deadline of this run is the test of "no endless loop"
    done = run(program, "blocked", str(code))
    if done.stdout.startswith("skip:"):
        pytest.skip(done.stdout.strip())
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("error: cannot draw random bytes from the kernel: getrandom failed")
    assert "seccomp" in done.stdout
