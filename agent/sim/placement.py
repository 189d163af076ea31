"""Where one rank of a simulated training job runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

    from agent.sim.hardware import SimNode


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one rank runs, and where its node's agent listens."""

    rank: int
    node: SimNode
    gpu: int
    socket: Path
