"""The ``[collector.actions]`` table: safety limits, drain adapters and notify channels.

[collector.actions]
dry_run = false                 # journal what would run, run nothing
max_drained_nodes = 4           # drained by fleetwatch at once, at most ...
max_drained_share = 0.1         # ... and at most this share of the fleet
node_cooldown = 300             # seconds between two actions of a kind on one node
breaker_window = 600            # more than breaker_max_drains drains in this window ...
breaker_max_drains = 5          # ... open the circuit breaker ...
breaker_cooldown = 3600         # ... for this long
reset_retry = 60                # seconds between asks to reset a GPU that is busy

[collector.actions.slurm]       # drain through scontrol (on a host with Slurm's client)
enabled = true
scontrol = "scontrol"
slurm_conf = "/etc/slurm/slurm.conf"   # optional: SLURM_CONF for scontrol

[collector.actions.drain_webhook]      # and/or ask another system to drain
url = "https://drainer.example/fleetwatch"
secret_file = "/etc/fleetwatch/drain.secret"

[collector.actions.notify.default]     # notify channels; rules name them (default: default)
url = "https://chat.example/hooks/abc"
secret_file = "/etc/fleetwatch/notify.secret"
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from collector.actions.dispatcher import SafetyConfig
from collector.actions.webhook import WebhookSender
from collector.exceptions import ConfigError
from fleetwatch.config_file import check_number

if TYPE_CHECKING:
    from fleetwatch.clock import Clock

WEBHOOK_KEYS: Final = frozenset({"url", "secret_file", "timeout", "max_attempts"})
SAFETY_KEYS: Final = {
    "dry_run": "dry_run",
    "max_drained_nodes": "max_drained_nodes",
    "max_drained_share": "max_drained_share",
    "node_cooldown": "node_cooldown_s",
    "breaker_window": "breaker_window_s",
    "breaker_max_drains": "breaker_max_drains",
    "breaker_cooldown": "breaker_cooldown_s",
    "reset_retry": "reset_retry_s",
}


def _boolean(value: object, key: str) -> bool:
    if not isinstance(value, bool):
        msg = f"collector config: {key} must be true or false, got {value!r}"
        raise ConfigError(msg)
    return value


def _check_safety(values: dict[str, Any]) -> None:
    """Each safety key has the type it needs: a quoted "false" must not mean anything."""
    names = {v: k for k, v in SAFETY_KEYS.items()}
    for attr, value in values.items():
        key = f"actions.{names[attr]}"
        if attr == "dry_run":
            _boolean(value, key)
        elif attr in ("max_drained_nodes", "breaker_max_drains"):
            check_number(value, key, ConfigError, inclusive=True, integer=True)
        else:
            check_number(value, key, ConfigError, inclusive=attr == "max_drained_share")


@dataclass(frozen=True, slots=True)
class WebhookConfig:
    """One webhook endpoint."""

    url: str
    secret_file: Path | None = None
    timeout_s: float = 5.0
    max_attempts: int = 5

    def sender(self, clock: Clock, key: str) -> WebhookSender:
        """Build the sender, reading the secret; ConfigError names ``key`` on any problem."""
        secret = None
        if self.secret_file is not None:
            try:
                secret = self.secret_file.read_bytes().strip()
            except OSError as exc:
                msg = f"collector config: {key}.secret_file {self.secret_file}: {exc.strerror}"
                raise ConfigError(msg) from exc
        try:
            return WebhookSender(
                self.url,
                secret or None,
                clock,
                timeout_s=self.timeout_s,
                max_attempts=self.max_attempts,
            )
        except ValueError as exc:
            msg = f"collector config: {key}: {exc}"
            raise ConfigError(msg) from exc


@dataclass(frozen=True, slots=True)
class SlurmConfig:
    """Draining through Slurm's scontrol."""

    enabled: bool = False
    scontrol: str = "scontrol"
    slurm_conf: Path | None = None


@dataclass(frozen=True, slots=True)
class ActionsConfig:
    """Everything about acting, parsed and checked."""

    safety: SafetyConfig = field(default_factory=SafetyConfig)
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    drain_webhook: WebhookConfig | None = None
    notify: dict[str, WebhookConfig] = field(default_factory=dict)


def _webhook(raw: object, key: str) -> WebhookConfig:
    if not isinstance(raw, dict) or "url" not in raw or set(raw) - WEBHOOK_KEYS:
        msg = f"collector config: {key} takes url, secret_file, timeout, max_attempts"
        raise ConfigError(msg)
    secret = raw.get("secret_file")
    return WebhookConfig(
        url=str(raw["url"]),
        secret_file=Path(secret) if secret else None,
        timeout_s=float(raw.get("timeout", 5.0)),
        max_attempts=int(raw.get("max_attempts", 5)),
    )


def parse_actions(raw: object) -> ActionsConfig:
    """Check the ``actions`` table; ConfigError names the key that is wrong."""
    if raw is None:
        return ActionsConfig()
    if not isinstance(raw, dict):
        msg = "collector config: actions must be a table"
        raise ConfigError(msg)
    table: dict[str, Any] = dict(raw)
    safety_values = {SAFETY_KEYS[k]: table.pop(k) for k in list(table) if k in SAFETY_KEYS}
    slurm_raw = table.pop("slurm", {})
    drain_raw = table.pop("drain_webhook", None)
    notify_raw = table.pop("notify", {})
    if table:
        msg = f"collector config: actions has no key(s) {', '.join(sorted(table))}"
        raise ConfigError(msg)
    _check_safety(safety_values)
    safety = SafetyConfig(**safety_values)
    if safety.max_drained_nodes < 0 or not 0 <= safety.max_drained_share <= 1:
        msg = "collector config: actions.max_drained_nodes >= 0, max_drained_share in 0..1"
        raise ConfigError(msg)
    if not isinstance(slurm_raw, dict) or set(slurm_raw) - {"enabled", "scontrol", "slurm_conf"}:
        msg = "collector config: actions.slurm takes enabled, scontrol, slurm_conf"
        raise ConfigError(msg)
    conf = slurm_raw.get("slurm_conf")
    slurm = SlurmConfig(
        enabled=_boolean(slurm_raw.get("enabled", False), "actions.slurm.enabled"),
        scontrol=str(slurm_raw.get("scontrol", "scontrol")),
        slurm_conf=Path(conf) if conf else None,
    )
    if not isinstance(notify_raw, dict):
        msg = "collector config: actions.notify must map channel names to webhooks"
        raise ConfigError(msg)
    return ActionsConfig(
        safety=safety,
        slurm=slurm,
        drain_webhook=_webhook(drain_raw, "actions.drain_webhook") if drain_raw else None,
        notify={
            str(name): _webhook(value, f"actions.notify.{name}")
            for name, value in notify_raw.items()
        },
    )
