"""The agent's collector list: config keys, where a node starts, the failover order and delays."""

from collections import Counter
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from agent.config import AgentConfig, load_agent_config
from agent.exceptions import ConfigError
from agent.link.backoff import Backoff
from agent.link.collector_list import (
    MAX_COLLECTORS,
    CollectorRotation,
    check_collectors,
    split_flag,
    start_index,
)
from agent.link.intervals import Intervals
from agent.link.tls import tls_material
from agent.outbox.changes import LiveSamples
from agent.reload import AgentReloader
from fleetwatch.config_lines import config_problem
from fleetwatch.testing import FakeClock


def load(tmp_path: Path, body: str, **overrides: object) -> AgentConfig:
    path = tmp_path / "agent.toml"
    path.write_text(f"[agent]\n{body}\n")
    return load_agent_config(path, overrides)


class TestCollectorKeys:
    def test_a_list_of_collectors(self, tmp_path: Path):
        """``collectors`` lists several addresses, kept in the file's order."""
        cfg = load(tmp_path, 'collectors = ["a:7070", "b:7070", "[fd00::5]:7070"]')
        assert cfg.targets == ("a:7070", "b:7070", "[fd00::5]:7070")
        assert cfg.collector is None

    def test_the_single_collector_key_is_a_one_entry_list(self, tmp_path: Path):
        """The older ``collector = "host:port"`` still works: a list of one."""
        cfg = load(tmp_path, 'collector = "c.example:7070"')
        assert cfg.targets == ("c.example:7070",)
        assert cfg.collector == "c.example:7070"

    def test_neither_key_means_the_local_collector(self, tmp_path: Path):
        """Without either key the agent streams to 127.0.0.1:7070, as before."""
        assert load(tmp_path, "").targets == ("127.0.0.1:7070",)

    def test_both_keys_are_refused_naming_them(self, tmp_path: Path):
        """``collector`` and ``collectors`` together are a contradiction, placed at its line."""
        path = tmp_path / "agent.toml"
        path.write_text('[agent]\nnode = "n"\ncollector = "a:7070"\ncollectors = ["a:7070"]\n')
        with pytest.raises(ConfigError, match="collector and collectors are both set") as info:
            load_agent_config(path, {})
        assert config_problem(path, "agent", str(info.value)).line == 3

    @pytest.mark.parametrize(
        ("body", "message"),
        [
            ('collectors = "a:7070"', r"collectors must be a list of host:port strings"),
            ("collectors = []", r"collectors must list at least one host:port"),
            ('collectors = ["a:7070", "nohost"]', r"collectors\[1\] must be host:port.*'nohost'"),
            ('collectors = ["a:7070", "b:0"]', r"collectors\[1\] must be host:port.*'b:0'"),
            ('collectors = ["a:99999"]', r"collectors\[0\] must be host:port.*'a:99999'"),
            ('collectors = [":7070"]', r"collectors\[0\] must be host:port"),
            ('collectors = ["a :7070"]', r"collectors\[0\] must be host:port"),
            ('collectors = ["fd00::5:7070"]', r"collectors\[0\] must be host:port"),
            ('collectors = ["a:7070", 7070]', r"collectors\[1\] must be host:port.*7070"),
            ('collectors = ["a:7070,b:7070"]', r"collectors\[0\] must be one host:port"),
            ('collector = "a:7070,b:7070"', r"collector must be one host:port.*collectors = \["),
            ('collector = "nohost"', r"collector must be host:port, got 'nohost'"),
        ],
    )
    def test_bad_entries_are_named(self, tmp_path: Path, body: str, message: str):
        """Each bad value names the key, the entry's position and the entry."""
        with pytest.raises(ConfigError, match=message):
            load(tmp_path, body)

    def test_duplicates_are_refused(self, tmp_path: Path):
        """The same collector twice (host names ignore case) names both positions."""
        with pytest.raises(ConfigError, match=r"collectors\[2\] repeats collectors\[0\]"):
            load(tmp_path, 'collectors = ["a.example:7070", "b:7070", "A.Example:7070"]')

    def test_the_list_is_bounded(self):
        """More than 32 collectors is a mistake (a generated list gone wrong), not a fleet."""
        many = [f"c{i}:7070" for i in range(MAX_COLLECTORS + 1)]
        with pytest.raises(ConfigError, match="collectors lists 33 collectors, at most 32"):
            check_collectors(many)
        assert len(check_collectors(many[:MAX_COLLECTORS])) == MAX_COLLECTORS

    def test_a_bad_entry_is_placed_at_its_key(self, tmp_path: Path):
        """The error of an entry of a multi-line list points at the ``collectors`` line."""
        path = tmp_path / "agent.toml"
        path.write_text('[agent]\nnode = "n"\ncollectors = [\n  "a:7070",\n  "b",\n]\n')
        with pytest.raises(ConfigError) as info:
            load_agent_config(path, {})
        assert config_problem(path, "agent", str(info.value)).line == 3

    def test_the_config_stays_immutable(self):
        """A list given in code is kept as a tuple: the frozen config cannot change under us."""
        cfg = AgentConfig(collectors=["a:1", "b:1"])  # type: ignore[arg-type]
        assert cfg.collectors == ("a:1", "b:1")


class TestCollectorFlag:
    def test_a_comma_list_replaces_the_files_list(self, tmp_path: Path):
        """``--collector a,b`` overrides whichever key the file has, as every flag does."""
        cfg = load(tmp_path, 'collectors = ["x:1", "y:1"]', collector="a:7070, b:7070")
        assert cfg.targets == ("a:7070", "b:7070")
        cfg = load(tmp_path, 'collector = "x:1"', collector="a:7070,b:7070")
        assert cfg.targets == ("a:7070", "b:7070")

    def test_one_address_is_the_single_key(self, tmp_path: Path):
        """``--collector a:7070`` over a file's list gives the list of one."""
        cfg = load(tmp_path, 'collectors = ["x:1", "y:1"]', collector="a:7070")
        assert (cfg.targets, cfg.collector) == (("a:7070",), "a:7070")

    def test_a_repeated_flag_gives_the_same_list(self):
        """A flag given several times (a list of values) reads like one comma list."""
        assert split_flag(["a:1", "b:1,c:1"]) == split_flag("a:1,b:1,c:1") == ("a:1", "b:1", "c:1")

    @pytest.mark.parametrize(
        ("value", "message"),
        [
            ("a:1,,b:1", r"collector\[1\] must be host:port, got ''"),
            ("a:1,a:1", r"collector\[1\] repeats collector\[0\]"),
            ("nohost", r"collector must be host:port"),
            (5, r"collector must be host:port, got 5"),
        ],
    )
    def test_bad_flags_are_named(self, value: object, message: str):
        """A bad ``--collector`` names the flag's key and the entry."""
        with pytest.raises(ConfigError, match=message):
            load_agent_config(None, {"collector": value})


class TestStartIndex:
    @pytest.mark.parametrize(
        ("node", "count", "index"),
        [("gpu-node-017", 3, 1), ("node-1", 3, 0), ("gpu-node-017", 32, 16), ("node-2", 32, 22)],
    )
    def test_stable_across_processes(self, node: str, count: int, index: int):
        """The start is a function of the name alone (SHA-256, not Python's salted hash):
        these values hold in every process and on every host."""
        assert index == start_index(node, count)

    def test_a_fleet_spreads_evenly(self):
        """300 nodes over 3 collectors: each collector gets about a third."""
        counts = Counter(start_index(f"gpu-node-{i:03d}", 3) for i in range(300))
        assert set(counts) == {0, 1, 2}
        assert all(70 <= n <= 130 for n in counts.values()), counts

    def test_always_in_the_list(self):
        """Any name, any list length: an index into the list."""
        for count in range(1, MAX_COLLECTORS + 1):
            assert all(0 <= start_index(f"n{i}", count) < count for i in range(50))


class TestRotation:
    def test_round_robin_from_the_nodes_own(self):
        """Failures walk the list from the node's own collector and wrap around."""
        rotation = CollectorRotation(["a", "b", "c", "d"], start=2)
        order = [rotation.current]
        for _ in range(4):
            rotation.failed()
            order.append(rotation.current)
        assert order == ["c", "d", "a", "b", "c"]
        assert rotation.moves == 4

    def test_a_round_ends_after_every_collector_failed(self):
        """Only a failure of each collector in a row ends a round (the backoff grows then)."""
        rotation = CollectorRotation(["a", "b", "c"])
        assert [rotation.failed() for _ in range(6)] == [False, False, True] * 2

    def test_a_healthy_connection_starts_a_new_round(self):
        """After a collector served a while, its failure starts counting from zero again."""
        rotation = CollectorRotation(["a", "b", "c"])
        rotation.failed()
        rotation.failed()
        rotation.healthy()
        assert [rotation.failed() for _ in range(3)] == [False, False, True]

    def test_away_from_home_until_back_by_failures(self):
        """``away`` says the node is not on its own collector; it does not move back by itself."""
        rotation = CollectorRotation(["a", "b"], start=1)
        assert (rotation.current, rotation.away) == ("b", False)
        rotation.failed()
        assert (rotation.current, rotation.away) == ("a", True)
        rotation.healthy()
        assert (rotation.current, rotation.away) == ("a", True)

    def test_one_collector_never_moves(self):
        """A list of one retries the same collector, each failure a round: as before lists."""
        rotation = CollectorRotation(["a"])
        assert [rotation.failed() for _ in range(3)] == [True, True, True]
        assert (rotation.current, rotation.moves) == ("a", 0)


class TestFailoverDelays:
    def test_the_backoff_grows_only_after_a_failed_round(self):
        """Moving to the next collector waits at most the first window; the window doubles
        once per round in which every collector failed."""
        backoff = Backoff(0.5, 30.0)
        rotation = CollectorRotation(["a", "b", "c"])
        delays, windows = [], []
        for _ in range(9):
            delays.append(rotation.next_try(backoff, healthy=False))
            windows.append(backoff.window)
        assert all(d <= 0.5 for d in delays[:3])
        assert all(d <= 1.0 for d in delays[3:6])
        assert windows == [0.5, 0.5, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 4.0]

    def test_after_a_healthy_stream_the_next_collector_comes_at_once(self):
        """A collector that served for a while and dies: the next try waits the first window."""
        backoff = Backoff(0.5, 30.0)
        rotation = CollectorRotation(["a", "b"])
        for _ in range(8):
            rotation.next_try(backoff, healthy=False)
        assert backoff.window == 8.0
        assert rotation.next_try(backoff, healthy=True) <= 0.5
        assert rotation.current == "b"

    def test_one_collector_backs_off_as_before(self):
        """With one collector every failure grows the window, as the link always did."""
        backoff = Backoff(0.5, 4.0)
        rotation = CollectorRotation(["a"])
        windows = []
        for _ in range(5):
            rotation.next_try(backoff, healthy=False)
            windows.append(backoff.window)
        assert windows == [1.0, 2.0, 4.0, 4.0, 4.0]

    def test_draw_does_not_grow(self):
        """``draw`` keeps the window; ``grow`` doubles it up to the cap."""
        backoff = Backoff(0.5, 1.0)
        assert all(backoff.draw() <= 0.5 for _ in range(20))
        backoff.grow()
        backoff.grow()
        assert backoff.window == 1.0


class TestTlsAndReload:
    def test_every_collector_must_be_loopback_for_plaintext(self):
        """Without TLS one remote collector in the list is enough to refuse, naming it."""
        cfg = AgentConfig(collectors=("127.0.0.1:7070", "10.20.0.5:7070"), node="n")
        with pytest.raises(ConfigError, match=r"collector 10\.20\.0\.5:7070 is not a loopback"):
            tls_material(cfg)
        assert tls_material(AgentConfig(collectors=("127.0.0.1:1", "localhost:2"))) is None

    def test_the_list_needs_a_restart(self, tmp_path: Path):
        """A reload that changes the list warns and keeps the running list, like ``collector``."""
        path = tmp_path / "agent.toml"
        path.write_text('[agent]\nnode = "n"\ncollectors = ["a:1", "b:1"]\n')
        cfg = load_agent_config(path, {})
        reloader = AgentReloader(
            cfg=cfg,
            load=lambda: load_agent_config(path, {}),
            path=path,
            intervals=Intervals(poll=5.0, heartbeat=5.0),
            live=LiveSamples(),
            clock=FakeClock(),
        )
        path.write_text('[agent]\nnode = "n"\ncollectors = ["b:1", "c:1"]\n')
        with capture_logs() as logs:
            assert reloader.reload()
        warned = [e for e in logs if e["event"] == "config_reload_needs_restart"]
        assert [e["key"] for e in warned] == ["collectors"]
        assert reloader.cfg.targets == ("a:1", "b:1")
