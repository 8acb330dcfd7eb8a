"""Stand-ins for the launchers of schedulers that cannot run here (``flux run``, HPE PALS ``mpiexec``, Cray
``aprun``, LSF's ``jsrun`` and ``blaunch``): each accepts only the options their documentation gives (jsrun
also in the short forms batch scripts write), starts each task on its host of :mod:`virtual_hosts` with the
variables the real launcher sets, copies stdin as the real one does (Flux: to every task; the others: to
task 0 only), merges the tasks' output line by line, forwards signals and ends the application when a task
fails. Each records its command lines in ``NAME.argv`` beside itself."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from virtual_hosts import VirtualHosts

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
    long = {"-n": "--nrs", "-r": "--rs_per_host", "-a": "--tasks_per_rs", "-c": "--cpu_per_rs",
            "-g": "--gpu_per_rs", "-b": "--bind", "-d": "--launch_distribution"}
    opts, command = options(args, {*long, *long.values()})
    opts = {long.get(key, key): value for key, value in opts.items()}
    if opts["--tasks_per_rs"] != "1" or opts.get("--launch_distribution", "packed") != "packed":
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


def install(bin_dir: Path, *names: str) -> Path:
    """The stand-ins `names` in `bin_dir` (made if needed), to put first on PATH."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name in names:
        program = bin_dir / name
        program.write_text(STAND_IN.replace("#!PYTHON", "#!" + sys.executable, 1))
        program.chmod(0o755)
    return bin_dir


def recorded(bin_dir: Path, name: str) -> list[list[str]]:
    """The command lines stand-in `name` was called with, in order."""
    return [json.loads(line) for line in (bin_dir / f"{name}.argv").read_text().splitlines()]


_FOREIGN = ("SLURM_", "PBS_", "LSB_", "COBALT_", "FLUX_")


def allocation_env(hosts: VirtualHosts, bin_dir: Path, allocation: Mapping[str, str]) -> dict[str, str]:
    """This environment without another scheduler's variables, plus the allocation's, the stand-ins first on
    PATH, and where each host's namespaces are (for the stand-ins)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_FOREIGN)}
    anchors = {name: hosts[name].anchor for name in hosts.names}
    return {**env, **allocation, "PATH": f"{bin_dir}:{env['PATH']}", "STANDIN_HOSTS": json.dumps(anchors)}
