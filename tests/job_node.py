"""The 8-GPU node the job socket tests turn GPU indexes into UUIDs with."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from agent.jobs.listener import JobQueue, serve_job_socket
from agent.poll.sampler import NodeInventory
from agent.sources.nvml import GpuIdentity
from tests.rank_process import shared_dir

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

UUIDS = tuple(f"GPU-{i:08x}-aaaa-bbbb-cccc-1234567890ab" for i in range(8))
INVENTORY = NodeInventory(
    driver_version="570.86.15",
    nvml_version="12.570.86.15",
    gpus=tuple(
        GpuIdentity(i, uuid, f"0000:{0x18 + i:02x}:00.0", "NVIDIA H100 80GB HBM3", 18)
        for i, uuid in enumerate(UUIDS)
    ),
    ib_ports=(),
)


@contextlib.asynccontextmanager
async def open_job_socket() -> AsyncIterator[tuple[Path, JobQueue]]:
    """A real job socket every uid can reach (mode 0666, as shipped), feeding a queue."""
    with shared_dir() as where:
        path = where / "jobs.sock"
        queue = JobQueue()
        reader = await serve_job_socket(path, 0o666, queue, lambda: INVENTORY)
        try:
            yield path, queue
        finally:
            reader.close()
