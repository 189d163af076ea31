"""Fixtures of the integration tests: a webhook receiver, a collector acting through it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from cli.dev.webhook_receiver import WebhookReceiver
from fleetwatch.clock import SystemClock
from tests.integration.fleet_harness import SECRET, actions, start

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable
    from pathlib import Path

    from agent.sim.cluster import SimCluster
    from collector.config import CollectorConfig
    from collector.main import CollectorService


@pytest.fixture
def receiver() -> Any:
    with WebhookReceiver(clock=SystemClock(), secret=SECRET) as hooks:
        yield hooks


@pytest.fixture
async def running(
    collector_config: Callable[..., CollectorConfig],
    receiver: WebhookReceiver,
    tmp_path: Path,
) -> AsyncIterator[tuple[CollectorService, SimCluster]]:
    service, cluster = await start(collector_config, tmp_path, actions(receiver, tmp_path))
    try:
        yield service, cluster
    finally:
        await cluster.stop()
        await service.stop(grace=None)
