"""Commands from the collector: reset a GPU, with the agent's own safety checks first.

The agent is the last line of defence: it refuses a reset of a GPU it does not have, and of a
GPU compute processes are using (unless told to force it, after a drain), and it runs the reset
program as an argument list, never through a shell.
"""

from __future__ import annotations

import asyncio
import subprocess
from typing import TYPE_CHECKING, Protocol

import structlog

from agent.exceptions import SourceError
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb

if TYPE_CHECKING:
    from agent.sampler import Sampler
    from agent.sources.nvml import GpuIdentity

log = structlog.get_logger("agent.commands")

RESET_TIMEOUT_S = 120.0


class GpuReset(Protocol):
    """Resets one GPU; returns (ok, what happened). Runs in a thread: it may block."""

    def __call__(self, gpu: GpuIdentity) -> tuple[bool, str]:
        """Reset ``gpu``."""
        ...


class NvidiaSmiReset:
    """``nvidia-smi --gpu-reset -i <bus id>``: the driver's supported way to reset one GPU."""

    def __init__(self, nvidia_smi: str = "nvidia-smi", timeout_s: float = RESET_TIMEOUT_S) -> None:
        """Use the given nvidia-smi binary."""
        self._binary = nvidia_smi
        self._timeout_s = timeout_s

    def __call__(self, gpu: GpuIdentity) -> tuple[bool, str]:
        """Run the reset and report nvidia-smi's own words."""
        try:
            done = subprocess.run(  # noqa: S603 - fixed program, arguments from our inventory
                [self._binary, "--gpu-reset", "-i", gpu.pci_bus_id],
                capture_output=True,
                text=True,
                timeout=self._timeout_s,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return False, f"nvidia-smi --gpu-reset: {exc}"
        words = (done.stdout + done.stderr).strip().splitlines()
        return done.returncode == 0, " ".join(words)[:500] or f"exit status {done.returncode}"


class CommandRunner:
    """Carries out commands on this node's GPUs."""

    def __init__(self, sampler: Sampler, reset: GpuReset | None) -> None:
        """``reset`` None: this agent refuses resets."""
        self._sampler = sampler
        self._reset = reset
        self._busy: set[str] = set()

    async def run(self, command: pb.Command) -> pb.CommandResult:
        """Run one command; every refusal says why, and whether asking later may help."""
        ok, detail, later = await self._run(command)
        log.info("command_done", id=command.command_id, kind=command.kind, ok=ok, detail=detail)
        return pb.CommandResult(
            command_id=command.command_id, ok=ok, detail=detail, retry_later=later
        )

    def _refusal(self, command: pb.Command) -> tuple[GpuIdentity | None, str, bool]:
        if command.kind != pb.COMMAND_KIND_RESET_GPU:
            return None, f"command kind {command.kind} is not supported by this agent", False
        gpu = next((g for g in self._sampler.inventory.gpus if g.uuid == command.gpu_uuid), None)
        if gpu is None:
            return None, f"no GPU {command.gpu_uuid[:80]!r} on this node", False
        if self._reset is None:
            return None, "GPU resets are turned off on this agent", False
        if gpu.uuid in self._busy:
            return None, f"a reset of GPU {gpu.index} is already running", True
        return gpu, "", False

    async def _run(self, command: pb.Command) -> tuple[bool, str, bool]:
        """(ok, detail, retry_later)."""
        gpu, why, later = self._refusal(command)
        if gpu is None or self._reset is None:
            return False, why, later
        if not command.force:
            try:
                pids = self._sampler.compute_processes(gpu)
            except SourceError as exc:
                return False, f"cannot tell whether GPU {gpu.index} is idle: {exc}", True
            if pids:
                shown = ", ".join(map(str, pids[:5]))
                busy = f"GPU {gpu.index} is busy: {len(pids)} compute processes ({shown})"
                return False, busy, True
        self._busy.add(gpu.uuid)
        try:
            ok, detail = await asyncio.to_thread(self._reset, gpu)
        finally:
            self._busy.discard(gpu.uuid)
        return ok, detail, False
