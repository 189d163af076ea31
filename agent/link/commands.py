"""Commands from the collector: reset a GPU, dump a job's ranks, with the agent's own checks first.

The agent is the last line of defence, whatever the collector asks:

* a reset names a GPU by UUID; a UUID that is not well formed, or that names no GPU of this
  node's current inventory (another node's GPU included), is refused;
* the reset program is given the GPU as the inventory describes it (its PCI bus id, from NVML,
  checked against the wire contract's strict pattern), never any text of the command, and runs as
  an argument list, never through a shell;
* a GPU compute processes are using is refused for now (unless told to force it, after a drain);
* a rank dump names a job, never a process: only the processes that reported that job on the
  job socket are read (:mod:`agent.jobs.rank_dumps`), and a malformed job id is refused.

A refusal is logged (``command_refused``), answered with a result whose detail starts with
``COMMAND_REFUSED`` (the collector counts those as refused, not failed) and counted in
:attr:`CommandRunner.refused` by reason.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections import Counter
from typing import TYPE_CHECKING, Final, Protocol

import structlog

from agent.exceptions import SourceError
from fleetwatch.wire.settings import COMMAND_REFUSED
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb
from fleetwatch.wire.validate import GPU_UUID, PCI_BUS_ID, WireError
from fleetwatch.wire.validate_jobs import JOB_ID, validate_rank_dumps

if TYPE_CHECKING:
    from agent.jobs.rank_dumps import RankDumps
    from agent.poll.sampler import Sampler
    from agent.sources.nvml import GpuIdentity

log = structlog.get_logger("agent.commands")

RESET_TIMEOUT_S: Final = 120.0
# How every refusal's detail starts: the collector journals and counts those as refused.
_SHOWN_CHARS: Final = 80


class _RefusedError(Exception):
    """A command refused for good; ``reason`` is a short label for counting."""

    def __init__(self, reason: str, why: str) -> None:
        super().__init__(why)
        self.reason = reason


class GpuReset(Protocol):
    """Resets one GPU; returns (ok, what happened). Runs in a thread: it may block."""

    def __call__(self, gpu: GpuIdentity) -> tuple[bool, str]:
        """Reset ``gpu`` (an entry of this node's own inventory)."""
        ...


def bus_id_refusal(gpu: GpuIdentity) -> str | None:
    """Why ``gpu``'s bus id must not reach a command line; ``None`` when it is ``dddd:bb:dd.f``."""
    if PCI_BUS_ID.fullmatch(gpu.pci_bus_id) is None:
        shown = gpu.pci_bus_id[:_SHOWN_CHARS]
        return f"GPU {gpu.index} has PCI bus id {shown!r}, not dddd:bb:dd.f"
    return None


class NvidiaSmiReset:
    """``nvidia-smi --gpu-reset -i <bus id>``: the driver's supported way to reset one GPU."""

    def __init__(self, nvidia_smi: str = "nvidia-smi", timeout_s: float = RESET_TIMEOUT_S) -> None:
        """Use the given nvidia-smi binary (a path, or a name looked up on ``PATH``)."""
        self._binary = nvidia_smi
        self._timeout_s = timeout_s

    def argv(self, gpu: GpuIdentity) -> list[str]:
        """The command line for ``gpu``; ValueError when its bus id is not ``dddd:bb:dd.f``."""
        why = bus_id_refusal(gpu)
        if why is not None:
            raise ValueError(why)
        return [self._binary, "--gpu-reset", "-i", gpu.pci_bus_id]

    def __call__(self, gpu: GpuIdentity) -> tuple[bool, str]:
        """Run the reset and report nvidia-smi's own words; run nothing for a malformed bus id."""
        try:
            argv = self.argv(gpu)
        except ValueError as exc:
            log.warning("gpu_reset_refused", gpu_index=gpu.index, why=str(exc))
            return False, f"{COMMAND_REFUSED}{exc}"
        try:
            done = subprocess.run(  # noqa: S603 - fixed program, a checked bus id from our inventory
                argv,
                capture_output=True,
                text=True,
                timeout=self._timeout_s,
                check=False,
                stdin=subprocess.DEVNULL,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return False, f"nvidia-smi --gpu-reset: {exc}"
        words = (done.stdout + done.stderr).strip().splitlines()
        return done.returncode == 0, " ".join(words)[:500] or f"exit status {done.returncode}"


class CommandRunner:
    """Carries out commands on this node's GPUs.

    Attributes:
        refused: refusals for good, by reason (``kind``, ``malformed_uuid``, ``unknown_gpu``,
            ``bad_bus_id``, ``resets_off``, ``malformed_job_id``); refusals for now (a busy GPU)
            are not counted.
    """

    def __init__(
        self, sampler: Sampler, reset: GpuReset | None, dumps: RankDumps | None = None
    ) -> None:
        """``reset`` None: this agent refuses resets; ``dumps`` None: it watches no ranks."""
        self._sampler = sampler
        self._reset = reset
        self._dumps = dumps
        self._busy: set[str] = set()
        self.refused: Counter[str] = Counter()

    async def run(self, command: pb.Command) -> pb.CommandResult:
        """Run one command; every refusal says why, and whether asking later may help."""
        if command.kind == pb.COMMAND_KIND_DUMP_RANKS:
            return await self._dump_ranks(command)
        ok, detail, later = await self._run(command)
        log.info("command_done", id=command.command_id, kind=command.kind, ok=ok, detail=detail)
        return pb.CommandResult(
            command_id=command.command_id, ok=ok, detail=detail, retry_later=later
        )

    def _target(self, command: pb.Command) -> tuple[GpuIdentity, GpuReset]:
        """The inventory's GPU the command names, and the resetter; _RefusedError otherwise."""
        if command.kind != pb.COMMAND_KIND_RESET_GPU:
            raise _RefusedError(
                "kind", f"command kind {command.kind} is not supported by this agent"
            )
        shown = command.gpu_uuid[:_SHOWN_CHARS]
        if GPU_UUID.fullmatch(command.gpu_uuid) is None:
            raise _RefusedError("malformed_uuid", f"GPU uuid {shown!r} is not GPU-<hex>")
        gpu = next((g for g in self._sampler.inventory.gpus if g.uuid == command.gpu_uuid), None)
        if gpu is None:
            raise _RefusedError("unknown_gpu", f"no GPU {shown!r} on this node")
        why = bus_id_refusal(gpu)
        if why is not None:
            raise _RefusedError("bad_bus_id", why)
        if self._reset is None:
            raise _RefusedError("resets_off", "GPU resets are turned off on this agent")
        return gpu, self._reset

    def _refuse(self, command: pb.Command, refusal: _RefusedError) -> tuple[bool, str, bool]:
        self.refused[refusal.reason] += 1
        log.warning(
            "command_refused",
            id=command.command_id[:_SHOWN_CHARS],
            kind=command.kind,
            reason=refusal.reason,
            why=str(refusal),
            count=self.refused[refusal.reason],
        )
        return False, f"{COMMAND_REFUSED}{refusal}", False

    async def _run(self, command: pb.Command) -> tuple[bool, str, bool]:
        """(ok, detail, retry_later)."""
        try:
            gpu, reset = self._target(command)
        except _RefusedError as refusal:
            return self._refuse(command, refusal)
        if gpu.uuid in self._busy:
            return False, f"a reset of GPU {gpu.index} is already running", True
        if not command.force:
            try:
                pids = await self._sampler.compute_processes(gpu)
            except SourceError as exc:
                return False, f"cannot tell whether GPU {gpu.index} is idle: {exc}", True
            if pids:
                shown = ", ".join(map(str, pids[:5]))
                busy = f"GPU {gpu.index} is busy: {len(pids)} compute processes ({shown})"
                return False, busy, True
        self._busy.add(gpu.uuid)
        try:
            ok, detail = await asyncio.to_thread(reset, gpu)
        finally:
            self._busy.discard(gpu.uuid)
        return ok, detail, False

    async def _dump_ranks(self, command: pb.Command) -> pb.CommandResult:
        """The job's ranks on this node, dumped; a failed result says why there are none."""
        result = pb.CommandResult(command_id=command.command_id)
        shown = command.job_id[:_SHOWN_CHARS]
        if JOB_ID.fullmatch(command.job_id) is None:
            refusal = _RefusedError(
                "malformed_job_id", f"job id {shown!r} must be 1-128 letters, digits or ._:/@+=-"
            )
            result.ok, result.detail, _ = self._refuse(command, refusal)
            return result
        if self._dumps is None:
            result.detail = "this agent watches no ranks (its job socket is off)"
        elif (dumps := await self._dumps.dump(command.job_id)) is None:
            result.detail = f"no rank of job {shown!r} reported on this node"
        else:
            result.ok = True
            result.dumps.extend(dumps)
            try:
                validate_rank_dumps(result)
            except WireError as exc:  # a bug of ours: say so, rather than send what breaks the wire
                log.error("rank_dumps_invalid", job=command.job_id, error=str(exc))
                detail = f"the dumps broke the wire contract: {exc}"
                result = pb.CommandResult(command_id=command.command_id, detail=detail)
        log.info(
            "command_done",
            id=command.command_id,
            kind=command.kind,
            ok=result.ok,
            detail=result.detail,
            job=command.job_id,
            ranks=len(result.dumps),
        )
        return result
