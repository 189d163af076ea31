"""The agent bounds itself: sheds step reports over its memory ceiling, spaces out costly polls."""

from pathlib import Path

import pytest
from structlog.testing import capture_logs

from agent.config import AgentConfig, load_agent_config
from agent.exceptions import ConfigError
from agent.main import build_agent
from agent.poll.self_limits import MAX_STRETCH, ProcessUsage, SelfLimits
from agent.sim.cluster import sim_hardware
from agent.sim.hardware import SimNode
from fleetwatch.model import Target
from fleetwatch.testing import FakeClock
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb

MIB = 1 << 20
NODE = Target.node()


class FakeUsage:
    """RSS as set; CPU time that grows by ``cpu_per_read`` at every read."""

    def __init__(self, rss: int | None = 100 * MIB, cpu_per_read: float = 0.0) -> None:
        self.rss = rss
        self.cpu = 0.0
        self.cpu_per_read = cpu_per_read

    def rss_bytes(self) -> int | None:
        return self.rss

    def cpu_seconds(self) -> float:
        self.cpu += self.cpu_per_read
        return self.cpu


def limits(usage: FakeUsage, *, memory_max: int = 192 * MIB, share: float = 0.1) -> SelfLimits:
    return SelfLimits(usage, memory_max_bytes=memory_max, poll_cpu_max_share=share)


class TestMemoryCeiling:
    def test_over_the_ceiling_asks_to_shed_counts_and_logs_once(self):
        """Every check over the ceiling asks to shed and counts; the log says so once per
        episode, and once when back under."""
        usage = FakeUsage(rss=100 * MIB)
        watch = limits(usage)
        assert not watch.check_memory()
        usage.rss = 200 * MIB
        with capture_logs() as logs:
            assert [watch.check_memory() for _ in range(3)] == [True, True, True]
            usage.rss = 150 * MIB
            assert not watch.check_memory()
        assert watch.memory_sheds == 3
        assert [e["event"] for e in logs] == ["memory_over_ceiling", "memory_under_ceiling"]
        assert logs[0]["rss_bytes"] == 200 * MIB

    def test_zero_turns_the_ceiling_off_and_an_unreadable_rss_sheds_nothing(self):
        """memory_max_bytes 0 never sheds; RSS that cannot be read is not reported."""
        assert not limits(FakeUsage(rss=10_000 * MIB), memory_max=0).check_memory()
        blind = limits(FakeUsage(rss=None), memory_max=64 * MIB)
        assert not blind.check_memory()
        assert (NODE, "agent_rss_bytes") not in blind.samples(5.0)


class TestPollStretch:
    def test_costly_polls_stretch_the_interval_and_cheap_ones_bring_it_back(self):
        """Polls costing more than the share of the interval space out, capped; once they are
        cheap again the configured interval returns. One stretch, logged once each way."""
        watch = limits(FakeUsage(), share=0.1)
        assert watch.next_interval(0.05, 1.0) == 1.0  # 5% of a 1 s interval
        with capture_logs() as logs:
            waits = [watch.next_interval(0.3, 1.0) for _ in range(10)]
            assert all(1.0 < w <= 3.0 + 1e-9 for w in waits)
            assert waits[-1] == pytest.approx(3.0, rel=0.05)  # 0.3 s is 10% of 3 s
            assert watch.next_interval(50.0, 1.0) == MAX_STRETCH
            cheap = [watch.next_interval(0.01, 1.0) for _ in range(30)]
        assert cheap[-1] == 1.0
        assert watch.stretches == 1
        assert [e["event"] for e in logs] == ["poll_interval_stretched", "poll_interval_restored"]
        assert watch.samples(1.0)[NODE, "agent_poll_interval_seconds"] == 1.0

    def test_zero_share_never_stretches(self):
        """poll_cpu_max_share 0 turns stretching off."""
        watch = limits(FakeUsage(), share=0.0)
        assert watch.next_interval(100.0, 5.0) == 5.0
        assert watch.stretches == 0


class TestProcessUsage:
    def test_rss_comes_from_statm_and_cpu_time_grows(self, tmp_path: Path):
        """Resident pages times the page size; a missing statm is None, counted, logged once."""
        (tmp_path / "self").mkdir()
        (tmp_path / "self" / "statm").write_text("5000 250 100 10 0 300 0\n")
        usage = ProcessUsage(tmp_path)
        rss = usage.rss_bytes()
        assert rss is not None
        assert rss % 250 == 0
        assert rss // 250 >= 4096  # one page
        assert usage.cpu_seconds() > 0
        missing = ProcessUsage(tmp_path / "nope")
        with capture_logs() as logs:
            assert missing.rss_bytes() is None
            assert missing.rss_bytes() is None
        assert missing.read_errors == 2
        assert [e["event"] for e in logs] == ["rss_unreadable"]


def step(n: int) -> pb.JobStep:
    return pb.JobStep(job_id="train", rank=0, step=n, step_time_s=1.0, tokens=1000.0)


class TestAgentBoundsItself:
    async def test_over_its_ceiling_the_agent_drops_step_reports_never_events(self, tmp_path: Path):
        """Over the memory ceiling a poll drops every held step report, keeps its events and
        reports what it did as node samples."""
        clock = FakeClock()
        node = SimNode("node-a", tmp_path / "sys", clock, gpus=2, nvlinks=2, ib_ports=1)
        cfg = AgentConfig(node="node-a", state_dir=None, job_socket=tmp_path / "j.sock")
        agent = build_agent(cfg, sim_hardware(node), clock)
        usage = FakeUsage(rss=300 * MIB)
        agent.limits = limits(usage)
        await agent.start()
        assert agent.jobs is not None
        for n in range(5):
            agent.jobs.add(step(n))
        node.xid(1, 13)
        await agent.poll_once()
        assert len(agent.jobs) == 0
        assert agent.jobs.dropped == 5
        assert [e.xid for e in agent.outbox.after(0)] == [13]
        assert agent.live.values[NODE, "agent_memory_sheds"] == 1
        assert agent.live.values[NODE, "agent_rss_bytes"] == 300 * MIB
        assert agent.live.values[NODE, "agent_telemetry_dropped"] == 5
        usage.rss = 100 * MIB
        agent.jobs.add(step(9))
        await agent.poll_once()
        assert len(agent.jobs) == 1  # under the ceiling again: kept

    async def test_a_costly_poll_makes_the_agent_wait_longer(self, tmp_path: Path):
        """When a poll costs more CPU than its share, the wait before the next one grows, and
        the interval in force is a node sample."""
        clock = FakeClock()
        node = SimNode("node-a", tmp_path / "sys", clock, gpus=2, nvlinks=2, ib_ports=1)
        agent = build_agent(AgentConfig(node="node-a", state_dir=None), sim_hardware(node), clock)
        agent.limits = limits(FakeUsage(cpu_per_read=1.0), share=0.1)  # 2 s CPU per poll
        await agent.start()
        wait = await agent.timed_poll()
        assert wait > agent.intervals.poll
        await agent.poll_once()
        assert agent.live.values[NODE, "agent_poll_interval_seconds"] == pytest.approx(wait)
        assert agent.live.values[NODE, "agent_poll_stretches"] == 1


class TestConfig:
    def test_the_defaults_bound_the_agent(self):
        """By default NVML gets 5 s, memory is capped under the unit's MemoryMax, CPU too."""
        cfg = AgentConfig(node="n", state_dir=None)
        assert cfg.nvml_call_timeout == 5.0
        assert 64 * MIB <= cfg.memory_max_bytes < 256 * MIB
        assert 0 < cfg.poll_cpu_max_share <= 0.5

    @pytest.mark.parametrize(
        ("key", "value"),
        [
            ("nvml_call_timeout", 0),
            ("nvml_call_timeout", "5"),
            ("memory_max_bytes", 1000),
            ("memory_max_bytes", 1.5e8),
            ("poll_cpu_max_share", 1.5),
            ("poll_cpu_max_share", -0.1),
        ],
    )
    def test_nonsense_is_refused_naming_the_key(self, tmp_path: Path, key: str, value: object):
        """A value that cannot work is a ConfigError that names its key."""
        path = tmp_path / "agent.toml"
        shown = f'"{value}"' if isinstance(value, str) else value
        path.write_text(f'[agent]\nnode = "n"\n{key} = {shown}\n')
        with pytest.raises(ConfigError, match=key):
            load_agent_config(path, {})

    def test_zero_turns_each_self_limit_off(self, tmp_path: Path):
        """0 is accepted for the memory ceiling and the CPU share (off)."""
        path = tmp_path / "agent.toml"
        path.write_text('[agent]\nnode = "n"\nmemory_max_bytes = 0\npoll_cpu_max_share = 0\n')
        cfg = load_agent_config(path, {})
        assert (cfg.memory_max_bytes, cfg.poll_cpu_max_share) == (0, 0)
