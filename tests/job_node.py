"""The 8-GPU node the job socket tests turn GPU indexes into UUIDs with."""

from __future__ import annotations

from agent.poll.sampler import NodeInventory
from agent.sources.nvml import GpuIdentity

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
