import dataclasses
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from agent.config import AgentConfig, load_agent_config
from agent.link.intervals import Intervals
from agent.outbox.changes import LiveSamples
from agent.reload import FAILURES_SIGNAL, LIVE_KEYS, OK_SIGNAL, RESTART_KEYS, AgentReloader
from fleetwatch.model import Target
from fleetwatch.testing import FakeClock
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb

GOOD = '[agent]\ncollector = "127.0.0.1:7070"\nnode = "gpu-1"\npoll_interval = 5\n'


@pytest.fixture
def setup(tmp_path: Path):
    path = tmp_path / "agent.toml"
    path.write_text(GOOD)
    cfg = load_agent_config(path, {})
    intervals = Intervals(poll=cfg.poll_interval, heartbeat=cfg.heartbeat_interval)
    live = LiveSamples()
    levels: list[str] = []
    reloader = AgentReloader(
        cfg=cfg,
        load=lambda: load_agent_config(path, {}),
        path=path,
        intervals=intervals,
        live=live,
        clock=FakeClock(),
        set_log_level=levels.append,
    )
    return path, reloader, intervals, live, levels


def node_values(live: LiveSamples) -> tuple[object, object]:
    node = Target.node()
    return live.values[node, OK_SIGNAL], live.values[node, FAILURES_SIGNAL]


class TestAgentReload:
    def test_keys_are_live_or_need_a_restart(self):
        """Every agent key is decided; what the agent opened at start needs a restart."""
        names = {f.name for f in dataclasses.fields(AgentConfig)}
        assert set(LIVE_KEYS) | set(RESTART_KEYS) == names
        assert {"node", "collector", "tls_cert", "state_dir"} <= set(RESTART_KEYS)

    def test_starts_with_a_good_reload_state(self, setup):
        """Before any reload the collector hears: last reload fine, no failures."""
        _, _, _, live, _ = setup
        assert node_values(live) == (1, 0)

    def test_a_valid_file_changes_intervals_and_log_level(self, setup):
        """New poll and heartbeat intervals and log level take effect at once."""
        path, reloader, intervals, live, levels = setup
        path.write_text(
            GOOD.replace("poll_interval = 5", "poll_interval = 2")
            + ('heartbeat_interval = 3\nlog_level = "debug"\n')
        )
        assert reloader.reload()
        assert (intervals.poll, intervals.heartbeat) == (2.0, 3.0)
        assert levels == ["debug"]
        assert node_values(live) == (1, 0)

    def test_an_invalid_file_keeps_the_last_good_one(self, setup):
        """A bad value: nothing changes, the error names file and line, the samples say so."""
        path, reloader, intervals, live, _ = setup
        path.write_text(
            GOOD.replace("poll_interval = 5", "poll_interval = 1") + "\nbackoff_max = -1\n"
        )
        with capture_logs() as logs:
            assert not reloader.reload()
        assert intervals.poll == 5.0
        assert reloader.cfg.poll_interval == 5.0
        [failed] = [e for e in logs if e["event"] == "config_reload_failed"]
        assert (failed["file"], failed["line"], failed["log_level"]) == (str(path), 6, "error")
        assert failed["error"].startswith(f"{path}:6: ")
        assert "backoff_max" in failed["error"]
        assert node_values(live) == (0, 1)
        path.write_text(GOOD)
        assert reloader.reload()
        assert node_values(live) == (1, 1)

    def test_broken_toml_names_line_and_column(self, setup):
        """A syntax error: tomllib's line and column."""
        path, reloader, _, _, _ = setup
        path.write_text(GOOD + "heartbeat_interval = = 2\n")
        with capture_logs() as logs:
            assert not reloader.reload()
        [failed] = [e for e in logs if e["event"] == "config_reload_failed"]
        assert (failed["line"], failed["column"]) == (5, 22)

    def test_restart_only_keys_are_named_and_kept(self, setup):
        """A new node name or collector address waits for a restart; a warning names each."""
        path, reloader, intervals, _, _ = setup
        path.write_text(
            GOOD.replace("gpu-1", "gpu-2").replace("7070", "7071").replace("= 5", "= 4")
        )
        with capture_logs() as logs:
            assert reloader.reload()
        warned = sorted(e["key"] for e in logs if e["event"] == "config_reload_needs_restart")
        assert warned == ["collector", "node"]
        assert (reloader.cfg.node, reloader.cfg.collector) == ("gpu-1", "127.0.0.1:7070")
        assert intervals.poll == 4.0

    def test_the_collectors_interval_wins(self, setup):
        """An interval the collector set stays until the agent reconnects, as at start."""
        path, reloader, intervals, _, _ = setup
        intervals.apply(pb.Config(poll_interval_ms=10_000))
        path.write_text(GOOD.replace("poll_interval = 5", "poll_interval = 2"))
        assert reloader.reload()
        assert intervals.poll == 10.0
