"""CPU over a benchmark's phase: the cores each child process used, and how busy the machine was."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import psutil


@dataclass(slots=True)
class Phase:
    """CPU counters at the start of a phase."""

    mono: float
    children: dict[str, float]
    machine_busy: float
    machine_total: float


def cpu_phase(children: dict[str, psutil.Process]) -> Phase:
    times = psutil.cpu_times()
    busy = sum(times) - times.idle - getattr(times, "iowait", 0.0)
    used = {}
    for name, proc in children.items():
        try:
            t = proc.cpu_times()
            used[name] = t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            used[name] = math.nan
    return Phase(time.monotonic(), used, busy, sum(times))


def cpu_since(start: Phase, children: dict[str, psutil.Process], label: str) -> dict[str, Any]:
    end = cpu_phase(children)
    wall = end.mono - start.mono
    out: dict[str, Any] = {}
    for name in children:
        cores = (end.children[name] - start.children[name]) / wall if wall > 0 else math.nan
        out[f"cpu_cores_{name}_{label}"] = None if math.isnan(cores) else round(cores, 3)
    total = end.machine_total - start.machine_total
    share = (end.machine_busy - start.machine_busy) / total if total > 0 else math.nan
    out[f"machine_cpu_busy_share_{label}"] = None if math.isnan(share) else round(share, 3)
    return out
