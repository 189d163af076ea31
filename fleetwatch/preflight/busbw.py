"""Algorithm and bus bandwidth of a collective, as nccl-tests defines them.

nccl-tests (``doc/PERFORMANCE.md``) reports two bandwidths for each size it times. The algorithm
bandwidth is the plain one: bytes of the operation over its time. It falls as ranks are added
even on perfect hardware, because each rank moves more than the buffer's size. The bus bandwidth
scales the algorithm bandwidth by the share of the data each rank's link must carry, so that it
is comparable with a link's peak whatever the number of ranks: for an all-reduce of ``n`` ranks
every element takes ``n - 1`` additions and ``n`` copies spread over ``n`` links, hence the
factor ``2(n-1)/n``. Gates are written in bus bandwidth so one bar serves 8 ranks or 128.

Units follow nccl-tests: GB/s of 10**9 bytes.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

GB: Final = 1e9  # nccl-tests divides by 1.0E9


class CollectiveOp(StrEnum):
    """The collectives nccl-tests times, by the name its binaries carry."""

    ALL_REDUCE = "all_reduce"
    ALL_REDUCE_IN_NETWORK = "all_reduce_in_network"  # reduced in the switch (SHARP)
    REDUCE_SCATTER = "reduce_scatter"
    ALL_GATHER = "all_gather"
    ALL_TO_ALL = "alltoall"
    BROADCAST = "broadcast"
    REDUCE = "reduce"


def bus_factor(op: CollectiveOp, ranks: int) -> float:
    """How much of the buffer crosses each rank's link, relative to the buffer's size.

    One rank moves nothing between ranks, so its factor (and bus bandwidth) is 0.
    """
    if ranks < 1:
        msg = f"a collective needs at least one rank, not {ranks}"
        raise ValueError(msg)
    n = float(ranks)
    if op is CollectiveOp.ALL_REDUCE:
        return 2.0 * (n - 1.0) / n
    if op is CollectiveOp.ALL_REDUCE_IN_NETWORK:
        return (n - 1.0) / (n + 1.0)
    if op in {CollectiveOp.REDUCE_SCATTER, CollectiveOp.ALL_GATHER, CollectiveOp.ALL_TO_ALL}:
        return (n - 1.0) / n
    return 1.0  # broadcast and reduce: all of it leaves (or reaches) the root


def algbw_gbs(size_bytes: float, seconds: float) -> float:
    """Algorithm bandwidth in GB/s: the operation's bytes over its time."""
    if seconds <= 0 or size_bytes < 0:
        msg = f"bandwidth needs a positive time and a size, not {size_bytes} B in {seconds} s"
        raise ValueError(msg)
    return size_bytes / seconds / GB


def busbw_gbs(
    size_bytes: float, seconds: float, ranks: int, op: CollectiveOp = CollectiveOp.ALL_REDUCE
) -> float:
    """Bus bandwidth in GB/s: :func:`algbw_gbs` times :func:`bus_factor`."""
    return algbw_gbs(size_bytes, seconds) * bus_factor(op, ranks)
