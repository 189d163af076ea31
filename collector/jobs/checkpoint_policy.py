"""Checkpoint interval from the checkpoint cost and the job's mean time between failures.

Young (CACM 1974) gives ``sqrt(2 * cost * M)``; Daly (FGCS 2006) refines it to first order as
``sqrt(2 * cost * M) - cost``, valid while ``cost < 2M`` (otherwise ``M``). The job's failure rate
is the sum of its nodes' rates, each estimated from the node's own record under a gamma prior
set from published fleet data (see /work/shared/reference/failure-data.md, sections 1 and 5).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Iterable

# Llama 3 (arXiv 2407.21783, section 3.3.4, Table 5): 419 unexpected interruptions in a 54-day
# snapshot on 16,384 H100s, i.e. 2,048 8-GPU nodes x 54 days = 110,592 node-days.
PRIOR_FAILURES_PER_NODE_DAY: Final = 3.79 / 1000
# The prior weighs as much as 30 days of watching that node: a node's own record takes over
# after about a month.
PRIOR_WEIGHT_S: Final = 30 * 86400.0


def daly_interval(cost_s: float, mtbf_s: float) -> float:
    """Daly's first-order optimal time between checkpoints, in seconds."""
    if not cost_s > 0:
        msg = f"checkpoint cost_s must be positive, got {cost_s!r}"
        raise ValueError(msg)
    if not mtbf_s > 0:
        msg = f"mtbf_s must be positive, got {mtbf_s!r}"
        raise ValueError(msg)
    if cost_s >= 2 * mtbf_s:
        return mtbf_s
    return math.sqrt(2 * cost_s * mtbf_s) - cost_s


def failure_rate(
    failures: int, observed_s: float, *, prior_per_s: float, prior_weight_s: float
) -> float:
    """Failures per second: a gamma-prior estimate, the prior rate at first, the observed later."""
    checks = {
        "failures": failures,
        "observed_s": observed_s,
        "prior_per_s": prior_per_s,
        "prior_weight_s": prior_weight_s,
    }
    for name, value in checks.items():
        if not (value >= 0 and math.isfinite(value)):
            msg = f"{name} must be a finite number >= 0, got {value!r}"
            raise ValueError(msg)
    if observed_s + prior_weight_s <= 0:
        msg = "failure_rate needs observed_s or prior_weight_s above 0, got both 0"
        raise ValueError(msg)
    return (failures + prior_per_s * prior_weight_s) / (observed_s + prior_weight_s)


def job_mtbf_s(node_rates_per_s: Iterable[float]) -> float:
    """Mean time between failures of a job that any node's failure stops (inf for rate 0)."""
    total = 0.0
    for rate in node_rates_per_s:
        if not (rate >= 0 and math.isfinite(rate)):
            msg = f"a node's failure rate must be a finite number >= 0, got {rate!r}"
            raise ValueError(msg)
        total += rate
    return math.inf if total == 0 else 1.0 / total


@dataclass(frozen=True, slots=True)
class CheckpointAdvice:
    """How often to checkpoint, and the figures that advice rests on."""

    interval_s: float
    mtbf_s: float
    cost_s: float


def advise(cost_s: float, node_rates_per_s: Iterable[float]) -> CheckpointAdvice | None:
    """Advice for a job on these nodes; None when the cost is unknown or there are no nodes."""
    rates = list(node_rates_per_s)
    if not (cost_s > 0 and math.isfinite(cost_s)) or not rates:
        return None
    mtbf = job_mtbf_s(rates)
    return CheckpointAdvice(interval_s=daly_interval(cost_s, mtbf), mtbf_s=mtbf, cost_s=cost_s)
