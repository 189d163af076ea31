"""Errors raised by the collector.

Exception tree::

    CollectorError
    ├── ConfigError      (collector configuration is invalid; names the key)
    ├── PortInUseError   (the gRPC or HTTP port is taken: another collector?)
    ├── JournalError     (the journal cannot be opened, migrated or written)
    │   ├── RowRefusedError  (the database refused one row; the rest of its commit went in)
    │   ├── JournalUnreachableError  (the database server cannot be reached: not a config error)
    │   └── JournalFullError  (no disk space for a commit: nothing is acked until there is)
    └── SlurmError       (scontrol missing, timed out or failed; collector/actions/slurm.py)
"""

from __future__ import annotations


class CollectorError(Exception):
    """Base class for collector errors."""


class ConfigError(CollectorError):
    """The collector's configuration is invalid."""


class PortInUseError(CollectorError):
    """Another socket already listens on the collector's gRPC or HTTP port (another collector?)."""


class JournalError(CollectorError):
    """The journal cannot be used."""


class JournalUnreachableError(JournalError):
    """The journal's database server could not be reached while the collector started.

    Not a configuration error: the collector exits with status 1 (not 2), so systemd starts it
    again (``RestartPreventExitStatus=2`` would not).
    """


class JournalFullError(JournalError):
    """A journal write failed for want of disk space; it is not committed (nor acked)."""


class RowRefusedError(JournalError):
    """The database refused one row of a group commit; the other rows were committed."""
