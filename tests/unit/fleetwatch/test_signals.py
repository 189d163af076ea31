"""The agent sends only names of the signal vocabulary, and its tables say how to read each one."""

from pathlib import Path

from agent.poll.gpu_signals import CLOCK_REASON_SIGNALS, GPU_SIGNALS, NVLINK_SIGNALS
from agent.probes.counters import IB_COUNTER_SPECS
from agent.sim.hardware import SimNode
from agent.testing import sim_sampler
from fleetwatch import signals
from fleetwatch.model import TargetKind
from fleetwatch.testing import FakeClock
from rules.model import Scope
from rules.signals import known

SCOPE_OF = {
    TargetKind.NODE: Scope.NODE,
    TargetKind.GPU: Scope.GPU,
    TargetKind.NVLINK: Scope.NVLINK,
    TargetKind.IB_PORT: Scope.IB_PORT,
    TargetKind.PCI: Scope.GPU,  # a GPU's upstream port: the PCIe link and AER names of a GPU
}


def test_the_agents_reading_tables_name_exactly_the_vocabulary():
    assert tuple(GPU_SIGNALS) == signals.GPU_VALUES
    assert tuple(CLOCK_REASON_SIGNALS) == signals.CLOCK_REASONS
    assert tuple(NVLINK_SIGNALS) == signals.NVLINK_VALUES
    assert tuple(IB_COUNTER_SPECS) == signals.IB_COUNTERS
    saturating = tuple(name for name, spec in IB_COUNTER_SPECS.items() if spec.saturates)
    assert saturating == signals.IB_SATURATING


async def test_every_sample_of_a_simulated_nodes_poll_is_a_known_signal(tmp_path: Path):
    clock = FakeClock()
    node = SimNode("node-a", tmp_path / "sys", clock, gpus=2, nvlinks=4, ib_ports=2)
    sampler = sim_sampler(node)
    first = await sampler.poll()
    clock.advance(2.0)  # past the counter interval: the IB rates too
    second = await sampler.poll()
    samples = [*first.samples, *second.samples]
    sent = {(SCOPE_OF[target.kind], name) for target, name in samples}
    assert {scope for scope, _ in sent} >= {Scope.GPU, Scope.NVLINK, Scope.IB_PORT}
    assert [(scope, name) for scope, name in sorted(sent) if not known(scope, name)] == []


def test_a_name_outside_the_vocabulary_is_not_known():
    assert not known(Scope.GPU, "gpu_made_up")
    assert known(Scope.IB_PORT, "ib_hw_out_of_buffer")
    assert not known(Scope.GPU, "ib_hw_out_of_buffer")
