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
_NO_DESCRIPTORS: Final = frozenset({errno.EMFILE, errno.ENFILE})
_U64_DIGITS: Final = 20


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


U64_MAX: Final = (1 << 64) - 1  # sysfs counters are at most 64 bits wide


def parse_uint(raw: bytes | str) -> int | None:
    """An unsigned decimal up to 2**64 - 1, surrounding whitespace allowed; None for anything else.

    A larger number is no counter the kernel printed (and one of thousands of digits would not
    even convert).
    """
    value = raw.strip()
    if not (value.isdigit() and value.isascii()) or len(value) > _U64_DIGITS:
        return None
    number = int(value)
    return number if number <= U64_MAX else None


class OpenFiles:
    """Files of one directory kept open and re-read with ``pread(fd, n, 0)``.

    Reading a sysfs attribute from offset 0 runs its ``show()`` again, so a kept descriptor
    gives a fresh value with one system call instead of three (open, read, close). When any
    descriptor fails (the device went away or was replaced) all are closed and reopened on the
    next read. The :class:`FdBudget` caps how many descriptors all sets keep together; past it
    a set reads the usual way.
    """

    __slots__ = ("_budget", "_fds", "directory", "names")

    def __init__(self, directory: str, names: tuple[str, ...], budget: FdBudget) -> None:
        """Remember what to open; nothing is opened until the first read."""
        self.directory = directory
        self.names = names
        self._budget = budget
        self._fds: dict[str, int] | None = None

    def _open(self, batch: FileBatch) -> dict[str, int] | None:
        if not self._budget.take(len(self.names)):
            return None
        fds: dict[str, int] = {}
        for name in self.names:
            try:
                fds[name] = os.open(f"{self.directory}/{name}", os.O_RDONLY)
            except OSError as exc:
                if exc.errno in _NO_DESCRIPTORS:  # the process is out: keep none, read plainly
                    for fd in fds.values():
                        os.close(fd)
                    self._budget.give_back(len(self.names))
                    self._budget.limit = self._budget.used
                    return None
                (batch.missing if exc.errno in _MISSING else batch.failed).append(name)
        self._budget.give_back(len(self.names) - len(fds))
        return fds

    def read(self) -> FileBatch:
        """Read every file; a set that cannot stay open reads through :func:`read_files`."""
        batch = FileBatch()
        fds = self._fds if self._fds is not None else self._open(batch)
        if fds is None:
            return read_files(self.directory, self.names)
        self._fds = fds
        data = batch.data
        try:
            for name, fd in fds.items():
                data[name] = os.pread(fd, READ_LIMIT, 0)
        except OSError:
            self.close()  # reopened, and missing files noticed, on the next read
            return read_files(self.directory, self.names)
        if batch.missing or batch.failed:
            self.close()
        return batch

    def close(self) -> None:
        """Close every kept descriptor."""
        if self._fds is not None:
            for fd in self._fds.values():
                os.close(fd)
            self._budget.give_back(len(self._fds))
            self._fds = None


@dataclass(slots=True)
class FdBudget:
    """How many descriptors :class:`OpenFiles` sets may keep open together."""

    limit: int
    used: int = 0

    def take(self, count: int) -> bool:
        """Reserve ``count`` descriptors, if the budget allows."""
        if self.used + count > self.limit:
            return False
        self.used += count
        return True

    def give_back(self, count: int) -> None:
        """Release ``count`` descriptors."""
        self.used = max(self.used - count, 0)
