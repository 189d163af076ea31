"""deploy/config/*.toml list every key the loaders take (a commented ``# key = ...`` counts).

The keys are read from the code: the config dataclasses and the key tables the loaders check
against (agent/config.py, agent/bmc_config.py, collector/config.py, collector/actions/config.py,
collector/actions/alertmanager_config.py, collector/jobs/config.py, collector/ingest/throttle.py),
not from a list kept here. That the
examples still pass ``fleetwatch config check`` with every commented key switched on is
tests/unit/cli/test_config_check.py's ``test_every_documented_key_is_valid``.
"""

import dataclasses
import re
import typing
from collections import defaultdict
from pathlib import Path

import pytest

from agent.bmc_config import BmcConfig
from agent.config import AgentConfig
from cli.config_keys import accepted_keys
from collector.actions.alertmanager_config import ALERTMANAGER_KEYS
from collector.actions.config import (
    RMA_KEYS,
    SAFETY_KEYS,
    SLURM_KEYS,
    WEBHOOK_KEYS,
    ActionsConfig,
    SlurmConfig,
    WebhookConfig,
)
from collector.actions.safety import SafetyConfig
from collector.config import CollectorConfig
from collector.ingest.throttle import IngestLimits
from collector.jobs.config import JobsConfig

EXAMPLES = Path(__file__).resolve().parents[3] / "deploy" / "config"
# ``[collector.actions.notify.NAME]``: each channel is a table of the same keys.
CHANNELS = "collector.actions.notify"
_HEADER = re.compile(r"^#?\s*\[([\w.]+)\]")
_KEY = re.compile(r"^#?\s*(\w+)\s*=")


def names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def accepted(kind: str) -> dict[str, set[str]]:
    """Each table's keys, as the loaders take them (``CHANNELS.*``: any channel)."""
    if kind == "agent":
        return {"agent": names(AgentConfig), "agent.bmc": names(BmcConfig)}
    return {
        "collector": names(CollectorConfig),
        # parse_actions takes the safety keys, then one key per part of ActionsConfig but safety
        # (and the RMA webhook's bundle limit, a key of that webhook's table)
        "collector.actions": set(SAFETY_KEYS)
        | names(ActionsConfig) - {"safety", "rma_max_bundle_bytes"},
        "collector.actions.slurm": set(SLURM_KEYS),
        "collector.actions.drain_webhook": set(WEBHOOK_KEYS),
        "collector.actions.reboot_webhook": set(WEBHOOK_KEYS),
        "collector.actions.rma_webhook": set(RMA_KEYS),
        f"{CHANNELS}.*": set(WEBHOOK_KEYS),
        "collector.alertmanager": set(ALERTMANAGER_KEYS),
        "collector.jobs": names(JobsConfig),
        "collector.ingest": names(IngestLimits),
    }


def listed(text: str) -> dict[str, set[str]]:
    """The keys an example names in each table, commented or not; a table names its key."""
    found: dict[str, set[str]] = defaultdict(set)
    table = ""
    for line in text.splitlines():
        header, key = _HEADER.match(line), _KEY.match(line)
        if header is not None:
            parts = header[1].split(".")
            if ".".join(parts[:-1]) == CHANNELS:
                parts[-1] = "*"
            for end in range(1, len(parts)):
                found[".".join(parts[:end])].add(parts[end])
            table = ".".join(parts)
            found[table] |= set()
        elif key is not None and table:
            found[table].add(key[1])
    return found


def missing(kind: str, text: str) -> list[str]:
    """``[table] key`` for each key the loaders take that ``text`` does not name."""
    found = listed(text)
    return [
        f"[{table}] {key}"
        for table, keys in accepted(kind).items()
        for key in sorted(keys - found[table])
    ]


class TestExamplesListEveryKey:
    @pytest.mark.parametrize("kind", ["agent", "collector"])
    def test_every_key_the_loader_takes_is_listed(self, kind: str):
        """Each key of each table (sub-tables and notify channels included) is in the file."""
        text = (EXAMPLES / f"{kind}.toml").read_text()
        assert missing(kind, text) == [], f"deploy/config/{kind}.toml lacks these keys"

    @pytest.mark.parametrize(
        ("kind", "line", "named"),
        [
            ("agent", "# proc_root = ", "[agent] proc_root"),
            ("agent", "# backoff_max = ", "[agent] backoff_max"),
            ("agent", "# [agent.bmc]", "[agent] bmc"),
            ("collector", "# preflight_gates = ", "[collector] preflight_gates"),
            ("collector", "# [collector.ingest]", "[collector] ingest"),
            ("collector", "# hold_s = ", "[collector.ingest] hold_s"),
            (
                "collector",
                "# max_attempts = 5\n# [collector.actions.notify",
                f"[{CHANNELS}.*] max_attempts",
            ),
        ],
    )
    def test_a_key_left_out_is_named(self, kind: str, line: str, named: str):
        """Without one of its lines an example fails, naming the table and the key."""
        text = (EXAMPLES / f"{kind}.toml").read_text()
        start = text.index(line)
        cut = text[:start] + text[text.index("\n", start) + 1 :]
        assert any(entry.startswith(named) for entry in missing(kind, cut)), missing(kind, cut)

    def test_the_key_tables_cover_the_dataclasses(self):
        """What the loaders check keys against builds what they configure: Slurm's keys are
        its dataclass, each safety key sets a safety limit, each webhook key a field."""
        assert set(SLURM_KEYS) == names(SlurmConfig)
        assert set(SAFETY_KEYS.values()) <= names(SafetyConfig)
        webhook = {key.removesuffix("_s") for key in names(WebhookConfig)}
        assert set(WEBHOOK_KEYS) == webhook

    @pytest.mark.parametrize(
        ("kind", "cls"), [("agent", AgentConfig), ("collector", CollectorConfig)]
    )
    def test_every_table_field_is_a_table_here(self, kind: str, cls: type):
        """A field whose value is a config dataclass of its own is a sub-table with keys
        listed here (a new one would otherwise go unchecked)."""
        hints = typing.get_type_hints(cls)
        tables = {
            field.name
            for field in dataclasses.fields(cls)
            if any(
                dataclasses.is_dataclass(t)
                for t in (hints[field.name], *typing.get_args(hints[field.name]))
            )
        }
        assert {f"{kind}.{name}" for name in tables} <= accepted(kind).keys()

    @pytest.mark.parametrize("kind", ["agent", "collector"])
    def test_config_check_suggests_from_the_same_keys(self, kind: str):
        """``did you mean`` picks from the keys the loaders take: the same tables and keys."""
        ours = {
            (f"{kind}.{table}" if table else kind): set(keys)
            for table, keys in accepted_keys(kind).items()
        }
        assert ours == accepted(kind)
