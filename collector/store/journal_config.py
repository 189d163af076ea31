"""The journal's own configuration: where it lives, its password, and who writes to it.

``[collector]`` holds the keys (``journal``, ``journal_dsn``, ``journal_password_file`` or
``journal_password_env``, ``name``); :mod:`collector.config` checks them with
:func:`check_journal_keys` and hands the journal a :class:`JournalConfig`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import psycopg

from collector.exceptions import ConfigError
from collector.secret_files import check_secret_keys, read_secret
from fleetwatch.config_file import short_repr

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

MAX_DSN: Final = 2000
NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}")


@dataclass(frozen=True, slots=True)
class JournalConfig:
    """The SQLite file, or the PostgreSQL database that several collectors may share."""

    path: Path  # the SQLite journal; not used when ``dsn`` is set
    collector: str  # this collector's name in a shared journal
    dsn: str | None = None  # a PostgreSQL connection string, with no password in it
    password_file: Path | None = None
    password_env: str | None = None  # the name of the variable that holds the password

    def password(self, environ: Mapping[str, str]) -> str | None:
        """The PostgreSQL journal's password; None: libpq finds it (PGPASSFILE) or none is needed.

        Raises:
            ConfigError: the file cannot be read, the variable is unset, or either is empty.
        """
        secret = read_secret(
            self.password_file,
            self.password_env,
            environ,
            file_key="journal_password_file",
            env_key="journal_password_env",
        )
        return None if secret is None else secret.decode()

    def where(self) -> str:
        """The journal as logs and ``config check`` name it (never a password)."""
        if self.dsn is None:
            return str(self.path)
        from collector.store.postgres import describe  # noqa: PLC0415 - psycopg only when used

        return f"{describe(self.dsn)} as {self.collector}"


def check_journal_keys(
    *, dsn: object, password_file: object, password_env: object, name: object
) -> None:
    """Raise :class:`ConfigError` naming the key when a journal key cannot work."""
    env = password_env
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
