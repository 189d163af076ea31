"""The ``[collector.actions]`` table: safety limits, drain, reboot and RMA adapters, notifying.

[collector.actions]
dry_run = false                 # journal what would run, run nothing
max_drained_nodes = 4           # drained by fleetwatch at once, at most ...
max_drained_share = 0.1         # ... and at most this share of the fleet
node_cooldown = 300             # seconds between two actions of a kind on one node
breaker_window = 600            # more than breaker_max_drains drains in this window ...
breaker_max_drains = 5          # ... open the circuit breaker ...
breaker_cooldown = 3600         # ... for this long
reset_retry = 60                # seconds between asks to reset a GPU that is busy
max_requeues = 4                # requeue_job: at most this many requeues ...
requeue_window = 3600           # ... within this many seconds, fleet-wide (this collector)
requeue_cooldown = 86400        # seconds before fleetwatch requeues the same job again
max_rebooting_nodes = 2         # reboot_node: reboots in flight at once, at most (a reboot is in
reboot_timeout = 1800           # flight until the node says hello from a new boot, or this long)
reboot_cooldown = 3600          # seconds before fleetwatch reboots the same node again

[collector.actions.slurm]       # drain through scontrol (on a host with Slurm's client)
enabled = true
scontrol = "scontrol"
slurm_conf = "/etc/slurm/slurm.conf"   # optional: SLURM_CONF for scontrol
requeue = false                 # true: rules' requeue_job actions requeue jobs (off by default)
                                # reboot_node goes through scontrol reboot ASAP nextstate=DOWN
                                # while enabled (slurm.conf needs a RebootProgram)

[collector.actions.drain_webhook]      # and/or ask another system to drain
url = "https://drainer.example/fleetwatch"
secret_file = "/etc/fleetwatch/drain.secret"  # or: secret_env = "FLEETWATCH_DRAIN_SECRET"

[collector.actions.reboot_webhook]     # and/or ask another system to reboot (reboot_node):
url = "https://reboots.example/fleetwatch"   # it drains the node first, reboots it, and
secret_env = "FLEETWATCH_REBOOT_SECRET"      # brings it back held out of service

[collector.actions.rma_webhook]        # rma_ticket: open a ticket with the vendor/RMA desk
url = "https://rma.example/fleetwatch"
secret_file = "/etc/fleetwatch/rma.secret"
max_bundle_bytes = 524288       # the evidence bundle attached up to this size; else its manifest

[collector.actions.notify.default]     # notify channels; rules name them (default: default)
url = "https://chat.example/hooks/abc"
secret_file = "/etc/fleetwatch/notify.secret"
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from collector.actions.safety import SafetyConfig
from collector.actions.webhook import WebhookSender
from collector.exceptions import ConfigError
from collector.secret_files import ENV_NAME, read_secret
from fleetwatch.config_file import check_number, short_repr, shown_key, shown_keys

if TYPE_CHECKING:
    from collections.abc import Mapping

    from fleetwatch.clock import Clock

WEBHOOK_KEYS: Final = ("url", "secret_file", "secret_env", "timeout", "max_attempts")
SAFETY_KEYS: Final = {
    "dry_run": "dry_run",
    "max_drained_nodes": "max_drained_nodes",
    "max_drained_share": "max_drained_share",
    "node_cooldown": "node_cooldown_s",
    "breaker_window": "breaker_window_s",
    "breaker_max_drains": "breaker_max_drains",
    "breaker_cooldown": "breaker_cooldown_s",
    "reset_retry": "reset_retry_s",
    "max_requeues": "max_requeues",
    "requeue_window": "requeue_window_s",
    "requeue_cooldown": "requeue_cooldown_s",
    "max_rebooting_nodes": "max_rebooting_nodes",
    "reboot_cooldown": "reboot_cooldown_s",
    "reboot_timeout": "reboot_timeout_s",
}
SLURM_KEYS: Final = ("enabled", "scontrol", "slurm_conf", "requeue")
# The webhook tables of [collector.actions] (each takes WEBHOOK_KEYS; rma_webhook RMA_KEYS).
WEBHOOK_TABLES: Final = ("drain_webhook", "reboot_webhook", "rma_webhook")
RMA_KEYS: Final = (*WEBHOOK_KEYS, "max_bundle_bytes")
# The most bytes of evidence bundle an rma_request carries by default (base64 makes it 4/3 as
# big): under a 1 MiB request limit, which many receivers (and our own) keep.
DEFAULT_MAX_BUNDLE_BYTES: Final = 512 * 1024


def _boolean(value: object, key: str) -> bool:
    if not isinstance(value, bool):
        msg = f"collector config: {key} must be true or false, got {short_repr(value)}"
        raise ConfigError(msg)
    return value


def _check_safety(values: dict[str, Any]) -> None:
    """Each safety key has the type it needs: a quoted "false" must not mean anything."""
    names = {v: k for k, v in SAFETY_KEYS.items()}
    for attr, value in values.items():
        key = f"actions.{names[attr]}"
        if attr == "dry_run":
            _boolean(value, key)
        elif attr in (
            "max_drained_nodes",
            "breaker_max_drains",
            "max_requeues",
            "max_rebooting_nodes",
        ):
            check_number(value, key, ConfigError, inclusive=True, integer=True)
        else:
            check_number(value, key, ConfigError, inclusive=attr == "max_drained_share")


@dataclass(frozen=True, slots=True)
class WebhookConfig:
    """One webhook endpoint; its secret comes from a file or an environment variable."""

    url: str
    secret_file: Path | None = None
    secret_env: str | None = None  # the name of the variable that holds the secret
    timeout_s: float = 5.0
    max_attempts: int = 5

    def secret(self, key: str, environ: Mapping[str, str]) -> bytes | None:
        """Read the secret (surrounding whitespace dropped); None when none is configured.

        Raises:
            ConfigError: the file cannot be read, the variable is unset, or either is empty;
                the message names ``key`` and the file or variable, never the secret.
        """
        return read_secret(
            self.secret_file,
            self.secret_env,
            environ,
            file_key=f"{key}.secret_file",
            env_key=f"{key}.secret_env",
        )

    def sender(self, clock: Clock, key: str, environ: Mapping[str, str]) -> WebhookSender:
        """Build the sender, reading the secret; ConfigError names ``key`` on any problem."""
        secret = self.secret(key, environ)
        try:
            return WebhookSender(
                self.url,
                secret,
                clock,
                timeout_s=self.timeout_s,
                max_attempts=self.max_attempts,
            )
        except ValueError as exc:
            msg = f"collector config: {key}: {exc}"
            raise ConfigError(msg) from exc


@dataclass(frozen=True, slots=True)
class SlurmConfig:
    """Draining (``enabled``) and requeueing jobs (``requeue``) through Slurm's scontrol."""

    enabled: bool = False
    scontrol: str = "scontrol"
    slurm_conf: Path | None = None
    requeue: bool = False


@dataclass(frozen=True, slots=True)
class ActionsConfig:
    """Everything about acting, parsed and checked."""

    safety: SafetyConfig = field(default_factory=SafetyConfig)
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    drain_webhook: WebhookConfig | None = None
    notify: dict[str, WebhookConfig] = field(default_factory=dict)
    reboot_webhook: WebhookConfig | None = None  # reboot_node's webhook (beside Slurm's)
    rma_webhook: WebhookConfig | None = None  # rma_ticket's
    rma_max_bundle_bytes: int = DEFAULT_MAX_BUNDLE_BYTES


def _webhook(raw: object, key: str, keys: tuple[str, ...] = WEBHOOK_KEYS) -> WebhookConfig:
    """Check one webhook table: known keys of the right types, at most one secret source.

    ``keys``: what the table takes (the ones beyond :data:`WEBHOOK_KEYS` are read before).
    """
    takes = f"takes {', '.join(keys)}"
    if not isinstance(raw, dict):
        msg = f"collector config: {key} must be a table that {takes}"
        raise ConfigError(msg)
    unknown = sorted(set(raw) - set(keys))
    if unknown or "url" not in raw:
        what = f"has no key(s) {shown_keys(unknown)}" if unknown else "needs a url"
        msg = f"collector config: {key} {what}; it {takes}"
        raise ConfigError(msg)
    for name in ("url", "secret_file", "secret_env"):
        if name in raw and (not isinstance(raw[name], str) or not raw[name]):
            shown = short_repr(raw[name])
            msg = f"collector config: {key}.{name} must be a non-empty string, got {shown}"
            raise ConfigError(msg)
    if "secret_file" in raw and "secret_env" in raw:
        msg = f"collector config: {key} takes secret_file or secret_env, not both"
        raise ConfigError(msg)
    env = raw.get("secret_env")
    if env is not None and not ENV_NAME.fullmatch(env):
        shown = short_repr(env)
        msg = f"collector config: {key}.secret_env must name an environment variable, got {shown}"
        raise ConfigError(msg)
    timeout = raw.get("timeout", 5.0)
    attempts = raw.get("max_attempts", 5)
    check_number(timeout, f"{key}.timeout", ConfigError)
    check_number(
        attempts, f"{key}.max_attempts", ConfigError, minimum=1, inclusive=True, integer=True
    )
    secret = raw.get("secret_file")
    return WebhookConfig(
        url=raw["url"],
        secret_file=Path(secret) if secret else None,
        secret_env=env,
        timeout_s=float(timeout),
        max_attempts=int(attempts),
    )


def _max_bundle(raw: object) -> tuple[object, int]:
    """The rma_webhook table without ``max_bundle_bytes``, and that (a whole number >= 0)."""
    if not isinstance(raw, dict) or "max_bundle_bytes" not in raw:
        return raw, DEFAULT_MAX_BUNDLE_BYTES
    table = dict(raw)
    value = table.pop("max_bundle_bytes")
    key = "actions.rma_webhook.max_bundle_bytes"
    check_number(value, key, ConfigError, inclusive=True, integer=True)
    return table, int(value)


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
    hooks_raw = {name: table.pop(name, None) for name in WEBHOOK_TABLES}
    hooks_raw["rma_webhook"], max_bundle = _max_bundle(hooks_raw["rma_webhook"])
    notify_raw = table.pop("notify", {})
    if table:
        msg = f"collector config: actions has no key(s) {shown_keys(sorted(table))}"
        raise ConfigError(msg)
    _check_safety(safety_values)
    safety = SafetyConfig(**safety_values)
    if safety.max_drained_nodes < 0 or not 0 <= safety.max_drained_share <= 1:
        msg = "collector config: actions.max_drained_nodes >= 0, max_drained_share in 0..1"
        raise ConfigError(msg)
    if not isinstance(slurm_raw, dict) or set(slurm_raw) - set(SLURM_KEYS):
        unknown = sorted(set(slurm_raw) - set(SLURM_KEYS)) if isinstance(slurm_raw, dict) else []
        has_no = f" has no key(s) {shown_keys(unknown)};" if unknown else ""
        msg = f"collector config: actions.slurm{has_no} takes {', '.join(SLURM_KEYS)}"
        raise ConfigError(msg)
    conf = slurm_raw.get("slurm_conf")
    scontrol = slurm_raw.get("scontrol", "scontrol")
    if not isinstance(scontrol, str) or not scontrol or not isinstance(conf, str | None):
        msg = "collector config: actions.slurm.scontrol and slurm_conf must be strings (paths)"
        raise ConfigError(msg)
    slurm = SlurmConfig(
        enabled=_boolean(slurm_raw.get("enabled", False), "actions.slurm.enabled"),
        scontrol=scontrol,
        slurm_conf=Path(conf) if conf else None,
        requeue=_boolean(slurm_raw.get("requeue", False), "actions.slurm.requeue"),
    )
    if not isinstance(notify_raw, dict):
        msg = "collector config: actions.notify must map channel names to webhooks"
        raise ConfigError(msg)
    hooks = {
        name: _webhook(
            raw_hook, f"actions.{name}", RMA_KEYS if name == "rma_webhook" else WEBHOOK_KEYS
        )
        if raw_hook
        else None
        for name, raw_hook in hooks_raw.items()
    }
    return ActionsConfig(
        safety=safety,
        slurm=slurm,
        drain_webhook=hooks["drain_webhook"],
        notify={
            str(name): _webhook(value, f"actions.notify.{shown_key(name)}")
            for name, value in notify_raw.items()
        },
        reboot_webhook=hooks["reboot_webhook"],
        rma_webhook=hooks["rma_webhook"],
        rma_max_bundle_bytes=max_bundle,
    )
