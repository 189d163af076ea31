"""Shared config-file handling: a TOML table, overridden by command-line values."""

from __future__ import annotations

import dataclasses
import itertools
import math
import reprlib
import tomllib
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterable

SHORT_REPR_LIMIT = 80
MAX_SHOWN_KEYS = 10  # keys a message lists before "and N more"
_KEY_CHARS = 40  # a key longer than this is cut in messages
_PATH_CHARS = 160  # a path longer than this is cut in messages
LOG_LEVELS = ("debug", "info", "warning", "error")
MAX_NUMBER = 1e12  # the largest number a config key takes (31,000 years in seconds)
_INT_DIGITS = 40  # an integer longer than this shows as its digit count


class _ShortRepr(reprlib.Repr):
    """A few levels and items of a value, never the whole of a hostile one.

    A YAML alias bomb is a small file whose full repr would not fit in memory; an integer of
    thousands of digits cannot even be printed, so it shows as its size.
    """

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel, self.maxtuple, self.maxlist, self.maxdict = 3, 4, 4, 4
        self.maxstring = self.maxother = 60

    def repr_dict(self, x: dict[object, object], level: int) -> str:
        """Keys in the order they came (reprlib sorts them), as the file has them."""
        if not x:
            return "{}"
        if level <= 0:
            return "{...}"
        pieces = [
            f"{self.repr1(k, level - 1)}: {self.repr1(v, level - 1)}"
            for k, v in itertools.islice(x.items(), self.maxdict)
        ]
        if len(x) > self.maxdict:
            pieces.append("...")
        return "{" + ", ".join(pieces) + "}"

    def repr_int(self, x: int, level: int) -> str:  # noqa: ARG002 - reprlib's signature
        if x.bit_length() > _INT_DIGITS * 3:  # too many digits to print (or to want printed)
            return f"<integer of {x.bit_length()} bits>"
        return repr(x)


_REPR = _ShortRepr()


def short_repr(value: object, limit: int = SHORT_REPR_LIMIT) -> str:
    """``repr(value)`` cut to at most ``limit`` characters, for error messages about input."""
    text = _REPR.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def shown_key(key: object) -> str:
    """A table's key as a message shows it, cut to 40 characters (``kkkk...``).

    As written when printable; quoted (a Python repr) when empty or not printable.
    """
    if not isinstance(key, str):
        return short_repr(key, _KEY_CHARS)
    text = key if key and key.isprintable() else repr(key)
    return text if len(text) <= _KEY_CHARS else text[: _KEY_CHARS - 3] + "..."


def shown_keys(keys: Iterable[object]) -> str:
    """``a, b, c``: the first :data:`MAX_SHOWN_KEYS` keys, each cut, then ``and N more``.

    A file may hold a key of megabytes, or thousands of keys; a message names them briefly.
    """
    items = list(keys)
    text = ", ".join(shown_key(key) for key in items[:MAX_SHOWN_KEYS])
    extra = len(items) - MAX_SHOWN_KEYS
    return f"{text} and {extra} more" if extra > 0 else text


def shown_path(path: object) -> str:
    """A path as a message shows it: as it is when short and printable, else cut."""
    text = str(path)
    text = text if text.isprintable() else repr(text)
    return text if len(text) <= _PATH_CHARS else text[: _PATH_CHARS - 3] + "..."


def utf8_line(exc: UnicodeDecodeError) -> int:
    """The line (from 1) of the first byte that is not UTF-8."""
    return bytes(exc.object).count(b"\n", 0, exc.start) + 1


def not_utf8(path: object, what: str, exc: UnicodeDecodeError) -> str:
    """``PATH: WHAT is not UTF-8 text: REASON at byte N (line L)``, for a file that is not."""
    where = f"at byte {exc.start} (line {utf8_line(exc)})"
    return f"{shown_path(path)}: {what} is not UTF-8 text: {exc.reason} {where}"


def check_text(
    value: object, key: str, what: str, error: type[Exception], *, empty: bool = False
) -> str:
    """``value`` when it is a string (non-empty unless ``empty``); else raise ``error``."""
    if not isinstance(value, str) or (not value and not empty):
        msg = f"{what}: {key} must be a {'string' if empty else 'non-empty string'}, "
        msg += f"got {short_repr(value)}"
        raise error(msg)
    return value


def check_log_level(value: object, what: str, error: type[Exception]) -> None:
    """Raise ``error`` unless ``value`` is None (not set) or one of :data:`LOG_LEVELS`."""
    if value is not None and value not in LOG_LEVELS:
        msg = f"{what}: log_level must be one of {', '.join(LOG_LEVELS)}, got {short_repr(value)}"
        raise error(msg)


def to_path(value: object, key: str, what: str, error: type[Exception]) -> Path:
    """A config value that names a file or directory, as a Path; else raise ``error``."""
    return Path(check_text(value, key, what, error))


def merge_config(
    path: Path | None,
    section: str,
    overrides: dict[str, Any],
    fields: type[Any],
    error: type[Exception],
) -> dict[str, Any]:
    """Return ``[section]`` of the TOML file at ``path`` updated with non-None ``overrides``.

    Keys not among the dataclass ``fields`` are refused, so a typo does not pass silently. Every
    problem raises ``error`` with a message naming the file or the key.
    """
    values: dict[str, Any] = {}
    if path is not None:
        where = shown_path(path)
        try:
            raw = tomllib.loads(path.read_text("utf-8"))
        except OSError as exc:
            msg = f"{where}: cannot read {section} config: {exc.strerror}"
            raise error(msg) from exc
        except UnicodeDecodeError as exc:
            raise error(not_utf8(path, f"{section} config", exc)) from exc
        except ValueError as exc:  # TOMLDecodeError, or an integer of thousands of digits
            msg = f"{where}: invalid TOML: {str(exc)[:200]}"
            raise error(msg) from exc
        table = raw.get(section, raw)
        if not isinstance(table, dict):
            msg = f"{where}: [{section}] must be a table"
            raise error(msg)
        # Keys above the first table belong to no table; other tables may be another daemon's.
        stray = sorted(k for k, v in raw.items() if not isinstance(v, dict) and table is not raw)
        if stray:
            msg = f"{where}: key(s) {shown_keys(stray)} outside the [{section}] table"
            raise error(msg)
        values.update(table)
    values.update({k: v for k, v in overrides.items() if v is not None})
    known = {f.name for f in dataclasses.fields(fields)}
    unknown = sorted(set(values) - known)
    if unknown:
        msg = (
            f"{section} config: unknown key(s) {shown_keys(unknown)}; "
            f"known: {', '.join(sorted(known))}"
        )
        raise error(msg)
    return values


def check_number(  # noqa: PLR0913 - the bounds are what the caller states
    value: object,
    key: str,
    error: type[Exception],
    *,
    minimum: float = 0.0,
    inclusive: bool = False,
    integer: bool = False,
) -> None:
    """Raise ``error`` naming ``key`` unless ``value`` is a number above (or at) ``minimum``.

    Numbers above ``MAX_NUMBER`` (no interval, count or threshold is that large), ``inf`` and
    ``nan`` are refused too. Compared without a float conversion, so a huge TOML integer is an
    error naming the key, not an OverflowError.
    """
    kinds = (int,) if integer else (int, float)
    ok = isinstance(value, kinds) and not isinstance(value, bool)
    if ok:
        number: float = value  # type: ignore[assignment]
        ok = not (isinstance(value, float) and not math.isfinite(value))
        ok = ok and number <= MAX_NUMBER
        ok = ok and (number >= minimum if inclusive else number > minimum)
    if not ok:
        what = "an integer" if integer else "a number"
        bound = ">=" if inclusive else ">"
        msg = f"config: {key} must be {what} {bound} {minimum:g}, got {short_repr(value)}"
        raise error(msg)


def read_data_file(
    path: Path | None,
    builtin: tuple[str, str],
    what: str,
    error: type[Exception],
) -> tuple[str, str]:
    """Return (text, where) of a user's data file, or of the built-in one when ``path`` is None.

    ``builtin`` is (package, resource path); an unreadable user file raises ``error`` saying so.
    """
    if path is None:
        package, resource = builtin
        return resources.files(package).joinpath(resource).read_text("utf-8"), resource
    try:
        return path.read_text("utf-8"), str(path)
    except OSError as exc:
        msg = f"{shown_path(path)}: cannot read the {what}: {exc.strerror}"
        raise error(msg) from exc
    except UnicodeDecodeError as exc:
        raise error(not_utf8(path, f"the {what}", exc)) from exc
