"""Plain help that reads at 80 columns, with a command's options under the titles of their panels.

Every ``hpcdl`` Typer app turns rich help off (``rich_markup_mode=None``): rich's four-column boxes cut
option names and choices short in a narrow terminal. Plain help loses Typer's panels, which ``hpcdl run``'s
70 options need; ``PanelledCommand`` keeps them as sections.
"""

from __future__ import annotations

from typing import Any

from typer.core import TyperCommand

_NAME_SEPARATOR = " / "  # between a flag's on and off names


def _rows(record: tuple[str, str], width: int) -> list[tuple[str, str]]:
    """A help row whose names are too long for one line, as rows of names ending with the help."""
    names, text = record
    if len(names) <= width // 2 or _NAME_SEPARATOR not in names:
        return [record]
    first, _, second = names.partition(_NAME_SEPARATOR)
    return [(first + _NAME_SEPARATOR.rstrip(), ""), (second, text)]


class PanelledCommand(TyperCommand):
    """A command whose plain help lists its options in sections named after their ``rich_help_panel``."""

    def format_options(self, ctx: Any, formatter: Any) -> None:
        sections: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            default = "Arguments" if param.param_type_name == "argument" else "Options"
            title = getattr(param, "rich_help_panel", None) or default
            sections.setdefault(title, []).extend(_rows(record, formatter.width))
        for title, rows in sections.items():
            with formatter.section(title):
                formatter.write_dl(rows)
