"""No native call reads or writes outside a tensor's storage, proven under AddressSanitizer.

The runtime is built again with ``-fsanitize=address`` and loaded in place of the installed one
(``HPCDL_LIBRARY``), with the sanitizer's runtime preloaded into Python: every tensor torch allocates
then has poisoned red zones around it and stays poisoned for a while after it is freed, so a read past a
tensor's end (an expanded or strided view passed as if it were dense) or of a staged copy that was
already freed is reported and fails the rank. The ranks run the layout and gradient checks of
``test_torch_conformance`` (every layout through every collective and form).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from test_torch_conformance import EXPECTED, run_checks

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not shutil.which("cmake") or not shutil.which("ninja"), reason="needs cmake and ninja"
    ),
]


def _sanitizer_runtime() -> str:
    compiler = shutil.which("c++") or shutil.which("g++") or "c++"
    found = subprocess.run(
        [compiler, "-print-file-name=libasan.so"], capture_output=True, text=True
    ).stdout.strip()
    if not found or not Path(found).exists():
        pytest.skip(f"the compiler ({compiler}) has no AddressSanitizer runtime (libasan.so)")
    return str(Path(found).resolve())


@pytest.fixture(scope="module")
def asan_runtime(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The collectives built with AddressSanitizer (without MPI: the ranks meet over TCP)."""
    build = tmp_path_factory.mktemp("asan-build")
    flags = "-fsanitize=address -fno-omit-frame-pointer -g"
    configure = [
        "cmake", "-S", str(ROOT / "collectives"), "-B", str(build), "-G", "Ninja",
        "-DCMAKE_BUILD_TYPE=Debug", "-DHPCDL_WITH_MPI=OFF",
        f"-DCMAKE_CXX_FLAGS={flags}", "-DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=address",
    ]  # fmt: skip
    for command in (configure, ["ninja", "-C", str(build)]):
        done = subprocess.run(command, capture_output=True, text=True, timeout=1200)
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return build / "_collectives.so"


def test_every_layout_and_gradient_stays_inside_its_storage(asan_runtime: Path) -> None:
    env = dict(
        os.environ,
        HPCDL_LIBRARY=str(asan_runtime),
        LD_PRELOAD=_sanitizer_runtime(),
        # Python and torch keep memory until exit on purpose: leaks are not what this test looks for.
        ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:quarantine_size_mb=256",
    )
    expected = EXPECTED[: EXPECTED.index("check_gradients") + 1]
    output = run_checks(2, ("layouts", "autograd"), expected, env=env)
    assert "AddressSanitizer" not in output, output[-8000:]
