"""Re-qualification: a node that comes back runs pre-flight before it takes work again.

A node comes back when a person says it is repaired (``fleetwatch lifecycle NODE repaired``),
or when it says Hello with a new boot id while in repair or drained (it was rebooted). It moves
to *re-qualifying* and a pre-flight run of ``[collector] requalify``'s level (``quick`` by
default) runs on it; a ``full`` run takes one node in service as its pair, for the tests
between two nodes. When the node passes (or only warns), fleetwatch's drain of it is released
and it is *in service* (``preflight:RUN``); when it fails or the run cannot run, it is
*drained* again with the run's verdict as the reason, and the failure is held as any pre-flight
failure is (``collector.preflight.holds``: a drain through the ordinary action, when fleetwatch
held none).

One run per node at a time: a node already re-qualifying is not started again.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import structlog

from collector.model.lifecycle import State
from fleetwatch.preflight.vocabulary import Level, Verdict

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from collector.actions.dispatcher import Dispatcher
    from collector.model.lifecycle import Lifecycle
    from collector.preflight.orchestrator import PreflightService
    from collector.store.preflight import RunRow

__all__ = ["Requalifier"]

log = structlog.get_logger("collector.preflight.requalify")

# Where a node that booted again is re-qualified from (a reboot of a node in service is not).
_BOOT_BACK = frozenset({State.IN_REPAIR, State.DRAINED})


class Requalifier:
    """Runs pre-flight on a node that comes back, and releases it only when it passes."""

    def __init__(
        self,
        service: PreflightService,
        dispatcher: Dispatcher,
        lifecycle: Lifecycle,
        level: str,
        nodes: Callable[[], Iterable[str]],
    ) -> None:
        """Re-qualify at ``level`` (quick, standard, full); ``nodes`` names the fleet's."""
        self._nodes_known = nodes
        self._service = service
        self._dispatcher = dispatcher
        self._lifecycle = lifecycle
        self.level = Level(level)
        self.running: dict[str, asyncio.Task[None]] = {}
        self.runs: dict[str, str] = {}  # node -> the id of its last re-qualification run

    def start(self, node: str, actor: str, why: str) -> bool:
        """Move ``node`` to re-qualifying and start its run; False when one runs already."""
        if node in self.running:
            return False
        self._lifecycle.move(node, State.REQUALIFYING, actor=actor, reason=why, strict=True)
        task = asyncio.create_task(self._run(node), name=f"requalify-{node}")
        self.running[node] = task
        task.add_done_callback(lambda _t: self.running.pop(node, None))
        return True

    def booted(self, node: str, old_boot: str, new_boot: str) -> None:
        """The fleet model saw ``node`` say Hello with a new boot id."""
        if self._lifecycle.state(node) in _BOOT_BACK and node not in self.running:
            self.start(node, "agent:hello", f"booted again (boot {old_boot[:8]} -> {new_boot[:8]})")

    async def stop(self) -> None:
        """Cut the runs short (the orchestrator journals them as could_not_run)."""
        tasks = list(self.running.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _nodes(self, node: str) -> str:
        """What the run covers: the node, and for ``full`` one node in service as its pair."""
        if self.level is not Level.FULL:
            return node
        state = self._lifecycle.state
        peers = [n for n in sorted(self._nodes_known()) if n != node and state(n) == "in_service"]
        return f"{node},{peers[0]}" if peers else node

    async def _run(self, node: str) -> None:
        try:
            row = await self._service.run(self.level, self._nodes(node))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a run that cannot start leaves the node out
            log.warning("requalify_failed_to_start", node=node, error=str(exc))
            self._lifecycle.move(
                node, State.DRAINED, actor="preflight", reason=f"re-qualification: {exc}"
            )
            return
        await self._judged(node, row)

    async def _judged(self, node: str, row: RunRow) -> None:
        self.runs[node] = row.id
        verdict = (row.node_verdicts or {}).get(node, row.verdict)
        actor = f"preflight:{row.id}"
        log.info("requalified", node=node, run=row.id, verdict=verdict)
        if self._lifecycle.state(node) != State.REQUALIFYING:
            return  # a person moved it meanwhile: their word stands
        if verdict in (Verdict.PASS.value, Verdict.WARN.value):
            reason = f"re-qualified: pre-flight {row.level} run {row.id} {verdict}"
            if node in self._dispatcher.drained:
                await self._dispatcher.release(node, reason, actor=actor)
            else:
                self._lifecycle.move(node, State.IN_SERVICE, actor=actor, reason=reason)
            return
        reason = f"re-qualification failed: pre-flight {row.level} run {row.id} {verdict}"
        if row.detail:
            reason += f": {row.detail}"
        self._lifecycle.move(node, State.DRAINED, actor=actor, reason=reason)
