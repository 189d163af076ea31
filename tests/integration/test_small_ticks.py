"""What changed is evaluated in small ticks between regular ones, not a second's worth at once."""

from pathlib import Path

import pytest

from agent.sim.cluster import SimCluster
from collector.main import CollectorService
from fleetwatch.clock import SystemClock
from fleetwatch.testing import wait_until

pytestmark = pytest.mark.integration

RULES = """\
version: 1
rules:
  - name: too_hot
    scope: gpu
    when: 'has(gpu.signals.temperature_celsius) && gpu.signals.temperature_celsius > 90.0'
    severity: warning
    actions: []
"""


async def test_a_sample_fires_its_rule_between_regular_ticks(collector_config, tmp_path: Path):
    """With regular ticks 60 s apart and no event, a GPU's temperature over the rule's bar
    still fires within a second: a small tick evaluates what changed every 0.2 s."""
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    service = CollectorService(collector_config(rules=(rules,), rules_interval=60.0), SystemClock())
    await service.start()
    cluster = SimCluster(
        ["n1"],
        tmp_path / "nodes",
        SystemClock(),
        f"127.0.0.1:{service.grpc_port}",
        poll_interval=0.1,
    )
    cluster.start()
    try:
        await wait_until(
            lambda: "n1" in service.fleet.view() and service.fleet.view()["n1"].reported,
            what="the first Report",
        )
        ticks = service.incidents.ticks
        cluster.nodes["n1"].thermal(3, 95)
        await wait_until(
            lambda: any(i.rule == "too_hot" for i in service.evaluator.engine.open_incidents()),
            timeout=5,
            what="too_hot",
        )
        (incident,) = service.evaluator.engine.open_incidents()
        assert incident.target == "n1/gpu/3"
        assert service.incidents.small_ticks >= 1
        assert service.incidents.ticks - ticks >= 1  # no regular tick was due: small ones
    finally:
        await cluster.stop()
        await service.stop(grace=None)
