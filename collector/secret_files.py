"""Secrets the collector reads: from a file or an environment variable, never from its config.

A secret (a webhook's signing key, the API token, the PostgreSQL journal's password) is named by
two keys, a file and a variable, of which at most one may be set. Errors name the key and the
file or variable, never the secret.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Final

from collector.exceptions import ConfigError
from fleetwatch.config_file import short_repr, shown_path

if TYPE_CHECKING:
    from collections.abc import Mapping

# An environment variable's name; 128 characters is more than any real one needs, and keeps a
# hostile config's name from being echoed whole in messages.
ENV_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


def check_secret_keys(file: object, env: object, *, file_key: str, env_key: str) -> None:
    """A secret's two keys: a path, or the name of an environment variable, not both."""
    if file is not None and not isinstance(file, Path):
        msg = f"collector config: {file_key} must be a path, got {short_repr(file)}"
        raise ConfigError(msg)
    if env is not None and (not isinstance(env, str) or not ENV_NAME.fullmatch(env)):
        msg = (
            f"collector config: {env_key} must name an environment variable, got {short_repr(env)}"
        )
        raise ConfigError(msg)
    if file is not None and env is not None:
        msg = f"collector config: takes {file_key} or {env_key}, not both"
        raise ConfigError(msg)


def read_secret(
    file: Path | None,
    env: str | None,
    environ: Mapping[str, str],
    *,
    file_key: str,
    env_key: str,
) -> bytes | None:
    """A secret from the variable ``env`` or the file ``file`` (whitespace around it dropped).

    None when neither is configured. Raises ConfigError when the file cannot be read, the
    variable is unset, or either is empty; the message names the key (``file_key`` or
    ``env_key``) and the file or variable, never the secret.
    """
    if env is not None:
        value = environ.get(env, "").strip()
        if not value:
            state = "empty" if env in environ else "not set"
            msg = (
                f"collector config: {env_key}: environment variable "
                f"{env} is {state} in the collector's environment"
            )
            raise ConfigError(msg)
        return value.encode()
    if file is None:
        return None
    try:
        secret = file.read_bytes().strip()
    except OSError as exc:
        msg = f"collector config: {file_key} {shown_path(file)}: {exc.strerror}"
        raise ConfigError(msg) from exc
    if not secret:
        msg = f"collector config: {file_key} {shown_path(file)} is empty"
        raise ConfigError(msg)
    return secret
