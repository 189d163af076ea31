"""What the demo's collector runs with: the built-in rules on demo timing, actions to a webhook.

Demo timing: the built-in rules wait 30 s to 5 min before they fire (``for``) and minutes before
they resolve (``keep_firing_for``), so that a blip pages nobody. The demo plays a scenario of
about 30 s, so it loads the built-in rules with every such duration divided by
:data:`RULE_TIME_DIVISOR` (30 s becomes 1 s, 5 min becomes 10 s), and by as much again when
``--duration`` compresses the scenario. Only the demo does this; conditions, windows inside them,
severities and actions are the built-in ones, unchanged.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any, Final

import yaml

from collector.actions.config import ActionsConfig, WebhookConfig
from rules.durations import parse_duration
from rules.loader import BUILTIN

if TYPE_CHECKING:
    from pathlib import Path

RULE_TIME_DIVISOR: Final = 30.0
TIMED_KEYS: Final = ("for", "keep_firing_for")
HEADER: Final = """\
# DEMO TIMING ONLY, written by `fleetwatch demo`: the built-in rules (rules/default.yaml) with
# every `for` and `keep_firing_for` divided by {divisor:g}, so that they fire and resolve within a
# demo of a few seconds. Never use this file on a real fleet.
"""


@dataclass(frozen=True, slots=True)
class DemoRules:
    """The demo's rule file and what its timing changed: (rule, key, built-in s, demo s)."""

    path: Path
    divisor: float
    changes: tuple[tuple[str, str, float, float], ...]

    def describe(self) -> list[str]:
        """Lines for the demo's header, saying plainly that the timing is the demo's."""
        shown = next((c for c in self.changes if c[:2] == ("nvlink_down", "for")), None)
        shown = shown or (self.changes[0] if self.changes else None)
        example = f" ({shown[0]} {shown[1]}: {shown[2]:g}s -> {shown[3]:g}s)" if shown else ""
        return [
            (
                "  rules      the built-in rules on DEMO TIMING: every for and keep_firing_for "
                f"divided by {self.divisor:g}{example}"
            ),
            f"             {self.path}",
        ]


def demo_rules(workdir: Path, divisor: float) -> DemoRules:
    """Write the built-in rules with ``for``/``keep_firing_for`` divided by ``divisor``."""
    if divisor <= 0:
        msg = "the rule time divisor must be positive"
        raise ValueError(msg)
    text = resources.files(BUILTIN[0]).joinpath(BUILTIN[1]).read_text("utf-8")
    data: dict[str, Any] = yaml.safe_load(text)
    changes: list[tuple[str, str, float, float]] = []
    for rule in data["rules"]:
        for key in TIMED_KEYS:
            if key not in rule:
                continue
            seconds = parse_duration(rule[key])
            if seconds > 0:
                rule[key] = round(seconds / divisor, 3)
                changes.append((str(rule["name"]), key, seconds, rule[key]))
    path = workdir / "rules-demo-timing.yaml"
    body = yaml.safe_dump(data, sort_keys=False, width=100, allow_unicode=True)
    path.write_text(HEADER.format(divisor=divisor) + body, "utf-8")
    return DemoRules(path, divisor, tuple(changes))


def write_secret(workdir: Path) -> tuple[bytes, Path]:
    """A fresh webhook secret, and the file (mode 0600) the collector reads it from."""
    secret = secrets.token_hex(16).encode()
    path = workdir / "webhook.secret"
    path.touch(mode=0o600)
    path.write_bytes(secret + b"\n")
    return secret, path


def demo_actions(receiver_url: str, secret_file: Path) -> ActionsConfig:
    """Drain and notify through signed webhooks to the demo's receiver.

    Safety limits are the defaults a real collector has (drain cap, cooldowns, breaker), and
    nothing is a dry run: what the rules ask for really runs, against the local receiver.
    """

    def hook(path: str) -> WebhookConfig:
        return WebhookConfig(url=f"{receiver_url}{path}", secret_file=secret_file, max_attempts=2)

    return ActionsConfig(drain_webhook=hook("/drain"), notify={"default": hook("/notify")})


def actions_note(receiver_url: str) -> list[str]:
    """Lines for the demo's header: where the actions go."""
    return [
        "  actions    run for real (no dry run), with the shipped safety limits: drain_node and",
        f"             notify are signed webhooks to a local receiver at {receiver_url},",
        "             reset_gpu goes down the stream to the node's agent (simulated GPU)",
    ]
