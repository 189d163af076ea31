"""Simulated nodes as the benchmarks use them: their names, and a busy node between two polls."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import random

    from agent.sim.hardware import SimNode
    from agent.sim.sysfs_tree import SimSysfsTree


def node_names(count: int) -> list[str]:
    return [f"node-{i:03d}" for i in range(1, count + 1)]


def move_hardware(node: SimNode, tree: SimSysfsTree, rng: random.Random) -> None:
    """What changes on a busy node between two polls (not measured)."""
    for i in range(8):
        tree.add_ib_traffic(f"mlx5_{i}", 1, xmit_bytes=5 * 10**9, rcv_bytes=5 * 10**9)
    for gpu in node.gpus:
        gpu.temperature_c = 60 + rng.randrange(8)
        gpu.power_mw = 600_000 + rng.randrange(50_000)
        gpu.util_gpu = 95 + rng.randrange(5)
