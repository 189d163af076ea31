"""YAML text with line numbers, for the loaders of ``rules/`` files (rules, pre-flight gates).

:func:`compose` parses a document and keeps its node tree, :func:`key_lines` maps every mapping
key's path to its line, and :func:`read_text` / :func:`builtin_text` read a user's file or a
file shipped in the ``rules`` package. A failure is a :class:`YamlTextError` with the line (and
column, when known) and a message; each loader turns it into its own problem type.
"""

from __future__ import annotations

from importlib import resources
from typing import TYPE_CHECKING, Any

import yaml

from fleetwatch.config_file import utf8_line
from rules.exceptions import RulesError

if TYPE_CHECKING:
    from pathlib import Path

KeyPath = tuple[str, ...]


class YamlTextError(RulesError):
    """A file that cannot be read or is not YAML: where (line from 1, 0: none) and why."""

    def __init__(self, line: int, message: str, column: int = 0) -> None:
        """Keep the place and the message (``column`` 0: not known)."""
        super().__init__(message)
        self.line = line
        self.column = column
        self.message = message


def compose(text: str) -> tuple[Any, yaml.Node | None]:
    """The document's data and its node tree (None, None for an empty document)."""
    try:
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line, column = (mark.line + 1, mark.column + 1) if mark is not None else (1, 0)
        raise YamlTextError(line, f"not valid YAML: {exc}", column) from exc
    except (ValueError, RecursionError) as exc:  # a huge integer; absurd nesting
        raise YamlTextError(1, f"not valid YAML: {str(exc)[:200]}") from exc
    return data, node


def key_lines(node: yaml.Node | None) -> dict[KeyPath, int]:
    """The line of every key in nested mappings, by its path (a key given twice: the last)."""
    out: dict[KeyPath, int] = {}
    if node is not None:
        _walk(node, (), out)
    return out


def _walk(node: yaml.Node, path: KeyPath, out: dict[KeyPath, int]) -> None:
    if not isinstance(node, yaml.MappingNode):
        return
    for key, value in node.value:
        if isinstance(key, yaml.ScalarNode):
            here = (*path, str(key.value))
            out[here] = int(key.start_mark.line) + 1
            _walk(value, here, out)


def line_of(lines: dict[KeyPath, int], path: KeyPath) -> int:
    """The line of ``path``, or of its nearest enclosing key that has one; 1 when none does."""
    while path:
        if path in lines:
            return lines[path]
        path = path[:-1]
    return 1


def read_text(path: Path) -> str:
    """A file's text; :class:`YamlTextError` when it cannot be read or is not UTF-8."""
    try:
        return path.read_text("utf-8")
    except OSError as exc:
        raise YamlTextError(0, f"cannot read: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        why = f"not UTF-8 text: {exc.reason} at byte {exc.start}"
        raise YamlTextError(utf8_line(exc), why) from exc


def builtin_text(resource: tuple[str, str]) -> str:
    """The text of a file shipped in a package: ``(package, name)``, e.g. ``("rules", ...)``."""
    package, name = resource
    return resources.files(package).joinpath(name).read_text("utf-8")
