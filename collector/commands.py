"""Commands to agents: the collector's side of ``reset_gpu``, and asking for a job's rank dumps.

A reset names a GPU of the node's inventory, as its agent declared it in the Hello (the fleet
model holds it): the target key must be a GPU (or NVLink) key of that node, the GPU index must be
in the inventory, and the command carries that GPU's UUID, checked against the wire contract's
pattern. Anything else is refused before a command is sent. The agent checks again against its
own inventory and answers a refusal with a detail that starts with ``refused: ``.

``DUMP_RANKS`` asks a node's agent for the process state and stack of each of a job's ranks
there (:mod:`collector.jobs.evidence` reads the answer); what goes wrong on the way comes back as
a failed CommandResult saying what.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Final

import structlog

from collector.actions.guards import UnsafeArgumentError, parse_target
from collector.actions.ports import ActionOutcome, refused
from collector.ingest.session import StreamNotReadyError
from collector.jobs.evidence import DUMP_TIMEOUT_S
from fleetwatch.wire.settings import COMMAND_REFUSED
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb
from fleetwatch.wire.validate import GPU_UUID

if TYPE_CHECKING:
    from collector.ingest.session import SessionRegistry
    from collector.model.fleet import FleetModel

log = structlog.get_logger("collector.commands")

COMMAND_TIMEOUT_S: Final = 180.0
_SHOWN: Final = 80


class CommandBroker:
    """Sends a reset or a rank dump to a node's agent and waits for its answer."""

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

    def gpu_uuid(self, node: str, target: str) -> str:
        """The UUID of the inventory's GPU that ``target`` names; UnsafeArgumentError otherwise.

        ``target`` is ``node/gpu/<index>`` or one of its NVLinks; the GPU must be one the node's
        agent declared in its Hello.
        """
        index = parse_target(node, target).gpu
        if index is None:
            raise UnsafeArgumentError("target", target, f"a GPU or NVLink key of {node}")
        state = self._fleet.view().get(node)
        gpus = state.gpus.values() if state is not None else ()
        gpu = next((g for g in gpus if g.index == index), None)
        if gpu is None:
            raise UnsafeArgumentError("GPU", str(index), f"in the inventory {node} declared")
        if GPU_UUID.fullmatch(gpu.uuid) is None:  # the Hello check held it; never trust blindly
            raise UnsafeArgumentError("GPU uuid", gpu.uuid, "GPU-<hex>")
        return gpu.uuid

    async def reset(self, node: str, target: str, *, force: bool) -> ActionOutcome:
        """Reset the GPU ``target`` (``node/gpu/<index>``, or a link of it) of ``node``."""
        try:
            gpu_uuid = self.gpu_uuid(node, target)
        except UnsafeArgumentError as exc:
            log.error("reset_refused", node=node[:_SHOWN], target=target[:_SHOWN], why=str(exc))
            return refused(str(exc))
        session = self._registry.session(node)
        if session is None:
            return ActionOutcome(ok=False, detail=f"{node}'s agent is not connected")
        command = pb.Command(
            command_id=uuid.uuid4().hex,
            kind=pb.COMMAND_KIND_RESET_GPU,
            gpu_uuid=gpu_uuid,
            force=force,
        )
        try:
            result = await session.command(command, self._timeout_s)
        except TimeoutError:
            return ActionOutcome(ok=False, detail=f"no answer from {node} in {self._timeout_s:g} s")
        except StreamNotReadyError as exc:  # the agent is reconnecting: not a failed reset
            return ActionOutcome(ok=False, detail=f"{node}: {exc}", retry=True)
        except ConnectionError as exc:
            return ActionOutcome(ok=False, detail=f"{node}: {exc}")
        refused_by_agent = result.detail.startswith(COMMAND_REFUSED)
        said_no = not result.ok and not result.retry_later and refused_by_agent
        return ActionOutcome(
            ok=result.ok,
            detail=f"{node} agent: {result.detail}",
            retry=result.retry_later,
            refused=said_no,
        )

    async def dump_ranks(
        self, node: str, job_id: str, timeout_s: float = DUMP_TIMEOUT_S
    ) -> pb.CommandResult:
        """Ask ``node``'s agent for the state and stack of each of ``job_id``'s ranks there."""
        session = self._registry.session(node)
        if session is None:
            return pb.CommandResult(ok=False, detail=f"{node}'s agent is not connected")
        command = pb.Command(
            command_id=uuid.uuid4().hex, kind=pb.COMMAND_KIND_DUMP_RANKS, job_id=job_id
        )
        try:
            return await session.command(command, timeout_s)
        except TimeoutError:
            return pb.CommandResult(ok=False, detail=f"no answer from {node} in {timeout_s:g} s")
        except ConnectionError as exc:  # StreamNotReadyError too: a new stream not past Hello
            return pb.CommandResult(ok=False, detail=f"{node}: {exc}")
