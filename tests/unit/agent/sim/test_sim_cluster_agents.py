"""A simulated node's agent that dies of an exception says so, instead of going silent."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, cast

from structlog.testing import capture_logs

from agent.sim.cluster import SimCluster

if TYPE_CHECKING:
    from agent.agent import Agent


class Broken:
    async def run(self) -> None:
        msg = "the spool is gone"
        raise OSError(msg)


async def test_an_agent_that_dies_is_logged():
    with capture_logs() as logs:
        task = SimCluster._run_agent("node-7", cast("Agent", Broken()))
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.sleep(0)  # done callbacks run on the next turn
    died = [e for e in logs if e["event"] == "sim_agent_died"]
    assert len(died) == 1
    assert died[0]["node"] == "node-7"
    assert "the spool is gone" in died[0]["error"]
