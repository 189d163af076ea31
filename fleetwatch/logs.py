"""structlog set-up for the command line; libraries only call ``structlog.get_logger()``."""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Literal

import structlog

if TYPE_CHECKING:
    from typing import TextIO

LogFormat = Literal["json", "console"]


def default_log_format(stream: TextIO) -> LogFormat:
    """Lines for a person on a terminal; JSON for journald, files and log shippers."""
    try:
        return "console" if stream.isatty() else "json"
    except (AttributeError, ValueError):  # no such method, or the stream is closed
        return "json"


def _stderr_logger(*_args: object) -> structlog.PrintLogger:
    # Looked up per logger, not bound at set-up: whoever replaces sys.stderr later (a test
    # harness, a daemon redirecting it) still gets the logs.
    return structlog.PrintLogger(sys.stderr)


def configure_logging(level: str = "info", fmt: LogFormat = "json") -> None:
    """Send key-value logs to stderr, as JSON (production) or for a terminal (demo)."""
    numeric = logging.getLevelNamesMapping().get(level.upper())
    if numeric is None:
        msg = f"unknown log level {level!r}; use debug, info, warning or error"
        raise ValueError(msg)
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=_stderr_logger,
        cache_logger_on_first_use=False,
    )
