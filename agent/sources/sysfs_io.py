"""Cheap reads of small sysfs files: ``os.open``/``os.read`` relative to a directory fd.

A poll reads hundreds of one-line files (every IB counter of every port); pathlib's
``read_text`` costs several times more per file than these calls. Values stay bytes until the
caller parses them.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Iterable

READ_LIMIT: Final = 4096  # every attribute we read is far smaller than a page
_MISSING: Final = frozenset({errno.ENOENT, errno.ENOTDIR})


@dataclass(slots=True)
class FileBatch:
    """What one directory read gave: contents by name, names absent, names that failed."""

    data: dict[str, bytes] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


def read_text(path: str) -> str:
    """Read a small file whole; OSError as the kernel reports it."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, READ_LIMIT).decode("ascii", errors="replace")
    finally:
        os.close(fd)


def list_dir(directory: str) -> tuple[str, ...]:
    """The directory's file names, hidden ones aside, sorted; empty when it cannot be listed."""
    try:
        names = os.listdir(directory)  # noqa: PTH208 - a plain list of names is all we need
    except OSError:
        return ()
    return tuple(sorted(n for n in names if not n.startswith(".")))


def read_files(directory: str, names: Iterable[str]) -> FileBatch:
    """Read the named files of ``directory`` through one directory fd."""
    batch = FileBatch()
    try:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        batch.missing.extend(names)
        return batch
    try:
        for name in names:
            try:
                fd = os.open(name, os.O_RDONLY, dir_fd=dir_fd)
            except OSError as exc:
                (batch.missing if exc.errno in _MISSING else batch.failed).append(name)
                continue
            try:
                batch.data[name] = os.read(fd, READ_LIMIT)
            except OSError:
                batch.failed.append(name)
            finally:
                os.close(fd)
    finally:
        os.close(dir_fd)
    return batch


def parse_uint(raw: bytes | str) -> int | None:
    """An unsigned decimal, surrounding whitespace allowed; None for anything else."""
    value = raw.strip()
    return int(value) if value.isdigit() and value.isascii() else None
