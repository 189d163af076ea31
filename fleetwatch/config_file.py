"""Shared config-file handling: a TOML table, overridden by command-line values."""

from __future__ import annotations

import dataclasses
import tomllib
from importlib import resources
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path


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
        try:
            raw = tomllib.loads(path.read_text("utf-8"))
        except OSError as exc:
            msg = f"{path}: cannot read {section} config: {exc.strerror}"
            raise error(msg) from exc
        except tomllib.TOMLDecodeError as exc:
            msg = f"{path}: invalid TOML: {exc}"
            raise error(msg) from exc
        table = raw.get(section, raw)
        if not isinstance(table, dict):
            msg = f"{path}: [{section}] must be a table"
            raise error(msg)
        # Keys above the first table belong to no table; other tables may be another daemon's.
        stray = sorted(k for k, v in raw.items() if not isinstance(v, dict) and table is not raw)
        if stray:
            msg = f"{path}: key(s) {', '.join(stray)} outside the [{section}] table"
            raise error(msg)
        values.update(table)
    values.update({k: v for k, v in overrides.items() if v is not None})
    known = {f.name for f in dataclasses.fields(fields)}
    unknown = sorted(set(values) - known)
    if unknown:
        msg = (
            f"{section} config: unknown key(s) {', '.join(unknown)}; "
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
    """Raise ``error`` naming ``key`` unless ``value`` is a number above (or at) ``minimum``."""
    kinds = (int,) if integer else (int, float)
    ok = isinstance(value, kinds) and not isinstance(value, bool)
    if ok:
        number = float(value)  # type: ignore[arg-type]
        ok = number >= minimum if inclusive else number > minimum
    if not ok:
        what = "an integer" if integer else "a number"
        bound = ">=" if inclusive else ">"
        msg = f"config: {key} must be {what} {bound} {minimum:g}, got {value!r}"
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
        msg = f"{path}: cannot read the {what}: {exc.strerror}"
        raise error(msg) from exc
