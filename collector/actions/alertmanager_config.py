"""The ``[collector.alertmanager]`` table: incidents sent to Alertmanager as alerts.

[collector.alertmanager]
urls = ["http://alertmanager-1:9093", "http://alertmanager-2:9093"]  # each gets every alert
resend_interval = 60.0          # seconds between two sends of an alert that still fires
min_severity = "warning"        # info, warning or critical: incidents below it are not sent
timeout = 5.0                   # seconds one request may take
labels = { cluster = "a" }      # added to every alert (below the rule's and fleetwatch's own)
external_url = "https://fleetwatch.example:9470"  # the collector's API for generatorURL links
ca_file = "/etc/fleetwatch/tls/alertmanager-ca.pem"  # https: the CA to verify with
bearer_token_file = "/etc/fleetwatch/alertmanager.token"  # or: bearer_token_env = "NAME"

Without the table (or with no urls) nothing is sent. Every value is checked here, naming its
key; the token file and the CA are read when the endpoints are built (at start and at each
reload), so a missing one stops the start or fails the reload.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit

from collector.actions.alertmanager_alerts import RESERVED_LABELS, valid_label
from collector.actions.alertmanager_http import AlertmanagerEndpoint
from collector.exceptions import ConfigError
from collector.secret_files import check_secret_keys, read_secret
from fleetwatch.config_file import check_number, short_repr, shown_key, shown_keys
from rules.model import Severity

if TYPE_CHECKING:
    from collections.abc import Mapping

ALERTMANAGER_KEYS: Final = (
    "urls",
    "resend_interval",
    "min_severity",
    "timeout",
    "labels",
    "external_url",
    "ca_file",
    "bearer_token_file",
    "bearer_token_env",
)
SEVERITIES: Final = tuple(s.value for s in Severity)  # lowest first
_WHAT: Final = "collector config: alertmanager"
_TOKEN: Final = re.compile(rb"[\x21-\x7e]+")  # one word of printable ASCII: a header value


@dataclass(frozen=True, slots=True)
class AlertmanagerConfig:
    """Where alerts go and how often they are sent again; no urls: nowhere."""

    urls: tuple[str, ...] = ()
    resend_interval_s: float = 60.0  # as Prometheus' --rules.alert.resend-delay (1m)
    # Info incidents (an application's own Xid) are for the record, not for a pager.
    min_severity: Severity = Severity.WARNING
    timeout_s: float = 5.0
    labels: dict[str, str] = field(default_factory=dict)
    external_url: str = ""
    ca_file: Path | None = None
    bearer_token_file: Path | None = None
    bearer_token_env: str | None = None

    @property
    def enabled(self) -> bool:
        """Whether alerts are sent anywhere."""
        return bool(self.urls)

    def forwards(self, severity: str) -> bool:
        """Whether incidents of ``severity`` are sent (at or above ``min_severity``)."""
        rank = SEVERITIES.index
        return severity in SEVERITIES and rank(severity) >= rank(self.min_severity.value)

    def endpoints(self, environ: Mapping[str, str]) -> tuple[AlertmanagerEndpoint, ...]:
        """One endpoint per URL, with the bearer token and the CA read now.

        Raises:
            ConfigError: the token's file cannot be read, its variable is unset, either is
                empty, or the CA file is not a readable PEM bundle; the message names the key.
        """
        token = read_secret(
            self.bearer_token_file,
            self.bearer_token_env,
            environ,
            file_key="alertmanager.bearer_token_file",
            env_key="alertmanager.bearer_token_env",
        )
        if token is not None and not _TOKEN.fullmatch(token):
            key = "bearer_token_file" if self.bearer_token_env is None else "bearer_token_env"
            msg = f"{_WHAT}.{key}: the token must be one word of printable ASCII characters"
            raise ConfigError(msg)
        try:
            return tuple(
                AlertmanagerEndpoint(
                    url, timeout_s=self.timeout_s, token=token, ca_file=self.ca_file
                )
                for url in self.urls
            )
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            msg = f"{_WHAT}.ca_file {self.ca_file}: {exc}"
            raise ConfigError(msg) from exc


def _url(value: object, key: str) -> str:
    """An ``http://`` or ``https://`` URL with a host and no user, query or fragment."""
    if not isinstance(value, str) or not value:
        msg = f"{_WHAT}.{key} must be a non-empty string (a URL), got {short_repr(value)}"
        raise ConfigError(msg)
    parts = urlsplit(value)
    problem = ""
    if parts.scheme not in {"http", "https"}:
        problem = "must start with http:// or https://"
    elif not parts.hostname:
        problem = "has no host"
    elif parts.username is not None or parts.password is not None:
        problem = "must not carry user:password (bearer_token_file authenticates)"
    elif parts.query or parts.fragment:
        problem = "must not have a query or a fragment"
    else:
        try:
            _ = parts.port
        except ValueError:
            problem = "has an invalid port"
    if problem:
        msg = f"{_WHAT}.{key} {problem}, got {short_repr(value)}"
        raise ConfigError(msg)
    return value.rstrip("/")


def _labels(raw: object) -> dict[str, str]:
    """Static labels: valid names, none of fleetwatch's own, non-empty string values."""
    if not isinstance(raw, dict):
        msg = f"{_WHAT}.labels must be a table of names and strings, got {short_repr(raw)}"
        raise ConfigError(msg)
    for name, value in raw.items():
        if not valid_label(name):
            msg = f"{_WHAT}.labels: {shown_key(name)} is not a label name ([A-Za-z_][A-Za-z0-9_]*)"
            raise ConfigError(msg)
        if name in RESERVED_LABELS:
            msg = (
                f"{_WHAT}.labels: {name} is set by fleetwatch itself; "
                f"labels may not name {', '.join(sorted(RESERVED_LABELS))}"
            )
            raise ConfigError(msg)
        if not isinstance(value, str) or not value:
            msg = f"{_WHAT}.labels.{name} must be a non-empty string, got {short_repr(value)}"
            raise ConfigError(msg)
    return dict(raw)


def _path(raw: dict[str, Any], key: str) -> Path | None:
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        msg = f"{_WHAT}.{key} must be a non-empty string (a path), got {short_repr(value)}"
        raise ConfigError(msg)
    return Path(value)


def parse_alertmanager(raw: object) -> AlertmanagerConfig:
    """Check the ``alertmanager`` table; ConfigError names the key that is wrong."""
    if not isinstance(raw, dict):
        msg = f"{_WHAT} must be a table"
        raise ConfigError(msg)
    unknown = sorted(set(raw) - set(ALERTMANAGER_KEYS))
    if unknown:
        takes = ", ".join(ALERTMANAGER_KEYS)
        msg = f"{_WHAT} has no key(s) {shown_keys(unknown)}; it takes {takes}"
        raise ConfigError(msg)
    urls = raw.get("urls", [])
    if isinstance(urls, str) or not isinstance(urls, list):
        msg = f"{_WHAT}.urls must be a list of Alertmanager URLs, got {short_repr(urls)}"
        raise ConfigError(msg)
    checked = tuple(_url(url, f"urls[{i}]") for i, url in enumerate(urls))
    if len(set(checked)) != len(checked):
        msg = f"{_WHAT}.urls names one Alertmanager twice: {short_repr(list(urls))}"
        raise ConfigError(msg)
    resend = raw.get("resend_interval", 60.0)
    timeout = raw.get("timeout", 5.0)
    # at least a second: a round a second is more than Alertmanager needs (Prometheus: 1m)
    check_number(resend, "alertmanager.resend_interval", ConfigError, minimum=1.0, inclusive=True)
    check_number(timeout, "alertmanager.timeout", ConfigError)
    severity = raw.get("min_severity", Severity.WARNING.value)
    if severity not in SEVERITIES:
        shown = short_repr(severity)
        msg = f"{_WHAT}.min_severity must be one of {', '.join(SEVERITIES)}, got {shown}"
        raise ConfigError(msg)
    external = raw.get("external_url", "")
    env = raw.get("bearer_token_env")
    token_file = _path(raw, "bearer_token_file")
    check_secret_keys(
        token_file,
        env,
        file_key="alertmanager.bearer_token_file",
        env_key="alertmanager.bearer_token_env",
    )
    return AlertmanagerConfig(
        urls=checked,
        resend_interval_s=float(resend),
        min_severity=Severity(severity),
        timeout_s=float(timeout),
        labels=_labels(raw.get("labels", {})),
        external_url=_url(external, "external_url") if external != "" else "",
        ca_file=_path(raw, "ca_file"),
        bearer_token_file=token_file,
        bearer_token_env=env,
    )
