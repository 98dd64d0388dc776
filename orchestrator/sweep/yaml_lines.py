"""Load YAML together with the line of every field, so validation errors can point at the file.

``load_yaml_with_lines`` returns the plain Python data (what ``yaml.safe_load`` gives) and a map
from each field path (a tuple of mapping keys and sequence indexes, as pydantic reports error
locations) to the 1-based line where that field is written.

Aliases are expanded under a budget: a file whose aliases would expand it past
``MAX_EXPANDED_NODES`` values (a "billion laughs" bomb), an alias inside the node it names (a
recursive alias) and nesting deeper than ``MAX_DEPTH`` are refused while composing, at the line
of the alias or node, before anything is built from them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml

FieldPath = tuple[str | int, ...]
#: The most values (scalars, lists and mappings, each alias counted as a copy of what it names)
#: a file may expand to; the largest shipped sweep has about a thousand.
MAX_EXPANDED_NODES = 100_000
#: The deepest nesting of lists and mappings a file may have (sweep files use about six).
MAX_DEPTH = 64


class YamlSyntaxError(ValueError):
    """The text is not valid YAML, repeats a key or breaks the alias and nesting limits; ``line``
    is 1-based."""

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
    loader = _BoundedLoader(text)
    try:
        root = loader.get_single_node()
        data = None if root is None else loader.construct_document(root)
    except yaml.MarkedYAMLError as error:
        raise _syntax_error(error) from error
    except yaml.YAMLError as error:
        raise YamlSyntaxError(1, str(error)) from error
    finally:
        loader.dispose()
    lines: dict[FieldPath, int] = {(): 1}
    if root is not None:
        lines[()] = root.start_mark.line + 1
        _record_lines(root, (), lines)
    return LocatedYaml(data=data, lines=lines)


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing alias bombs, recursive aliases and deep nesting.

    While composing it keeps each finished node's expanded size (memoised by node, so shared
    nodes are sized once) and the running size of the whole document, where an alias counts as
    a copy of the node it names. A node that is still being composed has no size yet, so an
    alias naming it is recursive.
    """

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.expanded_sizes: dict[int, int] = {}
        self.expanded_total = 0
        self.depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        """Compose one node (see ``yaml.composer.Composer``) and count its expanded size."""
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            node = super().compose_node(parent, index)
            size = self.expanded_sizes.get(id(node))
            if size is None:
                raise _limit_error(
                    event,
                    f"alias *{event.anchor} is inside the node &{event.anchor} it names "
                    "(a recursive alias); write the value out instead",
                )
            self._count(size, event, f"alias *{event.anchor}: aliases expand")
            return node
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _limit_error(event, f"lists and mappings nest deeper than {MAX_DEPTH} levels")
        node = super().compose_node(parent, index)
        self.depth -= 1
        children = _children(node)
        self.expanded_sizes[id(node)] = 1 + sum(self.expanded_sizes[id(c)] for c in children)
        self._count(1, event, "the file expands")
        return node

    def _count(self, size: int, event: yaml.Event, what: str) -> None:
        """Add ``size`` values to the document's total; refuse it past the budget."""
        self.expanded_total += size
        if self.expanded_total > MAX_EXPANDED_NODES:
            raise _limit_error(
                event,
                f"{what} the file to more than {MAX_EXPANDED_NODES} values (the limit); "
                "a sweep needs far fewer: write repeated parts with fewer aliases",
            )


def _children(node: yaml.Node) -> list[yaml.Node]:
    """Return the nodes directly inside ``node`` (a mapping's keys and values)."""
    if isinstance(node, yaml.MappingNode):
        return [item for pair in node.value for item in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _limit_error(event: yaml.Event, problem: str) -> yaml.composer.ComposerError:
    """Return a composer error at ``event``'s position (reported like any YAML error)."""
    return yaml.composer.ComposerError(None, None, problem, event.start_mark)


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
