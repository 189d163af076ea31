from pathlib import Path

import pytest

from agent.config import load_agent_config
from agent.exceptions import ConfigError as AgentConfigError
from agent.link.backoff import Backoff
from collector.config import load_collector_config
from collector.exceptions import ConfigError as CollectorConfigError


class TestAgentConfig:
    def test_file_then_flags(self, tmp_path: Path):
        """Command-line values override the file; the file overrides defaults."""
        path = tmp_path / "agent.toml"
        path.write_text('[agent]\ncollector = "c:1"\npoll_interval = 2\nsysfs_root = "/x"\n')
        cfg = load_agent_config(path, {"poll_interval": 3.0, "node": None})
        assert (cfg.collector, cfg.poll_interval, cfg.sysfs_root) == ("c:1", 3.0, Path("/x"))

    @pytest.mark.parametrize(
        ("text", "message"),
        [
            ("[agent]\npoll_intervl = 2\n", "unknown key.*poll_intervl"),
            ('[agent]\npoll_interval = "fast"\n', "poll_interval must be a number"),
            ("[agent]\nheartbeat_interval = -1\n", "heartbeat_interval"),
            ("[agent]\ngauge_interval = -1\n", "gauge_interval must be a number >= 0"),
            ('[agent]\ncollector = "nohost"\n', "host:port"),
            ('[agent]\ngpu_reset = "false"\n', "gpu_reset must be true or false"),
            ("[agent\n", "invalid TOML"),
        ],
    )
    def test_broken_file_names_the_key(self, tmp_path: Path, text, message):
        """A broken config says which key or line is wrong."""
        path = tmp_path / "agent.toml"
        path.write_text(text)
        with pytest.raises(AgentConfigError, match=message):
            load_agent_config(path, {})


class TestCollectorIngestConfig:
    def test_the_ingest_table_sets_the_budgets(self, tmp_path: Path):
        path = tmp_path / "collector.toml"
        path.write_text("[collector.ingest]\nevents_per_s = 50\nrepeat_burst = 7\n")
        limits = load_collector_config(path, {}).ingest
        assert (limits.events_per_s, limits.repeat_burst, limits.event_burst) == (50, 7, 10_000)

    @pytest.mark.parametrize(
        ("text", "message"),
        [
            ("[collector.ingest]\nevents_per_sec = 5\n", "unknown keys events_per_sec"),
            ('[collector.ingest]\nevents_per_s = "lots"\n', "ingest.events_per_s must be"),
            ("[collector.ingest]\nsample_burst = 0\n", "ingest.sample_burst must be"),
            ("[collector.ingest]\nrepeat_burst = 2.5\n", "ingest.repeat_burst must be an int"),
            ("[collector]\ningest = 3\n", "collector.ingest must be a table"),
        ],
    )
    def test_bad_ingest_values_are_named(self, tmp_path: Path, text: str, message: str):
        path = tmp_path / "collector.toml"
        path.write_text(text)
        with pytest.raises(CollectorConfigError, match=message):
            load_collector_config(path, {})


class TestCollectorConfig:
    @pytest.mark.parametrize(
        ("overrides", "message"),
        [
            ({"listen": "7070"}, "listen must be host:port"),
            ({"http": "x:99999"}, "http must be host:port"),
            ({"missed_heartbeats": 0}, "missed_heartbeats must be an integer"),
            ({"heartbeat_interval": 0}, "heartbeat_interval"),
        ],
    )
    def test_bad_values_name_the_key(self, overrides, message):
        """Each bad setting is refused by name."""
        with pytest.raises(CollectorConfigError, match=message):
            load_collector_config(None, overrides)

    def test_missing_file(self, tmp_path: Path):
        """A config path that does not exist is a clear error."""
        with pytest.raises(CollectorConfigError, match="cannot read"):
            load_collector_config(tmp_path / "nope.toml", {})

    @pytest.mark.parametrize(
        ("line", "message"),
        [
            ('dry_run = "false"', "actions.dry_run must be true or false"),
            ('max_drained_nodes = "4"', "actions.max_drained_nodes must be"),
            ("max_drained_nodes = 2.5", "actions.max_drained_nodes must be an integer"),
            ("node_cooldown = -5", "actions.node_cooldown"),
            ("reset_retry = 0", "actions.reset_retry"),
            ('[collector.actions.slurm]\nenabled = "false"', "actions.slurm.enabled must be"),
        ],
    )
    def test_safety_values_are_typed(self, tmp_path: Path, line, message):
        """A quoted "false" must not turn dry-run on or off by accident: it is refused."""
        path = tmp_path / "collector.toml"
        path.write_text(f"[collector.actions]\n{line}\n")
        with pytest.raises(CollectorConfigError, match=message):
            load_collector_config(path, {})

    def test_xid_catalog_path(self, tmp_path: Path):
        """The collector reads the Xid catalog the config names (the agent's may differ)."""
        path = tmp_path / "collector.toml"
        path.write_text('[collector]\nxid_catalog = "/etc/fleetwatch/xids.yaml"\n')
        cfg = load_collector_config(path, {})
        assert cfg.xid_catalog == Path("/etc/fleetwatch/xids.yaml")

    async def test_rules_use_the_configured_catalog(self, tmp_path: Path, collector_config):
        """A site that treats Xid 13 as a reset case gets that from its catalog file."""
        from collector.main import CollectorService  # noqa: PLC0415
        from fleetwatch.clock import SystemClock  # noqa: PLC0415

        catalog = tmp_path / "xids.yaml"
        catalog.write_text(
            "version: 1\nxids:\n"
            "  13: {name: Graphics engine exception, class: engine, action: RESET_GPU, "
            "fatal: true}\n"
        )
        service = CollectorService(collector_config(xid_catalog=catalog), SystemClock())
        await service.start()
        try:
            assert service.evaluator.catalog.class_of(13) == "engine"
        finally:
            await service.stop(grace=None)


class TestBackoff:
    def test_grows_within_cap_and_resets(self):
        """Delays stay under a doubling ceiling capped at ``cap``; reset starts over."""
        backoff = Backoff(0.5, 4.0)
        ceilings = [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
        for ceiling in ceilings:
            assert 0 < backoff.next_delay() <= ceiling
        backoff.reset()
        assert backoff.next_delay() <= 0.5

    def test_rejects_nonsense(self):
        """A cap below the first delay is a configuration error."""
        with pytest.raises(ValueError, match="initial"):
            Backoff(5, 1)


class TestShippedConfigs:
    def test_example_configs_in_deploy_load(self):
        """The configs under deploy/ are valid and say what they seem to say."""
        root = Path(__file__).resolve().parents[3] / "deploy" / "config"
        agent = load_agent_config(root / "agent.toml", {})
        assert agent.collector == "collector.example.internal:7070"
        assert agent.counter_interval == 30.0
        assert agent.gauge_interval == 5.0
        collector = load_collector_config(root / "collector.toml", {})
        assert collector.listen == "0.0.0.0:7070"
        assert collector.missed_heartbeats == 3
