"""Checks of the journal keys of ``[collector]``: ``journal_dsn``, its password, ``name``."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Final

import psycopg

from collector.actions.config import check_secret_keys
from collector.exceptions import ConfigError
from fleetwatch.config_file import short_repr

if TYPE_CHECKING:
    from collector.config import CollectorConfig

MAX_DSN: Final = 2000
NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}")


def check_journal_keys(cfg: CollectorConfig) -> None:
    """Raise :class:`ConfigError` naming the key when a journal key cannot work."""
    dsn: object = cfg.journal_dsn
    password_file: object = cfg.journal_password_file
    env: object = cfg.journal_password_env
    if dsn is not None:
        check_dsn(dsn)
    check_secret_keys(
        password_file,
        env,
        file_key="journal_password_file",
        env_key="journal_password_env",
    )
    if (password_file is not None or env is not None) and dsn is None:
        msg = "collector config: a journal password is set but journal_dsn is not"
        raise ConfigError(msg)
    name: object = cfg.name
    if not isinstance(name, str) or (name and not NAME.fullmatch(name)):
        msg = (
            "collector config: name must be 1 to 128 letters, digits and . _ : @ - "
            f"(starting with a letter or digit), got {short_repr(name)}"
        )
        raise ConfigError(msg)


def check_dsn(dsn: object) -> None:
    """A PostgreSQL connection string that parses and carries no password."""
    if not isinstance(dsn, str) or not dsn.strip() or len(dsn) > MAX_DSN:
        msg = (
            "collector config: journal_dsn must be a PostgreSQL connection string "
            f"(postgresql://host:port/db or host=... dbname=...), got {short_repr(dsn)}"
        )
        raise ConfigError(msg)
    try:
        info = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        # libpq's message may quote the string, password and all: say only that it is invalid
        msg = "collector config: journal_dsn is not a valid PostgreSQL connection string"
        raise ConfigError(msg) from exc
    if info.get("password"):
        msg = (
            "collector config: journal_dsn must not hold the password; put it in "
            "journal_password_file, journal_password_env or PGPASSFILE"
        )
        raise ConfigError(msg)
