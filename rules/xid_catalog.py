"""The Xid catalog as data: load and validate ``builtin/xid_catalog.yaml`` (or a user's copy)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import yaml

from fleetwatch.config_file import read_data_file, short_repr
from rules.exceptions import CatalogError

if TYPE_CHECKING:
    from pathlib import Path

CLASSES: Final = frozenset(
    {"application", "memory", "nvlink", "bus", "firmware", "engine", "init", "informational"},
)
ACTIONS: Final = frozenset(
    {"IGNORE", "RESTART_APP", "RESET_GPU", "RESTART_BM", "CONTACT_SUPPORT", "WORKFLOW"},
)
UNKNOWN_CLASS: Final = "unknown"


@dataclass(frozen=True, slots=True)
class XidEntry:
    """One Xid: its meaning, class, NVIDIA's first action and whether it is fatal to the job."""

    xid: int
    name: str
    xid_class: str
    action: str
    fatal: bool


class XidCatalog:
    """Look up Xid entries; unknown Xids classify as ``unknown``."""

    __slots__ = ("_entries",)

    def __init__(self, entries: dict[int, XidEntry]) -> None:
        """Wrap already validated entries."""
        self._entries = dict(entries)

    def __len__(self) -> int:
        """Return the number of known Xids."""
        return len(self._entries)

    def get(self, xid: int) -> XidEntry | None:
        """Return the entry for ``xid``, or None when the catalog does not know it."""
        return self._entries.get(xid)

    def class_of(self, xid: int) -> str:
        """Return the class of ``xid`` (``unknown`` when not in the catalog)."""
        entry = self._entries.get(xid)
        return entry.xid_class if entry else UNKNOWN_CLASS


def _entry(where: str, xid: object, raw: object) -> XidEntry:
    if not isinstance(xid, int) or isinstance(xid, bool) or not 0 < xid <= 65_535:  # noqa: PLR2004
        msg = f"{where}: Xid key {short_repr(xid)} is not an integer between 1 and 65535"
        raise CatalogError(msg)
    if not isinstance(raw, dict):
        msg = f"{where}: Xid {xid} must be a mapping with name, class, action and fatal"
        raise CatalogError(msg)
    missing = {"name", "class", "action", "fatal"} - raw.keys()
    if missing:
        msg = f"{where}: Xid {xid} lacks {', '.join(sorted(missing))}"
        raise CatalogError(msg)
    name, cls, action, fatal = raw["name"], raw["class"], raw["action"], raw["fatal"]
    if not isinstance(name, str) or not name:
        msg = f"{where}: Xid {xid} name must be a non-empty string"
        raise CatalogError(msg)
    if not isinstance(cls, str) or cls not in CLASSES:
        msg = f"{where}: Xid {xid} class {short_repr(cls)} is not one of {sorted(CLASSES)}"
        raise CatalogError(msg)
    if not isinstance(action, str) or action not in ACTIONS:
        msg = f"{where}: Xid {xid} action {short_repr(action)} is not one of {sorted(ACTIONS)}"
        raise CatalogError(msg)
    if not isinstance(fatal, bool):
        msg = f"{where}: Xid {xid} fatal must be true or false"
        raise CatalogError(msg)
    return XidEntry(xid=xid, name=name, xid_class=cls, action=action, fatal=fatal)


def parse_catalog(text: str, where: str = "<xid catalog>") -> XidCatalog:
    """Parse catalog YAML; every problem is a :class:`CatalogError` naming ``where`` and the Xid."""
    try:
        data = yaml.safe_load(text)
    except (yaml.YAMLError, ValueError, RecursionError) as exc:
        # ValueError: an integer of thousands of digits; RecursionError: absurd nesting
        msg = f"{where}: not valid YAML: {str(exc)[:300]}"
        raise CatalogError(msg) from exc
    if not isinstance(data, dict) or data.get("version") != 1:
        msg = f"{where}: expected a mapping with 'version: 1' and 'xids'"
        raise CatalogError(msg)
    xids = data.get("xids")
    if not isinstance(xids, dict):
        msg = f"{where}: 'xids' must map Xid numbers to entries"
        raise CatalogError(msg)
    entries = [_entry(where, k, v) for k, v in xids.items()]
    return XidCatalog({e.xid: e for e in entries})


def load_catalog(path: Path | None = None) -> XidCatalog:
    """Load the catalog from ``path``, or the built-in one when ``path`` is None."""
    builtin = ("rules", "builtin/xid_catalog.yaml")
    text, where = read_data_file(path, builtin, "Xid catalog", CatalogError)
    return parse_catalog(text, where)
