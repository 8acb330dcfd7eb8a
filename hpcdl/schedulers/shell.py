"""Values in batch scripts. A script is a shell program: a value that reached it unquoted, or with a line
break, could run a command as the job's owner. Every value hpcdl writes into a script passes here once:

- :func:`check_value` refuses control characters in any value (a newline ends a directive line and starts
  a command);
- :func:`check_directive_value` also refuses whitespace and a leading ``-`` in values that stand inside a
  scheduler directive (``#SBATCH --account=VALUE``), where the scheduler splits its options at whitespace;
- :func:`shell_word` makes a value one shell word (single-quoted unless plainly safe), for every value the
  shell itself reads (``export``, ``module load``, sweep points), and :func:`quote` a command line of such
  words (the launch line, the helpers the script runs). The template only lays these words out: it never
  puts one inside double quotes, where ``$(...)`` would still run.

Setup lines (``--setup``, ``setup:`` in a site file) and the job's command are not values: they are the
user's (or the site's) own shell by design, and run as written.
"""

from __future__ import annotations

import re
import shlex

from hpcdl.schedulers.errors import JobSpecError

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def check_value(value: str, what: str) -> str:
    """``value`` when it holds no control character; JobSpecError naming ``what`` otherwise."""
    found = _CONTROL.search(value)
    if found:
        raise JobSpecError(
            f"{what} {value!r} contains the control character {found.group()!r}, which would break the "
            "batch script's lines; remove it"
        )
    return value


def check_directive_value(value: str, what: str) -> str:
    """A value inside a scheduler directive: no control character, no whitespace, no leading '-'."""
    check_value(value, what)
    if re.search(r"\s", value) or value.startswith("-"):
        raise JobSpecError(
            f"{what} {value!r} cannot stand in a scheduler directive: it may not contain spaces or start "
            "with '-' (the scheduler would read another option there)"
        )
    return value


def shell_word(value: str, what: str) -> str:
    """``value`` as exactly one shell word, after :func:`check_value`."""
    return shlex.quote(check_value(value, what))


def quote(argv: list[str]) -> str:
    """A command line whose every argument is one shell word."""
    return " ".join(shlex.quote(a) for a in argv)
