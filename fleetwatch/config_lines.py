"""Where in a file a problem is: ``file:line:column: message`` for people and for log fields.

A TOML syntax error carries its line and column in its message; a value the daemon refuses
(``config: poll_interval must be a number > 0``) names a key instead, and :func:`key_line` finds
the line that sets that key. The search is a plain scan of the text, cheap and good enough for
the files people write: a table header (``[collector.actions]``) or a ``key = value`` line, with
dotted and quoted keys; it does not parse multi-line strings, so a line inside one that looks
like an assignment could be taken for one (the message still names the key).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from pathlib import Path

_TOML_AT: Final = re.compile(r"\(at line (\d+), column (\d+)\)")
_HEADER: Final = re.compile(r"^\s*\[\[?([^\[\]]+)\]\]?\s*(?:#.*)?$")
_KEY_PART: Final = r"""(?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*')"""
_ASSIGN: Final = re.compile(rf"^\s*({_KEY_PART}(?:\s*\.\s*{_KEY_PART})*)\s*=")
_WORD: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
# Words of a message up to here name keys; what follows is the value or an explanation.
_MESSAGE_END: Final = re.compile(r" got |; |: (?=/)")
_WORDS_TRIED: Final = 12


@dataclass(frozen=True, slots=True)
class FileProblem:
    """One problem in one file; ``line`` and ``column`` count from 1 (None: not known)."""

    file: str
    message: str
    line: int | None = None
    column: int | None = None

    def __str__(self) -> str:
        """``file:line:column: message``, with what is known of the position."""
        where = self.file
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        message = self.message.removeprefix(f"{self.file}: ")
        return f"{where}: {message}"


def _dotted(key: str) -> str:
    """``a . "b.c"`` as ``a.b.c``: the parts of a dotted TOML key, unquoted, joined by dots."""
    parts = re.findall(r'"([^"]*)"|\'([^\']*)\'|([^.\s"\']+)', key)
    return ".".join(next(p for p in part if p) for part in parts)


def key_line(text: str, section: str, key: str) -> int | None:
    """The line that sets ``key`` (dotted, e.g. ``actions.notify.pager.url``) of ``[section]``.

    A key may be set in the section's table, in a sub-table (``[section.actions]`` then
    ``dry_run = true``), as a table of its own (``[section.actions.slurm]`` for
    ``actions.slurm``), or at the top of a file that has no ``[section]`` table (the daemons
    read such a file as the section). None when no line sets it.
    """
    wanted = f"{section}.{key}"
    table = ""
    for number, line in enumerate(text.splitlines(), start=1):
        header = _HEADER.match(line)
        if header is not None:
            table = _dotted(header[1])
            if table == wanted:
                return number
            continue
        assign = _ASSIGN.match(line)
        if assign is None:
            continue
        name = _dotted(assign[1])
        full = f"{table}.{name}" if table else name
        if full == wanted or (not table and full == key):
            return number
    return None


def toml_position(message: str) -> tuple[int, int] | None:
    """(line, column) of a ``tomllib`` syntax error, from its message."""
    found = _TOML_AT.search(message)
    return (int(found[1]), int(found[2])) if found else None


def locate(file: str, text: str, section: str, message: str) -> FileProblem:
    """A config loader's error message about ``file`` (``text``) with its position, if found.

    A TOML syntax error gives its own line and column; otherwise the first word of the message
    that names a key ``[section]`` sets (the longest dotted prefix that is set: a webhook table
    for ``actions.notify.pager.secret_file`` when the table is written inline) gives the line.
    """
    at = toml_position(message)
    if at is not None:
        return FileProblem(file, message, at[0], at[1])
    head = _MESSAGE_END.split(message.removeprefix(f"{file}: "), maxsplit=1)[0]
    for word in _WORD.findall(head)[:_WORDS_TRIED]:
        parts = word.strip(".").split(".")
        for end in range(len(parts), 0, -1):
            line = key_line(text, section, ".".join(parts[:end]))
            if line is not None:
                return FileProblem(file, message, line)
    return FileProblem(file, message)


def config_problem(path: Path | None, section: str, message: str) -> FileProblem:
    """A config loader's error, at the line of the key it names (or of a TOML syntax error).

    ``section``: the file's table (``agent`` or ``collector``); ``path`` None: the settings came
    from the command line.
    """
    if path is None:
        return FileProblem("command line", message)
    try:
        text = path.read_text("utf-8")
    except (OSError, UnicodeDecodeError):
        return FileProblem(str(path), message)
    return locate(str(path), text, section, message)
