"""A real Slurm cluster on this machine for the integration tests, whose nodes are separate hosts.

Every node is a host of :mod:`virtual_hosts` (a network namespace with its own hostname, address and
``/etc/hosts``) running one ``slurmd``; the ``login`` host runs slurmctld and is where jobs are submitted
from (``cluster.run``). Jobs see node names that resolve to the nodes' own addresses, so a rank on
``node2`` reaches ``node1`` as on a real cluster, and ``ssh node2`` works from every host. The daemons
listen on Slurm's default ports inside the cluster's private network, so no port is picked at run time
(none can be taken in between). Munge runs privately on its own socket, fake GPUs are gres on ``mknod``
character devices (Slurm only stat()s them, then sets CUDA_VISIBLE_DEVICES), and state, logs and spool
live under one directory. Needs root and the Debian packages slurmctld, slurmd, slurm-client and munge.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import virtual_hosts
from virtual_hosts import VirtualHosts

START_TIMEOUT_S = 60.0
FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL"}
LOGIN = "login"
CTLD_PORT, SLURMD_PORT = 6817, 6818


def missing_requirements() -> Optional[str]:
    """Why this machine cannot run the cluster, or None."""
    if os.geteuid() != 0:
        return "the Slurm test cluster runs its daemons as root"
    for program in ("slurmctld", "slurmd", "sbatch", "munged", "mungekey"):
        if shutil.which(program) is None and not Path(f"/usr/sbin/{program}").exists():
            return f"{program} is not installed (apt-get install slurmctld slurmd slurm-client munge)"
    return virtual_hosts.missing_requirements()


def _program(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


@dataclass
class SlurmCluster:
    base: Path
    nodes: int = 2
    gpus_per_node: int = 2
    cpus_per_node: int = field(default_factory=lambda: os.cpu_count() or 1)
    features: str = "fast"
    pbs_plugin: bool = False  # spank_pbs.so from slurm-wlm-torque: PBS_* variables in jobs
    hosts: Optional[VirtualHosts] = None
    pids: dict[str, Path] = field(default_factory=dict)
    controller_down: bool = False

    @property
    def conf(self) -> Path:
        return self.base / "etc" / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """This process's environment for Slurm commands: SLURM_CONF set, no variables of an outer job."""
        clean = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SALLOC_"))}
        return {**clean, "SLURM_CONF": str(self.outage_conf if self.controller_down else self.conf)}

    @property
    def outage_conf(self) -> Path:
        """slurm.conf with a short MessageTimeout, for the commands run while slurmctld is stopped: they
        fail with Slurm's own "Unable to contact slurm controller" after 2 s instead of retrying for 18."""
        return self.base / "etc" / "slurm-outage.conf"

    @property
    def node_names(self) -> list[str]:
        return [f"node{i}" for i in range(1, self.nodes + 1)]

    # ---- lifecycle --------------------------------------------------------------------------------
    def start(self) -> SlurmCluster:
        try:
            for sub in ("etc", "state", "run", "log", "spool", "tmp", "dev", "munge"):
                (self.base / sub).mkdir(parents=True, exist_ok=True)
            for node in self.node_names:
                (self.base / "spool" / node).mkdir(exist_ok=True)
                (self.base / "tmp" / node).mkdir(exist_ok=True)
            self.hosts = VirtualHosts(self.base / "hosts", [LOGIN, *self.node_names]).start()
            self._start_munge()
            self._write_config()
            self._daemon(LOGIN, "slurmctld", [_program("slurmctld"), "-f", str(self.conf)])
            for node in self.node_names:
                self._daemon(node, f"slurmd-{node}", [_program("slurmd"), "-f", str(self.conf), "-N", node])
            self._wait_nodes_idle()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the Slurm daemons, munged and the hosts (whatever outlives SIGTERM is killed)."""
        slurm = [pid for name, path in self.pids.items() if name != "munged" and (pid := _pid(path))]
        _terminate(slurm)
        if self.hosts is not None:
            self.hosts.stop()
        munged = _pid(self.pids["munged"]) if "munged" in self.pids else None
        _terminate([munged] if munged else [])
        self.pids.clear()

    @contextlib.contextmanager
    def controller_stopped(self) -> Iterator[None]:
        """slurmctld stopped for the block (an outage of the controller), then started again from its saved
        state, with the nodes answering again, before the block's end returns."""
        _terminate([pid] if (pid := _pid(self.pids["slurmctld"])) else [])
        self.outage_conf.write_text(self.conf.read_text() + "MessageTimeout=2\n")
        self.controller_down = True
        try:
            yield
        finally:
            self.controller_down = False
            self._daemon(LOGIN, "slurmctld", [_program("slurmctld"), "-f", str(self.conf)])
            self._wait_nodes_idle()

    # ---- pieces -----------------------------------------------------------------------------------
    @property
    def socket(self) -> Path:
        return self.base / "munge" / "munge.socket"

    def _start_munge(self) -> None:
        key = self.base / "munge" / "munge.key"
        subprocess.run([_program("mungekey"), "-c", "-f", "-k", str(key)], check=True, capture_output=True)
        key.chmod(0o400)
        pid_file = self.base / "munge" / "munged.pid"
        subprocess.run(
            [
                _program("munged"),
                "--force",
                f"--socket={self.socket}",
                f"--key-file={key}",
                f"--pid-file={pid_file}",
                f"--log-file={self.base / 'log' / 'munged.log'}",
                f"--seed-file={self.base / 'munge' / 'munged.seed'}",
            ],
            check=True,
            capture_output=True,
            timeout=30,
        )
        self.pids["munged"] = pid_file

    def _write_config(self) -> None:
        assert self.hosts is not None
        gres_types = gres = ""
        if self.gpus_per_node:
            for index in range(self.gpus_per_node):
                device = self.base / "dev" / f"nvidia{index}"
                if not device.exists():
                    try:
                        os.mknod(device, 0o666 | stat.S_IFCHR, os.makedev(195, index))
                    except PermissionError:
                        # Without CAP_MKNOD: jobs still get gpu:N, but Slurm sets no CUDA_VISIBLE_DEVICES.
                        device.touch()
            files = f"{self.base}/dev/nvidia[0-{self.gpus_per_node - 1}]"
            (self.base / "etc" / "gres.conf").write_text(
                f"NodeName=node[1-{self.nodes}] Name=gpu File={files}\n"
            )
            gres_types, gres = "GresTypes=gpu", f"Gres=gpu:{self.gpus_per_node}"
        plugin = Path("/usr/lib/x86_64-linux-gnu/slurm-wlm/spank_pbs.so")
        plugstack = f"required {plugin}\n" if self.pbs_plugin and plugin.exists() else ""
        (self.base / "etc" / "plugstack.conf").write_text(plugstack)
        nodes = "\n".join(
            f"NodeName={name} NodeHostname={name} NodeAddr={self.hosts[name].address} Port={SLURMD_PORT} "
            f"Sockets=1 CoresPerSocket={self.cpus_per_node} ThreadsPerCore=1 RealMemory=2000 {gres} "
            f"Feature={self.features} State=UNKNOWN"
            for name in self.node_names
        )
        self.conf.write_text(
            f"""ClusterName=hpcdltest
SlurmctldHost={LOGIN}({self.hosts[LOGIN].address})
SlurmctldPort={CTLD_PORT}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.socket}
StateSaveLocation={self.base}/state
SlurmdSpoolDir={self.base}/spool/%n
TmpFS={self.base}/tmp/%n
SlurmctldPidFile={self.base}/run/slurmctld.pid
SlurmdPidFile={self.base}/run/slurmd-%n.pid
SlurmctldLogFile={self.base}/log/slurmctld.log
SlurmdLogFile={self.base}/log/slurmd-%n.log
PlugStackConfig={self.base}/etc/plugstack.conf
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=sched_min_interval=0,batch_sched_delay=0
MpiDefault=none
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=300
KillWait=5
Waittime=0
{gres_types}
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
{nodes}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
        )

    def _daemon(self, host: str, name: str, argv: list[str]) -> None:
        """Start a daemon on `host` (it forks into the background and writes its pid file)."""
        done = self.run(argv, host=host, timeout=30)
        if done.returncode != 0:
            raise RuntimeError(
                f"{name} did not start on {host}: {done.stderr.strip()}; see {self.base / 'log'}"
            )
        self.pids[name] = self.base / "run" / f"{name}.pid"

    def _wait_nodes_idle(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        states = ""
        while time.monotonic() < deadline:
            done = self.run(["sinfo", "-h", "-N", "-o", "%N %T"], timeout=10)
            states = done.stdout.strip()
            ready = [
                line for line in states.splitlines() if line.split()[-1] in ("idle", "mixed", "allocated")
            ]
            if len(ready) == self.nodes:
                return
            time.sleep(0.2)
        logs = "\n".join(p.read_text()[-800:] for p in sorted((self.base / "log").glob("slurm*.log")))
        raise RuntimeError(f"Slurm nodes not idle within {START_TIMEOUT_S:.0f}s (sinfo: {states!r}):\n{logs}")

    # ---- helpers for tests ------------------------------------------------------------------------
    def run(
        self,
        argv: Sequence[str],
        cwd: Optional[Path] = None,
        timeout: float = 60,
        env: Optional[Mapping[str, str]] = None,
        host: str = LOGIN,
    ) -> subprocess.CompletedProcess[str]:
        """Run `argv` on `host` (default: the login host) with the cluster's environment plus `env`."""
        assert self.hosts is not None, "start() the cluster first"
        return self.hosts.run(host, argv, env={**self.env, **(env or {})}, cwd=cwd, timeout=timeout)

    def popen(
        self,
        argv: Sequence[str],
        cwd: Optional[Path] = None,
        env: Optional[Mapping[str, str]] = None,
        host: str = LOGIN,
        **kwargs: Any,
    ) -> subprocess.Popen:
        """`argv` running on `host` (default: the login host), as ``run`` starts it, without waiting for it;
        its pid is the program's own (nsenter execs it), and stop() kills it if it still runs."""
        assert self.hosts is not None, "start() the cluster first"
        return self.hosts.popen(host, argv, cwd=cwd, env={**self.env, **(env or {})}, **kwargs)

    def job_field(self, job_id: str, name: str) -> str:
        out = self.run(["scontrol", "-o", "show", "job", job_id]).stdout
        match = re.search(rf"\b{name}=(\S*)", out)
        return match.group(1) if match else ""

    def wait_state(self, job_id: str, states: set[str], timeout: float = 60) -> str:
        """Poll until the job is in one of ``states``; the state, or AssertionError naming what was seen."""
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            state = self.job_field(job_id, "JobState")
            if state in states:
                return state
            time.sleep(0.2)
        raise AssertionError(f"job {job_id} not in {sorted(states)} within {timeout:.0f}s (last: {state!r})")

    def wait_done(self, job_id: str, timeout: float = 60) -> str:
        return self.wait_state(job_id, FINAL_STATES, timeout)


# A stand-in for Cray PALS's mpiexec (which only exists on HPE systems): the same options, carried out by
# srun, with the PALS_* and PMI_* rank variables PALS sets. Only the launcher is stood in; Slurm's own #PBS
# front end reads the directives and runs the script.
_PALS_MPIEXEC = r"""#!/bin/bash
set -e
args=(); env=()
while [ $# -gt 0 ]; do
  case "$1" in
    -n) args+=(--ntasks="$2"); shift 2 ;;
    --ppn) args+=(--ntasks-per-node="$2"); shift 2 ;;
    --depth) args+=(--cpus-per-task="$2"); shift 2 ;;
    --cpu-bind) shift 2 ;;
    --env) env+=("$2"); shift 2 ;;
    -*) echo "pals mpiexec stand-in: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
for kv in "${env[@]}"; do export "$kv"; done
pals='export PALS_RANKID=$SLURM_PROCID PALS_LOCAL_RANKID=$SLURM_LOCALID PMI_RANK=$SLURM_PROCID \
  PMI_SIZE=$SLURM_NTASKS PMI_LOCAL_RANK=$SLURM_LOCALID; exec "$@"'
exec srun "${args[@]}" bash -c "$pals" pals "$@"
"""


def pals_mpiexec(directory: Path) -> Path:
    """`directory` holding the stand-in for PALS's ``mpiexec``; put it first on a job's PATH."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "mpiexec").write_text(_PALS_MPIEXEC)
    (directory / "mpiexec").chmod(0o755)
    return directory


@contextlib.contextmanager
def running_cluster(base: Path, **settings: Any) -> Iterator[SlurmCluster]:
    """A started cluster, stopped when the block ends (also on failure)."""
    cluster = SlurmCluster(base, **settings)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def _pid(pid_file: Path) -> Optional[int]:
    try:
        return int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None


def _terminate(pids: list[int], grace: float = 20.0) -> None:
    """SIGTERM the processes together; SIGKILL whatever is still alive after `grace` seconds."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(0.05)
    for pid in pids:
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
