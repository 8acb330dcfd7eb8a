"""YAML loading that remembers line numbers, so schema errors can point at the offending line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from hpcdl.common.exceptions import HpcdlError


class StackFileError(HpcdlError):
    """A recipe, table or lockfile is malformed; the message names the file and line."""


class LineDict(dict):
    """A mapping from YAML that knows its own line and the line of each key (1-based)."""

    line: int = 0
    key_lines: dict[str, int]

    def line_of(self, key: str) -> int:
        return self.key_lines.get(key, self.line)


class LineList(list):
    """A sequence from YAML that knows its own line and the line of each item (1-based)."""

    line: int = 0
    item_lines: list[int]

    def line_of(self, index: int) -> int:
        return self.item_lines[index] if index < len(self.item_lines) else self.line


class _LineLoader(yaml.SafeLoader):
    """SafeLoader that builds LineDict/LineList; version-like scalars stay strings (12.10 is not 12.1)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> LineDict:  # type: ignore[override]
        self.flatten_mapping(node)
        result = LineDict()
        result.line = node.start_mark.line + 1
        result.key_lines = {}
        for key_node, value_node in node.value:
            key = self.construct_object(key_node, deep=True)
            key = str(key) if not isinstance(key, str) else key
            if key in result:
                raise StackFileError(f"line {key_node.start_mark.line + 1}: duplicate key '{key}'")
            result[key] = self.construct_object(value_node, deep=True)
            result.key_lines[key] = key_node.start_mark.line + 1
        return result

    def construct_sequence(self, node: yaml.SequenceNode, deep: bool = False) -> LineList:  # type: ignore[override]
        result = LineList(self.construct_object(child, deep=True) for child in node.value)
        result.line = node.start_mark.line + 1
        result.item_lines = [child.start_mark.line + 1 for child in node.value]
        return result


def _float_as_text(loader: _LineLoader, node: yaml.ScalarNode) -> str:
    return loader.construct_scalar(node)


_LineLoader.add_constructor("tag:yaml.org,2002:map", _LineLoader.construct_mapping)
_LineLoader.add_constructor("tag:yaml.org,2002:seq", _LineLoader.construct_sequence)
_LineLoader.add_constructor("tag:yaml.org,2002:float", _float_as_text)


def load_yaml(path: Path) -> Any:
    """Parse `path`; syntax errors become StackFileError with file and line."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise StackFileError(f"cannot read {path}: {exc.strerror}") from exc
    try:
        return yaml.load(text, Loader=_LineLoader)  # a SafeLoader subclass
    except StackFileError as exc:
        raise StackFileError(f"{path}: {exc}") from None
    except yaml.MarkedYAMLError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark else 0
        raise StackFileError(f"{path}:{line}: YAML syntax error: {exc.problem}") from None
    except yaml.YAMLError as exc:
        raise StackFileError(f"{path}: YAML error: {exc}") from None
