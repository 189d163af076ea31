"""Errors raised by the collector.

Exception tree::

    CollectorError
    ├── ConfigError      (collector configuration is invalid; names the key)
    ├── JournalError     (the journal cannot be opened, migrated or written)
    │   └── RowRefusedError  (the database refused one row; the rest of its commit went in)
    └── SlurmError       (scontrol missing, timed out or failed; collector/actions/slurm.py)
"""

from __future__ import annotations


class CollectorError(Exception):
    """Base class for collector errors."""


class ConfigError(CollectorError):
    """The collector's configuration is invalid."""


class JournalError(CollectorError):
    """The journal cannot be used."""


class RowRefusedError(JournalError):
    """The database refused one row of a group commit; the other rows were committed."""
