"""Collector configuration: defaults, an optional TOML file, then command-line overrides."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from collector.actions.alertmanager_config import AlertmanagerConfig, parse_alertmanager
from collector.actions.config import ActionsConfig, parse_actions
from collector.api.auth import parse_tokens
from collector.api.browsers import check_allowed_hosts
from collector.exceptions import ConfigError
from collector.export.catalog import SERIES_PER_NODE_BUDGET
from collector.ingest.throttle import DEFAULT_LIMITS, IngestLimits
from collector.ingest.tls import ServerTls
from collector.jobs.config import JobsConfig
from collector.secret_files import check_secret_keys, read_secret
from collector.store.journal_config import JournalConfig, check_journal_keys
from fleetwatch.config_file import (
    check_log_level,
    check_number,
    check_text,
    merge_config,
    short_repr,
    to_path,
)
from fleetwatch.tls import check_tls_keys

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping


def split_host_port(text: str, key: str) -> tuple[str, int]:
    """Split ``host:port`` (``[v6]:port`` too); raise ConfigError naming ``key``."""
    text = check_text(text, key, "collector config", ConfigError)
    host, sep, port = text.rpartition(":")
    digits = port.isascii() and port.isdecimal() and len(port) <= 5  # noqa: PLR2004
    if not sep or not digits or int(port) > 65535:  # noqa: PLR2004
        msg = f"collector config: {key} must be host:port, got {short_repr(text)}"
        raise ConfigError(msg)
    return host.strip("[]") or "0.0.0.0", int(port)  # noqa: S104 - a server listens


TLS_KEYS = ("tls_cert", "tls_key", "tls_client_ca")


# The pre-flight levels a node may be re-qualified at ("": none, release at once).
REQUALIFY_LEVELS: Final = ("", "quick", "standard", "full")


@dataclass(frozen=True, slots=True)
class CollectorConfig:
    """Everything the collector can be told. Intervals are in seconds."""

    listen: str = "0.0.0.0:7070"
    http: str = "0.0.0.0:9470"
    # Names besides IP addresses, localhost, the name in ``http`` and the host's own names that
    # HTTP clients may reach the collector by (a proxy's name, DNS aliases): a request naming
    # another in ``Host`` is refused, which stops DNS rebinding (docs/deploy.md). "*": any.
    http_allowed_hosts: tuple[str, ...] = ()
    journal: Path = Path("/var/lib/fleetwatch/journal.db")  # the SQLite journal
    # A PostgreSQL connection string (libpq key=value or postgresql:// URI, no password in it):
    # when set, the journal is that database, which several collectors may share
    # (docs/storage.md), and ``journal`` is not used. The password comes from a file or an
    # environment variable (not both), or from libpq's own PGPASSFILE (~/.pgpass).
    journal_dsn: str | None = None
    journal_password_file: Path | None = None
    journal_password_env: str | None = None
    name: str = ""  # this collector in a shared journal; "": the host name and the gRPC port
    heartbeat_interval: float = 5.0
    missed_heartbeats: int = 3
    # After the collector starts, the nodes its journal remembers have this long to come back
    # before silence makes them unreachable: their agents are backing off (up to the agents'
    # backoff_max, 30 s) and a whole fleet reconnects at once (docs/scaling.md).
    restart_grace: float = 60.0
    poll_interval: float = 0.0  # 0: agents keep their own
    rules: tuple[Path, ...] = ()  # rule files; none: the built-in rules/default.yaml
    rules_interval: float = 1.0  # seconds between rule evaluations
    # /metrics (collector.export.exposition): a node's series are rendered again at most this
    # often while only its samples change (events, reachability and state show at once), and
    # its shard targets carry at most this many samples (docs/scaling.md).
    metrics_render_interval: float = 5.0
    metrics_shard_samples: int = 4000
    xid_catalog: Path | None = None  # the Xid catalog rules read; None: the built-in one
    preflight_gates: Path | None = None  # pre-flight's gates file; None: the built-in one
    # Re-qualify a node that comes back (a person says repaired, or it booted again while in
    # repair or drained) with a pre-flight run of this level before it takes work: quick,
    # standard or full; "" releases it at once (docs/oncall.md#a-nodes-lifecycle).
    requalify: str = "quick"
    actions: ActionsConfig = field(default_factory=ActionsConfig)
    # Incidents as Alertmanager alerts ([collector.alertmanager], docs/deploy.md); off: no urls.
    alertmanager: AlertmanagerConfig = field(default_factory=AlertmanagerConfig)
    jobs: JobsConfig = field(default_factory=JobsConfig)
    ingest: IngestLimits = DEFAULT_LIMITS  # per-node budgets ([collector.ingest], docs/ingest.md)
    # mTLS (docs/deploy.md): all three, or none and plaintext gRPC, which a non-loopback
    # listen address accepts only with insecure = true.
    tls_cert: Path | None = None  # the collector's certificate (chain), PEM
    tls_key: Path | None = None  # its private key, PEM
    tls_client_ca: Path | None = None  # the CA that signs node certificates, PEM
    insecure: bool = False
    # The bearer token that state-changing API requests must carry (docs/deploy.md "The API
    # token"): from a file or an environment variable, not both. Without one, changes are
    # accepted from loopback clients only, and not at all when ``http`` is not loopback.
    api_token_file: Path | None = None
    api_token_env: str | None = None  # the name of the variable that holds the token
    log_level: str | None = None  # debug, info, warning, error; None: --log-level, or info

    def __post_init__(self) -> None:
        """Reject values that cannot work, naming the key."""
        split_host_port(self.listen, "listen")
        split_host_port(self.http, "http")
        try:  # a TOML list becomes a tuple (the config is frozen and hashable)
            hosts = check_allowed_hosts(self.http_allowed_hosts)
        except ValueError as exc:
            msg = f"collector config: {exc}"
            raise ConfigError(msg) from exc
        object.__setattr__(self, "http_allowed_hosts", hosts)
        if self.requalify not in REQUALIFY_LEVELS:
            shown = ", ".join(repr(v) for v in REQUALIFY_LEVELS)
            msg = f"collector config: requalify must be one of {shown}, not {self.requalify!r}"
            raise ConfigError(msg)
        check_number(self.heartbeat_interval, "heartbeat_interval", ConfigError)
        check_number(
            self.missed_heartbeats,
            "missed_heartbeats",
            ConfigError,
            minimum=1,
            inclusive=True,
            integer=True,
        )
        check_number(self.poll_interval, "poll_interval", ConfigError, inclusive=True)
        check_number(self.restart_grace, "restart_grace", ConfigError, inclusive=True)
        check_number(self.rules_interval, "rules_interval", ConfigError)
        check_number(
            self.metrics_render_interval, "metrics_render_interval", ConfigError, inclusive=True
        )
        check_number(
            self.metrics_shard_samples,
            "metrics_shard_samples",
            ConfigError,
            minimum=SERIES_PER_NODE_BUDGET,
            inclusive=True,
            integer=True,
        )
        check_tls_keys(
            {k: getattr(self, k) for k in TLS_KEYS},
            insecure=self.insecure,
            what="collector config",
            error=ConfigError,
        )
        self._check_api_token_keys()
        check_journal_keys(
            dsn=self.journal_dsn,
            password_file=self.journal_password_file,
            password_env=self.journal_password_env,
            name=self.name,
        )
        check_log_level(self.log_level, "collector config", ConfigError)

    def _check_api_token_keys(self) -> None:
        check_secret_keys(
            self.api_token_file,
            self.api_token_env,
            file_key="api_token_file",
            env_key="api_token_env",
        )

    def server_tls(self) -> ServerTls:
        """What the gRPC listener needs of this config: its address and TLS files."""
        return ServerTls(
            listen=self.listen,
            host=split_host_port(self.listen, "listen")[0],
            cert=self.tls_cert,
            key=self.tls_key,
            client_ca=self.tls_client_ca,
            insecure=self.insecure,
        )

    def journal_config(self) -> JournalConfig:
        """What the journal needs of this config: where it lives, its password, our name."""
        return JournalConfig(
            path=self.journal,
            collector=self.collector_name(),
            dsn=self.journal_dsn,
            password_file=self.journal_password_file,
            password_env=self.journal_password_env,
        )

    def collector_name(self) -> str:
        """``name``, or the host name and the gRPC port."""
        return self.name or f"{socket.gethostname()}:{split_host_port(self.listen, 'listen')[1]}"

    def api_token(self, environ: Mapping[str, str]) -> bytes | None:
        """The API token secret (whitespace around it dropped); None when none is configured.

        It is one token or named ones, a ``NAME TOKEN`` per line (:func:`parse_tokens`).

        Raises:
            ConfigError: the file cannot be read, the variable is unset, either is empty, or
                named tokens are not well formed; the message names the key and the file or
                variable, never a token.
        """
        secret = read_secret(
            self.api_token_file,
            self.api_token_env,
            environ,
            file_key="api_token_file",
            env_key="api_token_env",
        )
        if secret is not None:
            try:
                parse_tokens(secret)
            except ValueError as exc:
                where = (
                    f"api_token_file {self.api_token_file}"
                    if self.api_token_file is not None
                    else f"api_token_env {self.api_token_env}"
                )
                msg = f"collector config: {where}: {exc}"
                raise ConfigError(msg) from None
        return secret


def parse_jobs(table: object) -> JobsConfig:
    """The ``[collector.jobs]`` table."""
    if not isinstance(table, dict):
        msg = "collector.jobs must be a table"
        raise ConfigError(msg)
    return JobsConfig.from_table(table)


def parse_ingest(table: object) -> IngestLimits:
    """The ``[collector.ingest]`` table: every key a positive number; unknown keys named."""
    if not isinstance(table, dict):
        msg = "collector.ingest must be a table"
        raise ConfigError(msg)
    known = {f.name for f in fields(IngestLimits)}
    unknown = sorted(set(table) - known)
    if unknown:
        msg = (
            f"collector.ingest: unknown keys {', '.join(unknown)}; "
            f"known: {', '.join(sorted(known))}"
        )
        raise ConfigError(msg)
    for key, value in table.items():
        check_number(value, f"ingest.{key}", ConfigError, integer=key == "repeat_burst")
    return IngestLimits(**table)


# The sub-tables of [collector], each parsed (and checked) by its own function.
_SUB_TABLES: Final[dict[str, Callable[[object], object]]] = {
    "actions": parse_actions,
    "alertmanager": parse_alertmanager,
    "ingest": parse_ingest,
    "jobs": parse_jobs,
}


def load_collector_config(path: Path | None, overrides: dict[str, Any]) -> CollectorConfig:
    """Merge defaults, the TOML file at ``path`` (if any) and ``overrides`` (None means unset)."""
    values = merge_config(path, "collector", overrides, CollectorConfig, ConfigError)
    for key in (
        "journal",
        "xid_catalog",
        "api_token_file",
        "journal_password_file",
        "preflight_gates",
    ):
        if values.get(key) is not None:
            values[key] = to_path(values[key], key, "collector config", ConfigError)
    for key in TLS_KEYS:
        if isinstance(values.get(key), str) and values[key]:
            values[key] = Path(values[key])  # anything else: the dataclass says what is wrong
    for key, parse in _SUB_TABLES.items():
        if key in values:
            values[key] = parse(values[key])
    if "rules" in values:
        rules = values["rules"]
        if isinstance(rules, str) or not isinstance(rules, list | tuple):
            msg = "collector config: rules must be a list of rule file paths"
            raise ConfigError(msg)
        values["rules"] = tuple(to_path(p, "rules", "collector config", ConfigError) for p in rules)
    return CollectorConfig(**values)
