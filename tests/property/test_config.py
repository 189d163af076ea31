"""Config loaders (agent, collector with its actions and jobs tables, the shared TOML reader):
any TOML file or value gives a config or a ConfigError naming the file or key, never another
exception. Bugs they found are kept as examples and named tests below."""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from agent.config import load_agent_config
from agent.exceptions import ConfigError as AgentConfigError
from collector.actions.config import parse_actions
from collector.config import load_collector_config
from collector.exceptions import ConfigError as CollectorConfigError
from collector.jobs.config import JobsConfig
from fleetwatch.config_file import check_number, short_repr
from tests.property.hostile import NUMBERS, SCALARS, WEIRD_TEXT, assert_clear, nested, tried

TARGET = "config"
VALUES = st.one_of(SCALARS, nested())
ASCII = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=30)
AGENT_ANY = [
    "poll_interval",
    "heartbeat_interval",
    "counter_interval",
    "backoff_initial",
    "backoff_max",
    "job_socket_mode",
    "udev",
    "nvml_events",
    "gpu_reset",
    "no_such_key",
    "collector",
    "node",
    "kmsg_path",
    "nvidia_smi",
    "sysfs_root",
    "state_dir",
]
# String keys also get long and odd text.
AGENT_STRINGS = ["collector", "node", "kmsg_path", "nvidia_smi", "sysfs_root", "state_dir"]
COLLECTOR_ANY = [
    "heartbeat_interval",
    "missed_heartbeats",
    "poll_interval",
    "rules_interval",
    "actions",
    "jobs",
    "bogus",
    "listen",
    "http",
    "journal",
    "xid_catalog",
    "rules",
]
COLLECTOR_STRINGS = ["listen", "http", "journal", "xid_catalog"]
SAFETY = [
    "dry_run",
    "max_drained_nodes",
    "max_drained_share",
    "node_cooldown",
    "breaker_window",
    "breaker_max_drains",
    "breaker_cooldown",
    "reset_retry",
]
JOBS = [
    "straggler_margin",
    "straggler_window_steps",
    "min_drop",
    "drop_threshold",
    "fabric_share",
    "max_jobs",
    "idle_after_s",
    "nope",
]


def webhooks() -> st.SearchStrategy[object]:
    keys = ["url", "secret_file", "secret_env", "timeout", "max_attempts", "extra"]
    return st.one_of(VALUES, st.dictionaries(st.sampled_from(keys), VALUES, max_size=5))


def actions_tables() -> st.SearchStrategy[object]:
    return st.one_of(
        VALUES,
        st.fixed_dictionaries(
            {},
            optional={
                **dict.fromkeys(SAFETY, VALUES),
                "slurm": st.one_of(
                    VALUES,
                    st.dictionaries(
                        st.sampled_from(["enabled", "scontrol", "slurm_conf", "x"]), VALUES
                    ),
                ),
                "drain_webhook": webhooks(),
                "notify": st.one_of(VALUES, st.dictionaries(WEIRD_TEXT, webhooks(), max_size=3)),
                "unknown": VALUES,
            },
        ),
    )


def _finite_numbers(config: object, names: list[str]) -> None:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, float | int) and not isinstance(value, bool):
            assert math.isfinite(value), f"{name} = {value}"


class TestAgentConfig:
    @given(
        st.dictionaries(st.sampled_from(AGENT_ANY), VALUES, max_size=6),
        st.dictionaries(st.sampled_from(AGENT_STRINGS), st.text(max_size=300), max_size=3),
    )
    @example({"poll_interval": math.inf}, {})
    @example({"poll_interval": 10**400}, {})
    @example({"backoff_max": math.nan}, {})
    def test_any_values_give_config_or_config_error(self, values, strings):
        """Hostile values: an AgentConfig with finite positive intervals, or a ConfigError."""
        tried(TARGET)
        try:
            cfg = load_agent_config(None, {**values, **strings})
        except AgentConfigError as exc:
            assert_clear(exc, "config", "collector", "tls", "insecure")
            return
        _finite_numbers(cfg, AGENT_ANY)
        assert cfg.poll_interval > 0

    @given(st.binary(max_size=200))
    @example(b"\xff\xfe = 1")  # not UTF-8
    @example(b"poll_interval = " + b"9" * 5000)  # an int() beyond Python's digit limit
    @example(b"[agent]\npoll_interval = inf\n")
    @example(b"[agent]\n" + b"a = [" * 2000)
    def test_any_file_gives_config_or_config_error(self, raw):
        """Any bytes as the config file: a config or a ConfigError naming the file."""
        tried(TARGET)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "agent.toml"
            path.write_bytes(raw)
            try:
                load_agent_config(path, {})
            except AgentConfigError as exc:
                assert_clear(exc)


class TestCollectorConfig:
    @given(
        st.fixed_dictionaries(
            {},
            optional={
                **dict.fromkeys(COLLECTOR_ANY, VALUES),
                "actions": actions_tables(),
                "jobs": st.one_of(
                    VALUES, st.dictionaries(st.sampled_from(JOBS), NUMBERS, max_size=4)
                ),
            },
        ),
        st.dictionaries(st.sampled_from(COLLECTOR_STRINGS), st.text(max_size=300), max_size=2),
    )
    @example({"jobs": {"max_jobs": 10**400}}, {})  # float() overflow in check_number
    @example({"actions": {"slurm": {"slurm_conf": 5}}}, {})  # Path(5)
    @example({"actions": {"node_cooldown": math.inf}}, {})
    @example({"heartbeat_interval": 1e300}, {})
    def test_any_values_give_config_or_config_error(self, values, strings):
        """Hostile values for every table: a CollectorConfig or a ConfigError naming the key."""
        tried(TARGET)
        try:
            cfg = load_collector_config(None, {**values, **strings})
        except CollectorConfigError as exc:
            assert_clear(exc, "config", "jobs", "actions", "tls", "insecure")
            return
        _finite_numbers(cfg, COLLECTOR_ANY)
        _finite_numbers(cfg.jobs, JOBS)

    @given(st.binary(max_size=200))
    @example(b"[collector]\nrules_interval = " + b"9" * 5000)
    @example(b"\x80")
    def test_any_file_gives_config_or_config_error(self, raw):
        """Any bytes as the collector's config file: a config or a ConfigError."""
        tried(TARGET)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "collector.toml"
            path.write_bytes(raw)
            try:
                load_collector_config(path, {})
            except CollectorConfigError as exc:
                assert_clear(exc)

    @given(actions_tables())
    @example({"notify": {"x" * 5000: 5}})  # a channel's name was echoed whole
    @example({"x" * 5000: 5})  # so was an unknown key
    @example({"drain_webhook": {"url": "http://d", "x" * 5000: 1}})
    def test_actions_table(self, table):
        """The actions table alone: ActionsConfig or ConfigError naming actions."""
        tried(TARGET)
        try:
            parse_actions(table)
        except CollectorConfigError as exc:
            assert_clear(exc, "actions")

    @given(st.dictionaries(st.sampled_from(JOBS), NUMBERS, max_size=5))
    def test_jobs_table(self, table):
        """The jobs table alone: JobsConfig or ConfigError naming jobs."""
        tried(TARGET)
        try:
            JobsConfig.from_table(table)
        except CollectorConfigError as exc:
            assert_clear(exc, "jobs")


class TestCheckNumber:
    @given(VALUES, st.booleans(), st.booleans())
    @example(10**400, False, False)
    @example(math.inf, False, False)
    @example(math.nan, True, False)
    def test_number_or_error(self, value, inclusive, integer):
        """check_number passes finite numbers in range and raises the given error otherwise."""
        tried(TARGET)
        try:
            check_number(value, "k", ValueError, inclusive=inclusive, integer=integer)
        except ValueError as exc:
            assert_clear(exc, "k must be")
            return
        assert isinstance(value, int | float)
        assert math.isfinite(value)
        assert value >= 0

    @given(VALUES)
    def test_short_repr_is_short(self, value):
        """short_repr never raises and never returns more than 80 characters."""
        tried(TARGET)
        assert len(short_repr(value)) <= 80


@pytest.mark.parametrize(
    "overrides",
    [
        {"collector": 5},
        {"node": 5},
        {"kmsg_path": 5},
        {"sysfs_root": 5},
        {"state_dir": ["a"]},
    ],
    ids=["collector-int", "node-int", "kmsg-int", "path-int", "path-list"],
)
def test_agent_config_wrong_types_are_config_errors(overrides):
    """A non-string address, name or path is a ConfigError naming the key, not a TypeError."""
    with pytest.raises(AgentConfigError) as info:
        load_agent_config(None, overrides)
    assert_clear(info.value, next(iter(overrides)))


@pytest.mark.parametrize("key", ["collector", "udev", "job_socket_mode"])
def test_agent_config_long_values_are_cut_in_messages(key):
    """A 5000-character value is not echoed whole in the ConfigError."""
    with pytest.raises(AgentConfigError) as info:
        load_agent_config(None, {key: "x" * 5000})
    assert_clear(info.value, key)


@pytest.mark.parametrize(
    "overrides",
    [{"listen": 5}, {"listen": "host:²"}, {"journal": 5}, {"rules": [5]}],
    ids=["listen-int", "listen-superscript", "journal-int", "rules-int"],
)
def test_collector_config_wrong_types_are_config_errors(overrides):
    """These were TypeError/AttributeError/ValueError before; now each is a ConfigError."""
    with pytest.raises(CollectorConfigError) as info:
        load_collector_config(None, overrides)
    assert_clear(info.value, next(iter(overrides)))
