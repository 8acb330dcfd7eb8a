"""``hpcdl run`` inside Flux, PBS (Cray PALS), Cobalt (ALPS) and LSF allocations, which start ranks with
``flux run``, PALS ``mpiexec``, ``aprun``, ``jsrun`` or ``blaunch``. None of these exists here (no Flux
package for Debian 12, the others are vendor software), so a stand-in of each takes their place: it accepts
only the options hpcdl run should pass (as their documentation gives them), starts each task on its host
with the variables the real launcher sets, copies stdin as the real one does (Flux: to every task; the
others: to task 0 only), merges the tasks' output line by line and forwards signals. The hosts are separate
(virtual hosts: network namespaces with their own hostname, address and /etc/hosts, see ``virtual_hosts``);
``hpcdl run`` runs where it runs in such a job (the first node, or a service node: Cobalt's MOM node, LSF's
launch node), so the ranks meet at its rendezvous across hosts. The srun case runs against real Slurm in
test_runner_srun.py."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from virtual_hosts import VirtualHosts, missing_requirements

_MISSING = missing_requirements()
pytestmark = pytest.mark.skipif(_MISSING is not None, reason=f"no virtual hosts: {_MISSING}")

STAND_IN = r'''#!PYTHON
"""Stand-in for a scheduler's launcher (flux, mpiexec of PALS, aprun, jsrun, blaunch), named by argv[0]."""
import json, os, signal, subprocess, sys, threading

name = os.path.basename(sys.argv[0])
args = sys.argv[1:]
here = os.path.dirname(os.path.abspath(sys.argv[0]))
with open(os.path.join(here, name + ".argv"), "a") as log:
    log.write(json.dumps(args) + "\n")

def fail(message):
    sys.stderr.write(f"{name} (stand-in): {message}\n")
    sys.exit(2)

def options(argv, valued, flags=()):
    """Leading options (--opt=value or --opt value), the command after them."""
    found, i = {}, 0
    while i < len(argv) and argv[i].startswith("-"):
        key, eq, value = argv[i].partition("=")
        if key in valued:
            if not eq:
                i += 1
                value = argv[i]
            found[key] = value
        elif key in flags and not eq:
            found[key] = ""
        else:
            fail(f"unknown option {argv[i]}")
        i += 1
    if i == len(argv):
        fail("no command")
    return found, argv[i:]

def block(hosts, total, per_host):
    counts = [min(per_host, total - per_host * i) for i in range(len(hosts))]
    if sum(counts) != total or counts[-1] <= 0:
        fail(f"{total} tasks at {per_host} per host do not fill {len(hosts)} hosts")
    return counts

stdin_to_all = False
if name == "flux":
    if args[:2] == ["resource", "list"]:
        if args[2:] != ["-s", "up", "-no", "{nnodes} {ncores} {ngpus} {nodelist}"]:
            fail(f"flux resource list: unexpected arguments {args[2:]}")
        print(os.environ["STANDIN_FLUX_RESOURCES"])
        sys.exit(0)
    if args[:1] != ["run"]:
        fail("only 'flux run' and 'flux resource list' stand in here")
    opts, command = options(args[1:], {"--nodes", "--ntasks", "--tasks-per-node", "--requires", "--input"})
    hosts = opts["--requires"].removeprefix("hosts:").split(",")
    if int(opts["--nodes"]) != len(hosts):
        fail("--nodes differs from the hosts of --requires")
    if "--tasks-per-node" in opts:
        counts = [int(opts["--tasks-per-node"])] * len(hosts)
    else:
        total = int(opts["--ntasks"])
        counts = [total // len(hosts) + (i < total % len(hosts)) for i in range(len(hosts))]
    if opts.get("--input") != f"0-{sum(counts) - 1}" and opts.get("--input") != "0":
        fail(f"--input={opts.get('--input')} is not the idset of all tasks")
    stdin_to_all = True
    variables = lambda rank, local, size, node: {
        "FLUX_TASK_RANK": rank, "FLUX_TASK_LOCAL_ID": local, "FLUX_JOB_SIZE": size}
elif name == "mpiexec":
    if args == ["--version"]:
        print("mpiexec version 1.2.12")
        sys.exit(0)
    opts, command = options(args, {"-n", "--ppn", "--hosts"})
    hosts = opts["--hosts"].split(",")
    counts = block(hosts, int(opts["-n"]), int(opts["--ppn"]))
    variables = lambda rank, local, size, node: {
        "PALS_RANKID": rank, "PALS_LOCAL_RANKID": local, "PALS_NODEID": node, "PMI_RANK": rank,
        "PMI_SIZE": size, "PMI_LOCAL_RANK": local}
elif name == "aprun":
    opts, command = options(args, {"-n", "-N", "-L"})
    hosts = [f"nid{int(nid):05d}" for nid in opts["-L"].split(",")]
    counts = block(hosts, int(opts["-n"]), int(opts["-N"]))
    variables = lambda rank, local, size, node: {"ALPS_APP_PE": rank}
elif name == "jsrun":
    opts, command = options(args, {"--nrs", "--rs_per_host", "--tasks_per_rs", "--launch_distribution"})
    if opts["--tasks_per_rs"] != "1" or opts["--launch_distribution"] != "packed":
        fail("expected one task per resource set, packed")
    words = os.environ["LSB_MCPU_HOSTS"].split()
    hosts = words[2::2]  # the first entry is the launch node, where jsrun starts nothing
    counts = block(hosts[: -(-int(opts["--nrs"]) // int(opts["--rs_per_host"]))], int(opts["--nrs"]),
                   int(opts["--rs_per_host"]))
    variables = lambda rank, local, size, node: {
        "JSM_NAMESPACE_RANK": rank, "JSM_NAMESPACE_LOCAL_RANK": local, "JSM_NAMESPACE_SIZE": size}
elif name == "blaunch":
    if args[:1] != ["-no-shell"] or len(args) < 3:
        fail("expected blaunch -no-shell HOST COMMAND...")
    hosts, counts, command = [args[1]], [1], args[2:]
    variables = lambda rank, local, size, node: {}
else:
    fail("unknown launcher")

size = sum(counts)
anchors = json.loads(os.environ["STANDIN_HOSTS"])  # host name -> pid holding its namespaces
tasks, rank = [], 0
for node, (host, count) in enumerate(zip(hosts, counts)):
    for local in range(count):
        env = dict(os.environ)
        env.update({k: str(v) for k, v in variables(rank, local, size, node).items()})
        stdin = subprocess.PIPE if stdin_to_all or rank == 0 else subprocess.DEVNULL
        if host not in anchors:
            fail(f"no host named {host} in this allocation")
        on_host = ["nsenter", "-t", str(anchors[host]), "-n", "-u", "-m", f"--wd={os.getcwd()}", "--"]
        tasks.append(subprocess.Popen([*on_host, *command], env=env, stdin=stdin, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE))
        rank += 1

lock = threading.Lock()
def relay(pipe, out):
    for line in iter(pipe.readline, b""):
        with lock:
            out.write(line)
            out.flush()
relays = [threading.Thread(target=relay, args=(pipe, out)) for t in tasks
          for pipe, out in ((t.stdout, sys.stdout.buffer), (t.stderr, sys.stderr.buffer))]
for r in relays:
    r.start()

def feed():
    receivers = [t for t in tasks if t.stdin is not None]
    for line in iter(sys.stdin.buffer.readline, b""):
        for t in receivers:
            try:
                t.stdin.write(line); t.stdin.flush()
            except OSError:
                pass
    for t in receivers:
        t.stdin.close()
threading.Thread(target=feed, daemon=True).start()

def forward(signum, _frame):
    for t in tasks:
        if t.poll() is None:
            t.send_signal(signum)
for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(signum, forward)

codes = []
for t in tasks:
    code = t.wait()
    codes.append(128 - code if code < 0 else code)
    if code != 0:  # as the real launchers do: a failed task ends the application
        forward(signal.SIGTERM, None)
for r in relays:
    r.join()
sys.stdout.flush()
os._exit(max(codes))  # the stdin feeder may sit in a read
'''

REPORT = 'echo "$HPCDL_RANK $(hostname) $HPCDL_LOCAL_RANK $RANK $LOCAL_RANK $WORLD_SIZE"'

# The hosts of every allocation below: compute nodes, and the service nodes hpcdl run starts on where it
# does not run on the first compute node (Cobalt's MOM node, LSF's launch node).
FLUX_NODES = ["node1", "node2"]
PALS_NODES = ["x3001c0s1b0n0", "x3001c0s1b1n0"]
COBALT_NODES, COBALT_MOM = ["nid00012", "nid00013"], "thetamom1"
CSM_NODES, CSM_LAUNCH = ["a01n01", "a01n02"], "batch3"
LSF_NODES = ["lsf1", "lsf2"]
HOSTS = [*FLUX_NODES, *PALS_NODES, *COBALT_NODES, COBALT_MOM, *CSM_NODES, CSM_LAUNCH, *LSF_NODES]
_FOREIGN = ("SLURM_", "PBS_", "LSB_", "COBALT_", "FLUX_")


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VirtualHosts]:
    with VirtualHosts(tmp_path_factory.mktemp("hosts"), HOSTS, ssh=False) as made:
        yield made


@pytest.fixture
def stand_ins(tmp_path: Path):
    """install(*names): stand-ins named so on a PATH directory of their own, first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()

    def install(*names: str) -> Path:
        for name in names:
            program = bin_dir / name
            program.write_text(STAND_IN.replace("#!PYTHON", "#!" + sys.executable, 1))
            program.chmod(0o755)
        return bin_dir

    return install


def allocation_env(hosts: VirtualHosts, bin_dir: Path, allocation: dict[str, str]) -> dict[str, str]:
    """This environment without another scheduler's variables, plus the allocation's, the stand-ins first on
    PATH, and where each host's namespaces are (for the stand-ins)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_FOREIGN)}
    anchors = {name: hosts[name].anchor for name in hosts.names}
    return {**env, **allocation, "PATH": f"{bin_dir}:{env['PATH']}", "STANDIN_HOSTS": json.dumps(anchors)}


def run_in_allocation(
    hosts: VirtualHosts, bin_dir: Path, on: str, allocation: dict[str, str], args: list[str]
) -> subprocess.CompletedProcess:
    """``hpcdl run ARGS`` on host `on`, inside the allocation described by `allocation`."""
    argv = [sys.executable, "-m", "hpcdl", "run", *args]
    return hosts.run(on, argv, env=allocation_env(hosts, bin_dir, allocation), timeout=120)


def recorded(bin_dir: Path, name: str) -> list[list[str]]:
    return [json.loads(line) for line in (bin_dir / f"{name}.argv").read_text().splitlines()]


def launcher_part(argv: list[str]) -> list[str]:
    """The launcher's own options: everything before the task command (python -m hpcdl.runner...)."""
    return argv[: argv.index(sys.executable)]


def reports(stdout: str) -> list[str]:
    return sorted(line.split(":", 1)[1] for line in stdout.splitlines() if line.startswith("["))


def two_by_two(nodes: list[str]) -> list[str]:
    return sorted(f"{r} {nodes[r // 2]} {r % 2} {r} {r % 2} 4" for r in range(4))


def test_flux_allocation_runs_one_flux_run_step(hosts: VirtualHosts, stand_ins) -> None:
    bin_dir = stand_ins("flux")
    allocation = {"FLUX_JOB_ID": "f2Kq9Lf5", "STANDIN_FLUX_RESOURCES": "2 4 0 node[1-2]"}
    done = run_in_allocation(hosts, bin_dir, "node1", allocation, ["--verbose", "--", "sh", "-c", REPORT])
    assert done.returncode == 0, done.stderr
    assert (
        "4 ranks on node1:2, node2:2 (hosts from the Flux allocation (flux resource list); launcher flux)"
        in (done.stderr)
    )
    assert f"rendezvous at {hosts['node1'].address}:" in done.stderr  # where node2's ranks reach node1
    assert reports(done.stdout) == two_by_two(FLUX_NODES)
    calls = recorded(bin_dir, "flux")
    assert calls[0] == ["resource", "list", "-s", "up", "-no", "{nnodes} {ncores} {ngpus} {nodelist}"]
    assert launcher_part(calls[1]) == [
        "run", "--nodes=2", "--tasks-per-node=2", "--requires=hosts:node1,node2", "--input=0-3",
    ]  # fmt: skip


ALLREDUCE = (
    "import socket, numpy as np, hpcdl.common as c; c.init(); y = c.allreduce(np.array([c.rank() + 1.0])); "
    "print(c.rank(), socket.gethostname(), float(y[0]), flush=True); c.shutdown()"
)


def test_pbs_with_pals_runs_one_mpiexec_step_and_ranks_meet(
    hosts: VirtualHosts, stand_ins, tmp_path: Path
) -> None:
    bin_dir = stand_ins("mpiexec")
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("".join(f"{node}\n{node}\n" for node in PALS_NODES))  # one line per mpiprocs slot
    allocation = {"PBS_NODEFILE": str(nodefile)}
    done = run_in_allocation(hosts, bin_dir, PALS_NODES[0], allocation, ["python3", "-c", ALLREDUCE])
    assert done.returncode == 0, done.stderr
    assert reports(done.stdout) == [f"{r} {PALS_NODES[r // 2]} 10.0" for r in range(4)]
    calls = recorded(bin_dir, "mpiexec")
    assert calls[0] == ["--version"]  # auto: is this mpiexec PALS'?
    assert launcher_part(calls[1]) == ["-n", "4", "--ppn", "2", "--hosts", ",".join(PALS_NODES)]


def test_cobalt_allocation_runs_aprun_from_the_mom_node_and_a_failing_rank_is_named(
    hosts: VirtualHosts, stand_ins, tmp_path: Path
) -> None:
    bin_dir = stand_ins("aprun")
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("\n".join(COBALT_NODES) + "\n")
    allocation = {"COBALT_NODEFILE": str(nodefile), "COBALT_JOBID": "4321"}
    args = ["--slots-per-host", "2", "--", "python3", "-c", ALLREDUCE]
    done = run_in_allocation(hosts, bin_dir, COBALT_MOM, allocation, args)
    assert done.returncode == 0, done.stderr
    assert reports(done.stdout) == [f"{r} {COBALT_NODES[r // 2]} 10.0" for r in range(4)]  # none on the MOM
    assert launcher_part(recorded(bin_dir, "aprun")[0]) == ["-n", "4", "-N", "2", "-L", "12,13"]

    fail = 'if [ "$HPCDL_RANK" = 2 ]; then echo "rank 2 gives up" >&2; exit 3; fi; sleep 30'
    started = time.monotonic()
    args = ["--slots-per-host", "2", "--", "sh", "-c", fail]
    done = run_in_allocation(hosts, bin_dir, COBALT_MOM, allocation, args)
    assert done.returncode == 3, done.stderr
    assert "hpcdl run: rank 2 on host nid00013 exited with code 3" in done.stderr
    assert "    rank 2 gives up" in done.stderr
    assert time.monotonic() - started < 20


def test_lsf_with_csm_runs_jsrun_on_the_compute_nodes(hosts: VirtualHosts, stand_ins) -> None:
    bin_dir = stand_ins("jsrun", "blaunch")
    allocation = {"LSB_JOBID": "77", "LSB_MCPU_HOSTS": f"{CSM_LAUNCH} 1 a01n01 2 a01n02 2"}
    done = run_in_allocation(hosts, bin_dir, CSM_LAUNCH, allocation, ["--", "python3", "-c", ALLREDUCE])
    assert done.returncode == 0, done.stderr
    # none on the launch node, where hpcdl run runs
    assert reports(done.stdout) == [f"{r} {CSM_NODES[r // 2]} 10.0" for r in range(4)]
    assert launcher_part(recorded(bin_dir, "jsrun")[0]) == [
        "--nrs", "4", "--rs_per_host", "2", "--tasks_per_rs", "1", "--launch_distribution", "packed",
    ]  # fmt: skip


def test_lsf_without_csm_starts_each_rank_with_blaunch(hosts: VirtualHosts, stand_ins) -> None:
    bin_dir = stand_ins("blaunch")
    allocation = {"LSB_JOBID": "78", "LSB_MCPU_HOSTS": "lsf1 2 lsf2 2"}
    done = run_in_allocation(hosts, bin_dir, "lsf1", allocation, ["--", "python3", "-c", ALLREDUCE])
    assert done.returncode == 0, done.stderr
    assert reports(done.stdout) == [f"{r} {LSF_NODES[r // 2]} 10.0" for r in range(4)]
    calls = sorted(launcher_part(call) for call in recorded(bin_dir, "blaunch"))
    assert calls == [["-no-shell", "lsf1"]] * 2 + [["-no-shell", "lsf2"]] * 2


def test_ctrl_c_reaches_the_ranks_of_a_step(hosts: VirtualHosts, stand_ins, tmp_path: Path) -> None:
    """Flux copies stdin to every task: the launcher's Ctrl-C travels as a control line to each agent."""
    bin_dir = stand_ins("flux")
    waiter = tmp_path / "wait.py"
    waiter.write_text(
        "import os, time\n"
        "open(os.path.join(os.environ['OUT'], os.environ['HPCDL_RANK']), 'w').close()\n"
        "try:\n    time.sleep(60)\n"
        "except KeyboardInterrupt:\n    print('rank', os.environ['HPCDL_RANK'], 'got SIGINT', flush=True)\n"
    )
    out = tmp_path / "started"
    out.mkdir()
    allocation = {"FLUX_JOB_ID": "f3x", "STANDIN_FLUX_RESOURCES": "2 4 0 node[1-2]", "OUT": str(out)}
    launcher = hosts.popen(
        "node1", [sys.executable, "-m", "hpcdl", "run", "python3", str(waiter)],
        env=allocation_env(hosts, bin_dir, allocation), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while len(list(out.iterdir())) < 4 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(list(out.iterdir())) == 4, "the ranks did not start"
        launcher.send_signal(signal.SIGINT)  # nsenter execs: this is hpcdl run
        stdout, stderr = launcher.communicate(timeout=30)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert launcher.returncode == 130, stderr
    assert sorted(re.findall(r"rank \d got SIGINT", stdout)) == [f"rank {r} got SIGINT" for r in range(4)]
    assert "hpcdl run received SIGINT; stopped all ranks" in stderr


def test_placement_a_block_launcher_cannot_express_is_refused(
    hosts: VirtualHosts, stand_ins, tmp_path: Path
) -> None:
    bin_dir = stand_ins("aprun")
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("\n".join(COBALT_NODES) + "\n")
    done = run_in_allocation(
        hosts, bin_dir, COBALT_MOM, {"COBALT_NODEFILE": str(nodefile)},
        ["-H", "nid00012:1,nid00013:2", "true"],
    )  # fmt: skip
    assert done.returncode == 2
    assert "--launcher aprun cannot place the ranks as nid00012:1,nid00013:2" in done.stderr
    assert not (bin_dir / "aprun.argv").exists()
