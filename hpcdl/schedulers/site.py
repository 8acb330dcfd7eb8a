"""Site configuration: the defaults and limits of one cluster, from YAML files.

Files are merged key by key; later ones win: ``/etc/hpcdl/site.yaml`` < ``~/.config/hpcdl/site.yaml`` <
``$HPCDL_SITE`` < an explicit ``--site FILE``. Unknown keys, wrong types and requests beyond the site's
limits are errors that list what is valid.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Optional

import yaml

from hpcdl import platforms
from hpcdl.schedulers.errors import JobSpecError, SiteConfigError
from hpcdl.schedulers.job import (
    DEFAULT_PYTHON_ORIGIN,
    JobSpec,
    SignalSpec,
    default_python,
    format_clock,
    parse_walltime,
)
from hpcdl.schedulers.shell import check_directive_value, check_value

SYSTEM_SITE_FILE = Path("/etc/hpcdl/site.yaml")

# key -> (type, meaning); the single source for validation and for the error listing valid keys.
SCHEMA: dict[str, tuple[type, str]] = {
    "scheduler": (str, f"auto or one of {', '.join(platforms.scheduler_names())}"),
    "account": (str, "account / project charged"),
    "partition": (str, "partition or queue"),
    "qos": (str, "quality of service"),
    "constraint": (str, "node feature constraint"),
    "gpus_per_node": (int, "GPUs on one node (the default request and the limit)"),
    "cpus_per_node": (int, "CPU cores on one node (limit; default CPUs per rank = this / ranks per node)"),
    "max_nodes": (int, "most nodes one job may ask for"),
    "walltime": (str, "default walltime"),
    "max_walltime": (str, "longest walltime a job may ask for"),
    "modules": (list, "modules loaded before the launch"),
    "setup": (list, "shell lines run before the launch"),
    "env": (dict, "environment variables set for every rank"),
    "launcher_args": (list, "extra arguments for the scheduler's launcher"),
    "extra_directives": (list, "extra scheduler directives, without their prefix (#SBATCH ...)"),
    "pbs_chunk_resources": (list, "site-defined PBS chunk resources such as system=polaris"),
    "python": (
        str,
        "interpreter of hpcdl's helpers and of a COMMAND ending in .py in batch jobs (default: the one hpcdl "
        "runs in)",
    ),
    "checkpoint_signal": (str, "warning signal of --checkpoint jobs, SIG@SECONDS (default: the scheduler's)"),
}


class _SiteLoader(yaml.SafeLoader):
    """YAML 1.1 without sexagesimal numbers: ``walltime: 1:30:00`` stays a string, not 5400."""


_SiteLoader.yaml_implicit_resolvers = {
    first: [
        (tag, regexp)
        for tag, regexp in resolvers
        if tag not in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")
    ]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_SiteLoader.add_implicit_resolver("tag:yaml.org,2002:int", re.compile(r"^[-+]?[0-9]+$"), list("-+0123456789"))
_SiteLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?([0-9]+\.[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$"),
    list("-+.0123456789"),
)


def _site_files(explicit: Optional[Path]) -> list[Path]:
    """Candidate files in merge order (lowest precedence first)."""
    files = [SYSTEM_SITE_FILE, Path.home() / ".config" / "hpcdl" / "site.yaml"]
    if os.environ.get("HPCDL_SITE"):
        files.append(Path(os.environ["HPCDL_SITE"]))
    if explicit is not None:
        files.append(explicit)
    return files


@dataclass
class SiteConfig:
    scheduler: str = "auto"
    account: Optional[str] = None
    partition: Optional[str] = None
    qos: Optional[str] = None
    constraint: Optional[str] = None
    gpus_per_node: Optional[int] = None
    cpus_per_node: Optional[int] = None
    max_nodes: Optional[int] = None
    walltime: str = "01:00:00"
    max_walltime: Optional[str] = None
    modules: list[str] = field(default_factory=list)
    setup: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    launcher_args: list[str] = field(default_factory=list)
    extra_directives: list[str] = field(default_factory=list)
    pbs_chunk_resources: list[str] = field(default_factory=list)
    python: Optional[str] = None
    checkpoint_signal: Optional[str] = None
    sources: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_mapping(cls, data: Any, source: str) -> SiteConfig:
        return cls().merged(data, source)

    def merged(self, data: Any, source: str) -> SiteConfig:
        """A copy with ``data`` (one parsed file) laid over this config; validates as it goes."""
        if data is None:
            return self
        if not isinstance(data, dict):
            raise SiteConfigError(f"{source}: a site file must be a YAML mapping of keys to values")
        unknown = sorted(set(data) - set(SCHEMA))
        if unknown:
            listing = "\n".join(f"  {key}: {meaning}" for key, (_, meaning) in SCHEMA.items())
            raise SiteConfigError(
                f"{source}: unknown key(s) {', '.join(unknown)}; valid keys are:\n{listing}"
            )
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values["sources"] = dict(self.sources)
        for key, value in data.items():
            expected, meaning = SCHEMA[key]
            if expected is str and isinstance(value, (int, float)) and not isinstance(value, bool):
                value = str(value)
            if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
                raise SiteConfigError(
                    f"{source}: {key} must be a {expected.__name__} ({meaning}), got {value!r}"
                )
            values[key] = value
            values["sources"][key] = source
        config = SiteConfig(**values)
        config._check_values()
        return config

    def _check_values(self) -> None:
        names = platforms.scheduler_names()
        if self.scheduler not in ("auto", *names):
            raise SiteConfigError(
                f"{self.origin('scheduler')}: scheduler {self.scheduler!r} is not known; "
                f"use auto or one of {', '.join(names)}"
            )
        for key in ("gpus_per_node", "cpus_per_node", "max_nodes"):
            value = getattr(self, key)
            if value is not None and value < (0 if key == "gpus_per_node" else 1):
                raise SiteConfigError(f"{self.origin(key)}: {key} must be positive, got {value}")
        for key in ("walltime", "max_walltime"):
            value = getattr(self, key)
            if value is not None:
                try:
                    parse_walltime(value)
                except Exception as exc:
                    raise SiteConfigError(f"{self.origin(key)}: {key}: {exc}") from None
        for key in ("modules", "setup", "launcher_args", "extra_directives", "pbs_chunk_resources"):
            if not all(isinstance(item, str) for item in getattr(self, key)):
                raise SiteConfigError(f"{self.origin(key)}: every entry of {key} must be a string")
        # Directives go into the script as written (the site's own), but no line break may start a command.
        for key, check in (("extra_directives", check_value), ("pbs_chunk_resources", check_directive_value)):
            for item in getattr(self, key):
                try:
                    check(item, f"{key} entry")
                except JobSpecError as exc:
                    raise SiteConfigError(f"{self.origin(key)}: {exc}") from None
        self.env = {str(k): str(v) for k, v in self.env.items()}
        if self.checkpoint_signal is not None:
            try:
                SignalSpec.parse(self.checkpoint_signal)
            except JobSpecError as exc:
                raise SiteConfigError(
                    f"{self.origin('checkpoint_signal')}: checkpoint_signal: {exc}"
                ) from None

    def origin(self, key: str) -> str:
        return self.sources.get(key, "site configuration")

    def python_choice(self, requested: Optional[str] = None) -> tuple[str, str]:
        """(interpreter, why) of a batch job's Python: ``requested`` (``--python``), else the site's
        ``python:``, else the interpreter hpcdl runs in."""
        if requested:
            return requested, "chosen with --python"
        if self.python:
            return self.python, f"python: in {self.origin('python')}"
        return default_python(), DEFAULT_PYTHON_ORIGIN

    def make_job(self, command: list[str], **requested: Any) -> JobSpec:
        """A JobSpec from the command-line values given (``None`` = not given), with the site's defaults."""
        given = {key: value for key, value in requested.items() if value is not None}
        python, origin = self.python_choice(given.pop("python", None))
        site_defaults = {
            "account": self.account,
            "partition": self.partition,
            "qos": self.qos,
            "constraint": self.constraint,
            "walltime": self.walltime,
            "python": python,
            "python_origin": given.pop("python_origin", origin),
            "gpus_per_node": self.gpus_per_node or 0,
        }
        settings = {k: v for k, v in site_defaults.items() if v is not None}
        settings.update(given)
        settings["modules"] = [*self.modules, *given.get("modules", [])]
        settings["setup"] = [*self.setup, *given.get("setup", [])]
        settings["env"] = {**self.env, **given.get("env", {})}
        settings["launcher_args"] = [*self.launcher_args, *given.get("launcher_args", [])]
        job = JobSpec(command=list(command), **settings)
        if job.cpus_per_rank is None and self.cpus_per_node:
            job.cpus_per_rank = max(1, self.cpus_per_node // job.resolved_ranks_per_node)
        job.validate()
        self.check(job)
        return job

    def check(self, job: JobSpec) -> None:
        """Refuse requests the site cannot satisfy, saying what it has."""
        if self.gpus_per_node is not None and job.gpus_per_node > self.gpus_per_node:
            raise SiteConfigError(
                f"{job.gpus_per_node} GPUs per node requested, but nodes here have {self.gpus_per_node} "
                f"({self.origin('gpus_per_node')}); ask for 0-{self.gpus_per_node}"
            )
        if self.max_nodes is not None and job.nodes > self.max_nodes:
            raise SiteConfigError(
                f"{job.nodes} nodes requested, but jobs here may use at most {self.max_nodes} "
                f"({self.origin('max_nodes')}); ask for 1-{self.max_nodes}"
            )
        if self.cpus_per_node is not None:
            used = job.resolved_ranks_per_node * job.resolved_cpus_per_rank
            if used > self.cpus_per_node:
                raise SiteConfigError(
                    f"{job.resolved_ranks_per_node} ranks x {job.resolved_cpus_per_rank} CPUs = {used} "
                    f"CPUs per node, but nodes here have {self.cpus_per_node} "
                    f"({self.origin('cpus_per_node')}); "
                    "lower --ranks-per-node or --cpus-per-rank"
                )
        if self.max_walltime is not None:
            limit = parse_walltime(self.max_walltime)
            if job.walltime_seconds > limit:
                raise SiteConfigError(
                    f"walltime {job.walltime} is longer than this site allows ({format_clock(limit)}, "
                    f"{self.origin('max_walltime')}); ask for at most {format_clock(limit)}"
                )


def load_site(explicit: Optional[Path] = None) -> SiteConfig:
    """Merge the site files that exist; a missing explicit or ``HPCDL_SITE`` file is an error."""
    config = SiteConfig()
    named = {explicit, Path(os.environ["HPCDL_SITE"]) if os.environ.get("HPCDL_SITE") else None}
    for path in _site_files(explicit):
        if not path.is_file():
            if path in named:
                raise SiteConfigError(f"site file {path} does not exist; fix the path or unset HPCDL_SITE")
            continue
        try:
            data = yaml.load(path.read_text(), Loader=_SiteLoader)
        except (OSError, yaml.YAMLError) as exc:
            raise SiteConfigError(f"{path}: cannot read it as YAML: {exc}") from None
        config = config.merged(data, str(path))
    return config
