"""Commands to agents: the collector's side of ``reset_gpu``."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Final

from collector.actions.dispatcher import ActionOutcome
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb

if TYPE_CHECKING:
    from collector.fleet import FleetModel
    from collector.session import SessionRegistry

COMMAND_TIMEOUT_S: Final = 180.0


class CommandBroker:
    """Sends a reset to the agent of the GPU's node and waits for its answer."""

    def __init__(
        self,
        registry: SessionRegistry,
        fleet: FleetModel,
        timeout_s: float = COMMAND_TIMEOUT_S,
    ) -> None:
        """Reach agents through the server's stream registry."""
        self._registry = registry
        self._fleet = fleet
        self._timeout_s = timeout_s

    async def reset(self, node: str, target: str, *, force: bool) -> ActionOutcome:
        """Reset the GPU ``target`` (``node/gpu/<index>``, or a link of it) of ``node``."""
        try:
            index = int(target.split("/gpu/", 1)[1].split("/", 1)[0])
        except (IndexError, ValueError):
            return ActionOutcome(ok=False, detail=f"{target} is not a GPU")
        state = self._fleet.view().get(node)
        gpu = next((g for g in state.gpus.values() if g.index == index), None) if state else None
        if gpu is None:
            return ActionOutcome(ok=False, detail=f"{node} has no GPU {index}")
        session = self._registry.session(node)
        if session is None:
            return ActionOutcome(ok=False, detail=f"{node}'s agent is not connected")
        command = pb.Command(
            command_id=uuid.uuid4().hex,
            kind=pb.COMMAND_KIND_RESET_GPU,
            gpu_uuid=gpu.uuid,
            force=force,
        )
        try:
            result = await session.command(command, self._timeout_s)
        except TimeoutError:
            return ActionOutcome(ok=False, detail=f"no answer from {node} in {self._timeout_s:g} s")
        except ConnectionError as exc:
            return ActionOutcome(ok=False, detail=f"{node}: {exc}")
        return ActionOutcome(
            ok=result.ok, detail=f"{node} agent: {result.detail}", retry=result.retry_later
        )
