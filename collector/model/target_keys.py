"""Keys of rule targets: what incidents, windows and silences call a node, GPU, link or job."""

from __future__ import annotations

from typing import Final

FLEET_KEY: Final = "fleet"


def node_key(node: str) -> str:
    """Target key of a node."""
    return node


def gpu_key(node: str, index: int) -> str:
    """Target key of a GPU (by index: stable for dashboards and people)."""
    return f"{node}/gpu/{index}"


def link_key(node: str, index: int, link: int) -> str:
    """Target key of one NVLink."""
    return f"{node}/gpu/{index}/nvlink/{link}"


def port_key(node: str, device: str, port: int) -> str:
    """Target key of one IB port."""
    return f"{node}/ib/{device}/{port}"


def job_key(job_id: str) -> str:
    """Target key (and incident node) of a training job."""
    return f"job/{job_id}"
