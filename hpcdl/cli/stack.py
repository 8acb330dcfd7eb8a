"""``hpcdl stack``: resolve, detect, check and build MPI/CUDA/cuDNN/NCCL/PyTorch stacks from recipes."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

import typer
from rich.filesize import decimal

from hpcdl.common import progress
from hpcdl.common.exceptions import HpcdlError
from hpcdl.common.output_file import write_output_file
from hpcdl.common.sizes import parse_size
from hpcdl.modules.render import FORMATS
from hpcdl.modules.stack_modules import parse_compiler, write_stack_modules
from hpcdl.stack.builder import Builder, BuildOptions, BuildProgress, PackageStep
from hpcdl.stack.check import Finding, check, has_errors
from hpcdl.stack.detect import Detection, detect, detect_driver
from hpcdl.stack.fetch import DEFAULT_MAX_DOWNLOAD_BYTES, Transfer
from hpcdl.stack.lockfile import dump_lock, load_lock, lock_from_solution, render_spack, render_table
from hpcdl.stack.recipe import load_recipes
from hpcdl.stack.resolver import Resolver
from hpcdl.stack.spec import parse_request
from hpcdl.stack.tables import builtin_tables

stack_app = typer.Typer(
    help="Consistent MPI/CUDA/cuDNN/NCCL/PyTorch stacks: resolve, detect, check, build.",
    no_args_is_help=True,
    rich_markup_mode=None,
)

_RECIPES_HELP = "Extra recipe directory (repeatable; also HPCDL_RECIPES=DIR:DIR); overrides built-in recipes."


def _fail(command: str, exc: Exception) -> typer.Exit:
    typer.echo(f"hpcdl stack {command}: error: {exc}", err=True)
    return typer.Exit(2)


def _write_output(text: str, output: Optional[Path], force: bool) -> None:
    if output is None:
        typer.echo(text, nl=False)
        return
    write_output_file(output, "output", text, replace=force, mode=0o666)
    typer.echo(f"wrote {output}", err=True)


@stack_app.command("resolve")
def resolve_command(
    specs: list[str] = typer.Argument(
        ..., help="Specs such as cuda@12.4 pytorch@2.5 openmpi+cuda mpi=openmpi."
    ),
    driver: Optional[str] = typer.Option(
        None, "--driver", help="NVIDIA driver to fit (default: this machine's)."
    ),
    python: Optional[str] = typer.Option(None, "--python", help="Python version to fit (default: this one)."),
    output_format: str = typer.Option("table", "--format", "-f", help="table | lock | spack"),
    output: Optional[Path] = typer.Option(
        None, "--output", "-o", help="Write to this file instead of stdout."
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite --output if it exists."),
    recipes_dirs: list[Path] = typer.Option([], "--recipes", help=_RECIPES_HELP),
) -> None:
    """Pick one consistent set of versions, newest first, fitting the driver; explain conflicts."""
    if output_format not in ("table", "lock", "spack"):
        raise _fail("resolve", HpcdlError(f"--format {output_format}: choose table, lock or spack"))
    try:
        request = parse_request(specs)
        recipes = load_recipes(recipes_dirs)
        fitted_driver = driver if driver is not None else detect_driver()[0]
        solution = Resolver(recipes, builtin_tables(), fitted_driver, python).resolve(request)
        lock = lock_from_solution(solution)
        if output_format == "table":
            text = render_table(lock, solution.notes)
        elif output_format == "lock":
            text = dump_lock(lock, solution.notes)
        else:
            text = render_spack(lock, recipes)
        _write_output(text, output, force)
    except HpcdlError as exc:
        raise _fail("resolve", exc) from None


def _tool_lines(found: Detection) -> list[str]:
    lines = []
    if found.default_mpirun:
        mpirun = found.default_mpirun
        lines.append(f"mpirun      {mpirun.name} {mpirun.version}  ({mpirun.path})")
    if found.mpi4py:
        mpi = f"{found.mpi4py.detail['mpi']} {found.mpi4py.detail['mpi_version']}"
        lines.append(f"mpi4py      {found.mpi4py.version}  built with {mpi}")
    else:
        lines.append("mpi4py      not installed")
    if found.torch:
        d = found.torch.detail
        libs = f"cuda={d['cuda']} cudnn={d['cudnn']} nccl={d['nccl']} gpu={d['cuda_available']}"
        lines.append(f"torch       {found.torch.version}  {libs}")
    else:
        lines.append("torch       not installed")
    h = found.hpcdl
    if h["loaded"]:
        mpi = h["mpi_detail"] or f"no ({h['mpi_reason']})"
        features = " ".join(name for name, on in h["features"].items() if on)
        lines.append(
            f"hpcdl       {h['version']}  runtime {h['library']}; built with: {features}; MPI: {mpi}"
        )
    else:
        lines.append(f"hpcdl       runtime does not load: {h['load_error']}")
    return lines


def _render_detection(found: Detection) -> str:
    gpus = f"  GPUs: {', '.join(found.gpus)}" if found.gpus else ""
    lines = [
        f"python      {found.python}",
        f"driver      {found.driver or 'none (no nvidia-smi answer)'}{gpus}",
    ]
    for label, items in (("cuda", found.cuda_toolkits), ("cudnn", found.cudnn), ("nccl", found.nccl)):
        if not items:
            lines.append(f"{label:<11} none found")
        for item in items:
            lines.append(f"{label:<11} {item.version}  {item.path}  ({item.how})")
    for mpi in found.mpis:
        extra = "  ".join(f"{k}={v}" for k, v in mpi.detail.items())
        lines.append(f"mpi         {mpi.name} {mpi.version}  {mpi.path}  {extra}".rstrip())
    if not found.mpis:
        lines.append("mpi         none found")
    lines += _tool_lines(found)
    lines.append(f"modules     {' '.join(found.loaded_modules) or 'none loaded'}")
    lines += [f"problem     {p}" for p in found.problems]
    return "\n".join(lines) + "\n"


@stack_app.command("detect")
def detect_command(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Show what this machine has: driver, CUDA, cuDNN, NCCL, MPIs, mpi4py, PyTorch, hpcdl, modules."""
    found = detect()
    typer.echo(
        json.dumps(found.to_dict(), indent=2) if as_json else _render_detection(found), nl=not as_json or True
    )


def _render_findings(findings: list[Finding]) -> str:
    marks = {"error": "ERROR", "warning": "WARN", "info": "info", "ok": "ok"}
    lines = []
    for f in findings:
        lines.append(f"[{marks[f.severity]:<5}] {f.part}: {f.message}")
        if f.cause:
            lines.append(f"        cause: {f.cause}")
        if f.fix:
            lines.append(f"        fix:   {f.fix}")
    errors = sum(f.severity == "error" for f in findings)
    warnings = sum(f.severity == "warning" for f in findings)
    lines.append(f"{errors} error(s), {warnings} warning(s)")
    return "\n".join(lines) + "\n"


@stack_app.command("check")
def check_command(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Hold what is installed against the compatibility tables; exit 1 when something is broken."""
    try:
        findings = check(detect(), builtin_tables())
    except HpcdlError as exc:
        raise _fail("check", exc) from None
    if as_json:
        typer.echo(
            json.dumps(
                {"ok": not has_errors(findings), "findings": [f.to_dict() for f in findings]}, indent=2
            )
        )
    else:
        typer.echo(_render_findings(findings), nl=False)
    raise typer.Exit(1 if has_errors(findings) else 0)


class _BuildDisplay:
    """Draws a build's progress on one bar: packages done of all, elapsed, ETA; while a download runs,
    its file, bytes and rate in the description. Lines go above the bar (or plainly to stderr)."""

    def __init__(self, bar: progress.Bar):
        self.bar = bar
        self.package = ""

    def step(self, step: PackageStep) -> None:
        self.package = f"[{step.index}/{step.total}] {step.label}"
        self.bar.update(
            completed=step.finished, total=step.total, description=f"{self.package}: {step.phase}"
        )

    def transfer(self, transfer: Transfer) -> None:
        size = (
            f"{decimal(transfer.received)}/{decimal(transfer.total)}"
            if transfer.total
            else decimal(transfer.received)
        )
        rate = f"{decimal(int(transfer.rate))}/s"
        self.bar.update(description=f"{self.package}: {transfer.filename} {size} at {rate}")
        if transfer.finished:
            resumed = f", resumed after {decimal(transfer.resumed_from)}" if transfer.resumed_from else ""
            self.bar.log(
                f"    fetched {transfer.filename}: {decimal(transfer.received)} in {transfer.elapsed:.1f} s "
                f"({rate}{resumed})"
            )

    def listener(self) -> BuildProgress:
        return BuildProgress(message=self.bar.log, step=self.step, transfer=self.transfer)


@stack_app.command("build")
def build_command(
    lockfile: Path = typer.Argument(
        ..., help="Lockfile from `hpcdl stack resolve ... --format lock -o FILE`."
    ),
    prefix: Path = typer.Option(..., "--prefix", help="Install root: PREFIX/<name>/<version>-<hash>."),
    mirror: Optional[str] = typer.Option(None, "--mirror", help="Directory or URL holding the source files."),
    jobs: int = typer.Option(os.cpu_count() or 1, "--jobs", "-j", min=1, help="Parallel build jobs."),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Show what would be fetched and run; change nothing."
    ),
    force: bool = typer.Option(
        False, "--force", help="Rebuild installed packages and replace foreign directories."
    ),
    no_verify: bool = typer.Option(
        False, "--no-verify", help="Accept sources whose sha256 the recipe lacks."
    ),
    max_download: str = typer.Option(
        str(DEFAULT_MAX_DOWNLOAD_BYTES >> 30) + "G",
        "--max-download",
        envvar="HPCDL_STACK_MAX_DOWNLOAD",
        help="Largest file a download may be (e.g. 8G, 500M); larger ones are refused.",
    ),
    no_modules: bool = typer.Option(False, "--no-modules", help="Do not write modulefiles afterwards."),
    compiler: Optional[str] = typer.Option(None, "--compiler", help="Compiler module name, e.g. gcc/12."),
    recipes_dirs: list[Path] = typer.Option([], "--recipes", help=_RECIPES_HELP),
    no_progress: bool = typer.Option(False, "--no-progress", help=progress.NO_PROGRESS_HELP),
) -> None:
    """Fetch, verify, build and install a lockfile's packages, then write their modulefiles."""
    try:
        recipes = load_recipes(recipes_dirs)
        lock = load_lock(lockfile)
        options = BuildOptions(
            prefix,
            mirror,
            jobs,
            dry_run,
            force,
            verify=not no_verify,
            max_download_bytes=parse_size(max_download),
        )
        with progress.bar("stack build", None, no_progress=no_progress) as bar:
            report = Builder(lock, recipes, options, _BuildDisplay(bar).listener()).run()
        if dry_run:
            typer.echo(f"dry run: nothing changed under {prefix}")
            return
        built, skipped = " ".join(report.built) or "nothing", " ".join(report.skipped) or "nothing"
        typer.echo(f"built: {built}; already installed: {skipped}")
        if not no_modules:
            cc = parse_compiler(compiler) if compiler else None
            root = prefix.resolve() / "modulefiles"
            written = write_stack_modules(lock, recipes, prefix, root, FORMATS, force, cc)
            typer.echo(f"modulefiles: {sum(w.changed for w in written)} written under {root}")
            typer.echo(f"use them with: module use {root / 'lmod' / 'Core'}   (Tcl: {root / 'tcl' / 'Core'})")
    except HpcdlError as exc:
        raise _fail("build", exc) from None


@stack_app.command("recipes")
def recipes_command(recipes_dirs: list[Path] = typer.Option([], "--recipes", help=_RECIPES_HELP)) -> None:
    """List the recipes (built-in and yours) after checking every one against the schema."""
    try:
        recipes = load_recipes(recipes_dirs)
    except HpcdlError as exc:
        raise _fail("recipes", exc) from None
    for recipe in recipes.values():
        versions = ", ".join(v.version for v in recipe.versions)
        typer.echo(f"{recipe.name:<10} {recipe.build.system:<9} {versions}  ({recipe.path})")


def register(app: typer.Typer) -> None:
    """Add this group's commands to the root app."""
    app.add_typer(stack_app, name="stack")
