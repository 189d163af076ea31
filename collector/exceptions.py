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

    LoopBusyError        (a RuntimeError: the event loop did not take an HTTP thread's request
                          up, or finish it, in time; the API answers 503)
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


class LoopBusyError(RuntimeError):
    """The collector's event loop did not take a request up, or finish it, in time.

    ``started`` says whether it began: a change that began may still take effect.
    """

    def __init__(self, what: str, *, waited_s: float, started: bool) -> None:
        """Say what waited and whether what it asked for may still happen."""
        if started:
            detail = "began but did not finish; it may still take effect, so look before retrying"
        else:
            detail = "was not taken up (the event loop is busy); nothing was done, retry shortly"
        super().__init__(f"{what}: the request {detail} (waited {waited_s:g} s)")
        self.started = started
