"""Load YAML together with the line of every field, so validation errors can point at the file.

``load_yaml_with_lines`` returns the plain Python data (what ``yaml.safe_load`` gives) and a map
from each field path (a tuple of mapping keys and sequence indexes, as pydantic reports error
locations) to the 1-based line where that field is written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml

FieldPath = tuple[str | int, ...]


class YamlSyntaxError(ValueError):
    """The text is not valid YAML (or repeats a key); ``line`` is 1-based."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"line {line}: {message}")
        self.line = line
        self.message = message


@dataclass(frozen=True)
class LocatedYaml:
    """Parsed YAML data and the 1-based line of each field path in it."""

    data: Any
    lines: dict[FieldPath, int]

    def line_of(self, loc: Sequence[str | int]) -> int:
        """Return the line of the deepest part of ``loc`` that exists in the file.

        Elements of ``loc`` that name no node (pydantic inserts union tags, and a missing field
        has no node) are skipped, so a missing field resolves to its parent mapping's line.
        """
        path: FieldPath = ()
        for element in loc:
            candidate = (*path, element)
            if candidate in self.lines:
                path = candidate
        return self.lines.get(path, 1)


def load_yaml_with_lines(text: str) -> LocatedYaml:
    """Parse ``text`` and record field lines; raises ``YamlSyntaxError`` with the line on errors.

    Exists because ``yaml.safe_load`` drops positions, which validation messages need.
    """
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as error:
        raise _syntax_error(error) from error
    except yaml.YAMLError as error:
        raise YamlSyntaxError(1, str(error)) from error
    lines: dict[FieldPath, int] = {(): 1}
    if root is not None:
        lines[()] = root.start_mark.line + 1
        _record_lines(root, (), lines)
    return LocatedYaml(data=data, lines=lines)


def _record_lines(node: yaml.Node, path: FieldPath, lines: dict[FieldPath, int]) -> None:
    """Fill ``lines`` for every field below ``node``; a mapping key's line is its field's line."""
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else str(key_node.value)
            if key in seen:
                raise YamlSyntaxError(key_node.start_mark.line + 1, f"duplicate key {key!r}")
            seen.add(key)
            child = (*path, key)
            lines[child] = key_node.start_mark.line + 1
            _record_lines(value_node, child, lines)
    elif isinstance(node, yaml.SequenceNode):
        for index, item_node in enumerate(node.value):
            child = (*path, index)
            lines[child] = item_node.start_mark.line + 1
            _record_lines(item_node, child, lines)


def _syntax_error(error: yaml.MarkedYAMLError) -> YamlSyntaxError:
    """Return the error at the line PyYAML noticed it, naming where the broken node started."""
    mark = error.problem_mark or error.context_mark
    line = mark.line + 1 if mark is not None else 1
    message = error.problem or str(error)
    if error.context and error.context_mark is not None:
        message += f" ({error.context} at line {error.context_mark.line + 1})"
    return YamlSyntaxError(line, message)
