"""Run real ranks for the multi-rank tests: through ``hpcdl run``, ``mpirun``/``mpiexec``, or by hand.

``run_ranks(np, code_or_script)`` starts ``np`` ranks of a Python program (inline code or a script path)
and returns one :class:`RankResult` per rank: its exit code, its own stdout/stderr lines and the JSON
object it printed on a line ``RESULT <json>`` (see :func:`result_line`). Launchers:

- ``"hpcdl"``: ``python -m hpcdl run -np N`` (the way users launch);
- ``"openmpi"`` / ``"mpich"``: ``mpirun.openmpi`` / ``mpiexec.mpich`` (ranks meet through Open MPI's
  library with Open MPI; over TCP through MASTER_ADDR/MASTER_PORT and an exported HPCDL_SECRET with MPICH);
- ``"mpich-mpi"``: ``mpiexec.mpich`` without MASTER_ADDR: the ranks meet through MPICH's library;
- ``"manual"``: the env contract set by hand with an in-process rendezvous server; lets a test give each
  rank its own environment (``rank_env``), e.g. a different HPCDL_HOSTNAME to simulate hosts, and see
  every rank's exit code and pid.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from hpcdl.common.rendezvous import RendezvousServer, make_secret

OPENMPI = "/usr/bin/mpirun.openmpi"
MPICH = "/usr/bin/mpiexec.mpich"
_MPI_ENV = {"OMPI_MCA_btl_tcp_if_include": "lo", "OMPI_MCA_oob_tcp_if_include": "lo"}


@dataclass
class RankResult:
    rank: int
    returncode: Optional[int]  # None when the launcher reports only the job's code (see job_returncode)
    stdout: str
    stderr: str
    result: Any = None  # the JSON of the rank's "RESULT ..." line
    job_returncode: int = 0
    extra: dict = field(default_factory=dict)


def result_line(obj: Any) -> str:
    """What a rank prints to hand a result back: ``print(result_line(obj), flush=True)``."""
    return "RESULT " + json.dumps(obj)


def _script(code_or_script: str, workdir: Path) -> str:
    if code_or_script.endswith(".py") and "\n" not in code_or_script and Path(code_or_script).is_file():
        return str(Path(code_or_script).resolve())
    path = workdir / "rank_program.py"
    path.write_text(code_or_script)
    return str(path)


def _parse_result(text: str) -> Any:
    found = None
    decoder = json.JSONDecoder()
    for line in text.splitlines():
        at = line.find("RESULT ")
        if at >= 0:  # launchers may glue another rank's output to the end of a line
            found, _ = decoder.raw_decode(line[at + len("RESULT ") :])
    return found


def _split_tagged(text: str, pattern: str, np: int) -> dict[int, list[str]]:
    lines: dict[int, list[str]] = {r: [] for r in range(np)}
    regex = re.compile(pattern)
    for line in text.splitlines():
        match = regex.match(line)
        if match:
            lines.setdefault(int(match.group("rank")), []).append(line[match.end() :])
    return lines


def _read(directory: Optional[Path], name: str) -> str:
    path = directory / name if directory else None
    return path.read_text(errors="replace") if path and path.is_file() else ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _base_env(env: Optional[dict]) -> dict:
    out = dict(os.environ)
    for key in list(out):  # never inherit a launcher's identity from the test runner
        if key.startswith(
            (
                "HPCDL_RANK",
                "HPCDL_SIZE",
                "OMPI_",
                "PMI_",
                "SLURM_",
                "HOROVOD_",
                "PBS_",
                "LSB_",
                "COBALT_",
                "FLUX_",
            )
        ) or key in (
            "RANK",
            "WORLD_SIZE",
            "LOCAL_RANK",
            "MASTER_ADDR",
            "MASTER_PORT",
        ):
            del out[key]
    out.update(_MPI_ENV)
    out.update(env or {})
    return out


def run_ranks(
    np: int,
    code_or_script: str,
    env: Optional[dict] = None,
    timeout: float = 120.0,
    launcher: str = "hpcdl",
    rank_env: Optional[Callable[[int], dict]] = None,
    args: tuple[str, ...] = (),
) -> list[RankResult]:
    """Run ``np`` ranks of a program and collect what each printed; raises TimeoutError on a hang."""
    workdir = Path(tempfile.mkdtemp(prefix="hpcdl-ranks-"))
    try:
        script = _script(code_or_script, workdir)
        base = _base_env(env)
        if launcher == "manual":
            return _run_manual(np, script, base, timeout, rank_env, args)
        if launcher == "hpcdl":
            cmd = [sys.executable, "-m", "hpcdl", "run", "-np", str(np), sys.executable, script, *args]
            pattern = r"\[(?P<rank>\d+)\]<(?:stdout|stderr)>:"
        elif launcher == "openmpi":
            # per-rank files: --tag-output may glue lines of different ranks together
            cmd = [
                OPENMPI,
                "--allow-run-as-root",
                "--oversubscribe",
                "--output-filename",
                str(workdir / "out"),
            ]
            cmd += ["-np", str(np), sys.executable, script, *args]
            pattern = ""
        elif launcher in ("mpich", "mpich-mpi"):
            if launcher == "mpich":
                base.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), HPCDL_SECRET=make_secret())
            # per-rank files here too: -prepend-rank output can glue lines of different ranks together
            cmd = [MPICH, "-np", str(np), "-outfile-pattern", str(workdir / "rank.%r.stdout")]
            cmd += ["-errfile-pattern", str(workdir / "rank.%r.stderr"), sys.executable, script, *args]
            pattern = ""
        else:
            raise ValueError(f"unknown launcher {launcher!r}")
        try:
            proc = subprocess.run(cmd, env=base, capture_output=True, text=True, timeout=timeout, cwd=workdir)
        except subprocess.TimeoutExpired as exc:
            raise TimeoutError(
                f"{launcher} ranks did not finish within {timeout} s: {exc.stdout}\n{exc.stderr}"
            ) from None
        if launcher == "openmpi":
            files = {int(d.name.split(".")[1]): d for d in (workdir / "out").glob("*/rank.*")}
            out = {r: _read(files.get(r), "stdout").splitlines() for r in range(np)}
            err = {r: _read(files.get(r), "stderr").splitlines() for r in range(np)}
        elif launcher in ("mpich", "mpich-mpi"):
            out = {r: _read(workdir, f"rank.{r}.stdout").splitlines() for r in range(np)}
            err = {r: _read(workdir, f"rank.{r}.stderr").splitlines() for r in range(np)}
        else:
            out = _split_tagged(proc.stdout, pattern, np)
            err = _split_tagged(proc.stderr, pattern, np)
        if launcher == "hpcdl":  # hpcdl run tags stderr lines on its own stderr
            for r, lines in _split_tagged(
                proc.stdout + "\n" + proc.stderr, r"\[(?P<rank>\d+)\]<stderr>:", np
            ).items():
                err[r] = lines
        results = []
        for r in range(np):
            stdout = "\n".join(out.get(r, []))
            results.append(
                RankResult(
                    r,
                    None,
                    stdout,
                    "\n".join(err.get(r, [])) or proc.stderr,
                    _parse_result(stdout),
                    proc.returncode,
                    {"launcher_stdout": proc.stdout, "launcher_stderr": proc.stderr},
                )
            )
        return results
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _run_manual(
    np: int,
    script: str,
    base: dict,
    timeout: float,
    rank_env: Optional[Callable[[int], dict]],
    args: tuple[str, ...],
) -> list[RankResult]:
    secret = make_secret()
    with RendezvousServer(np, secret, host="127.0.0.1") as server:
        procs = []
        for r in range(np):
            env = dict(base)
            env.update(
                HPCDL_RANK=str(r),
                HPCDL_SIZE=str(np),
                HPCDL_RENDEZVOUS_ADDR="127.0.0.1",
                HPCDL_RENDEZVOUS_PORT=str(server.port),
                HPCDL_SECRET=secret,
            )
            if rank_env:
                env.update(rank_env(r))
            procs.append(
                subprocess.Popen(
                    [sys.executable, script, *args],
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        results = []
        for r, p in enumerate(procs):
            try:
                stdout, stderr = p.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                raise TimeoutError(f"rank {r} did not finish within {timeout} s") from None
            results.append(
                RankResult(
                    r, p.returncode, stdout, stderr, _parse_result(stdout), p.returncode, {"pid": p.pid}
                )
            )
        return results
