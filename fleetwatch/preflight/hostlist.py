"""Node lists as people type them: ``all``, ``a,b,c`` or Slurm's hostlist syntax.

``gpu-[01-16]`` is gpu-01 ... gpu-16 (a range keeps the zero padding of its lower bound, as Slurm
does: ``[9-011]`` is 9, 10, 11); ``gpu-[01-04,07],cpu-1`` mixes ranges, single numbers and plain
names; ``rack[1-2]-gpu[1-4]`` has two bracket groups and expands to their product, first group
slowest. Terms are separated by commas or white space. Unlike ``scontrol show hostnames`` a name
may go on after its last bracket (``node[1-2].lan``); everything Slurm accepts expands the same.

Every name must be one the caller knows (the collector's nodes): a typo is refused with the
names it did not know, never silently dropped. Expansion is bounded, so a hostile expression such
as ``n[0-99999999]`` or many stacked groups is refused before anything is built.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Sequence

ALL: Final = "all"
MAX_EXPR_CHARS: Final = 65_536  # longer than any real node list
MAX_HOSTS: Final = 65_536  # names one expression may expand to (before checking them)
MAX_SHOWN: Final = 8  # unknown names an error lists before "and N more"
_RANGE: Final = re.compile(r"(\d{1,18})(?:-(\d{1,18}))?")
_NAME_CHARS: Final = re.compile(r"[A-Za-z0-9._-]+")


class HostlistError(ValueError):
    """The node list cannot be used; the message says what in it was wrong."""


def expand(expr: str, known: Sequence[str]) -> list[str]:
    """The node names ``expr`` stands for, in the order written, each once.

    ``all`` is every name in ``known`` (in that order). Raises :class:`HostlistError` for a
    syntax error, a range that goes backwards, an expansion past :data:`MAX_HOSTS` names, an
    empty list, or names not in ``known`` (all of them named, up to :data:`MAX_SHOWN`).
    """
    if len(expr) > MAX_EXPR_CHARS:
        msg = f"node list is {len(expr)} characters long (at most {MAX_EXPR_CHARS})"
        raise HostlistError(msg)
    text = expr.strip()
    if text == ALL:
        if not known:
            raise HostlistError("node list 'all': no nodes are known")
        return list(dict.fromkeys(known))
    names = _expand_terms(text)
    if not names:
        msg = f"node list {_shown(expr)} names no nodes"
        raise HostlistError(msg)
    known_set = frozenset(known)
    unknown = [name for name in names if name not in known_set]
    if unknown:
        listed = ", ".join(unknown[:MAX_SHOWN])
        more = f" and {len(unknown) - MAX_SHOWN} more" if len(unknown) > MAX_SHOWN else ""
        msg = (
            f"node list {_shown(expr)}: unknown node{'s' if len(unknown) > 1 else ''} "
            f"{listed}{more} ({len(known_set)} nodes known)"
        )
        raise HostlistError(msg)
    return names


def _shown(expr: str) -> str:
    return repr(expr if len(expr) <= 60 else expr[:57] + "...")  # noqa: PLR2004 - a message's width


def _split_terms(text: str, expr: str) -> list[str]:
    """Top-level terms: split on commas and white space outside brackets."""
    terms: list[str] = []
    current: list[str] = []
    depth = 0
    for char in text:
        if char == "[":
            if depth:
                msg = f"node list {_shown(expr)}: '[' inside brackets"
                raise HostlistError(msg)
            depth = 1
        elif char == "]":
            if not depth:
                msg = f"node list {_shown(expr)}: ']' without '['"
                raise HostlistError(msg)
            depth = 0
        elif depth == 0 and (char == "," or char.isspace()):
            if current:
                terms.append("".join(current))
            current = []
            continue
        current.append(char)
    if depth:
        msg = f"node list {_shown(expr)}: '[' is never closed"
        raise HostlistError(msg)
    if current:
        terms.append("".join(current))
    return terms


# One bracket group as written: (low, high, zero-padded width) per range; built only once the
# whole expression is known to stay within MAX_HOSTS names.
_Group = list[tuple[int, int, int]]


def _expand_terms(text: str) -> list[str]:
    out: dict[str, None] = {}
    total = 0
    for term in _split_terms(text, text):
        parts = _parse_term(term, MAX_HOSTS - total, text)
        total += math.prod(_count(part) for part in parts)
        out.update(dict.fromkeys(_product(parts)))
    return list(out)


def _too_many(expr: str) -> HostlistError:
    return HostlistError(f"node list {_shown(expr)} expands to more than {MAX_HOSTS} names")


def _count(part: str | _Group) -> int:
    return 1 if isinstance(part, str) else sum(high - low + 1 for low, high, _ in part)


def _parse_term(term: str, room: int, expr: str) -> list[str | _Group]:
    """``term`` as literals and bracket groups; refused past ``room`` names.

    Counted as it is read: nothing is built for a term that is too big.
    """
    parts: list[str | _Group] = []
    names = 1
    pos = 0
    while pos < len(term):
        open_at = term.find("[", pos)
        literal = term[pos:] if open_at < 0 else term[pos:open_at]
        if literal:
            if not _NAME_CHARS.fullmatch(literal):
                msg = (
                    f"node name {_shown(term)}: only letters, digits, '.', '_' and '-' may "
                    "appear outside brackets"
                )
                raise HostlistError(msg)
            parts.append(literal)
        if open_at < 0:
            break
        close_at = term.index("]", open_at)  # _split_terms saw every '[' closed
        group = _parse_group(term, term[open_at + 1 : close_at], room, expr)
        names *= _count(group)
        if names > room:
            raise _too_many(expr)
        parts.append(group)
        pos = close_at + 1
    if names > room:  # a plain name with no room left
        raise _too_many(expr)
    return parts


def _parse_group(term: str, inner: str, room: int, expr: str) -> _Group:
    group: _Group = []
    names = 0
    for piece in inner.split(","):
        match = _RANGE.fullmatch(piece.strip())
        if match is None:
            msg = (
                f"node name {_shown(term)}: {piece!r} is not a number or a range "
                "like 01-16 inside [...]"
            )
            raise HostlistError(msg)
        low_text, high_text = match.group(1), match.group(2)
        low = int(low_text)
        high = low if high_text is None else int(high_text)
        if high < low:
            msg = f"node name {_shown(term)}: range {piece} goes backwards"
            raise HostlistError(msg)
        names += high - low + 1
        if names > room:
            raise _too_many(expr)
        group.append((low, high, len(low_text)))
    return group


def _product(parts: list[str | _Group]) -> list[str]:
    names = [""]
    for part in parts:
        choices = (
            [part]
            if isinstance(part, str)
            else [str(n).zfill(width) for low, high, width in part for n in range(low, high + 1)]
        )
        names = [prefix + choice for prefix in names for choice in choices]
    return names
