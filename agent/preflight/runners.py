"""The narrow interfaces behind which each measured pre-flight check runs.

Each has a real runner (a tool such as ``nvbandwidth``, ``ib_write_bw`` or ``all_reduce_perf``
when installed, otherwise torch) and a simulated one that reads the simulated hardware, so the
agent's executor, the collector's orchestration and their tests are the same code either way.

Every method blocks (it runs a tool or a collective) and is called on a thread of the agent's
own, never on its event loop. None raises for a check that could not run: it answers a
:class:`~fleetwatch.preflight.vocabulary.Measurement` whose ``value`` is ``None`` and whose
``error`` says why (tool not installed, crashed, printed nothing it could parse, timed out).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Sequence

    from fleetwatch.preflight.vocabulary import Measurement


@dataclass(frozen=True, slots=True)
class Group:
    """Nodes that run one collective or ladder step together, as the collector planned it.

    ``nodes`` are in rank order and this node is ``nodes[node_rank]``; rank 0's node hosts the
    rendezvous at ``master_addr:master_port``. ``gpus_per_node`` ranks run on each node.
    """

    run_id: str
    nodes: tuple[str, ...]
    node_rank: int
    gpus_per_node: int
    master_addr: str
    master_port: int
    size_bytes: int
    timeout_s: float


@dataclass(frozen=True, slots=True)
class Rail:
    """One InfiniBand port used as a rail: ``device`` (e.g. ``mlx5_0``) and its 1-based port."""

    device: str
    port: int


class PairBandwidth(Protocol):
    """GPU-to-GPU bandwidth inside one node."""

    def measure(self, gpus: Sequence[int], timeout_s: float) -> list[Measurement]:
        """``p2p_bw`` for every ordered pair of ``gpus`` and ``p2p_bidir_bw`` for every pair."""
        ...


class HostBandwidth(Protocol):
    """Host<->device copy bandwidth of each GPU."""

    def measure(self, gpus: Sequence[int], timeout_s: float) -> list[Measurement]:
        """``h2d_bw`` and ``d2h_bw`` for each of ``gpus``."""
        ...


class Collective(Protocol):
    """An all-reduce across the group's GPUs; bus bandwidth as nccl-tests defines it."""

    def all_reduce(self, group: Group) -> Measurement:
        """``allreduce_node`` for a one-node group, ``allreduce_multi`` otherwise."""
        ...


class IbBandwidth(Protocol):
    """``ib_write_bw`` between one rail of two nodes: a server here, or a client to one."""

    def serve(self, rail: Rail, tcp_port: int, timeout_s: float) -> Measurement:
        """Serve one test on ``rail``; returns when the client is done (or ``timeout_s``)."""
        ...

    def connect(self, rail: Rail, server_addr: str, tcp_port: int, timeout_s: float) -> Measurement:
        """Run the client against a server at ``server_addr``; the Gb/s it measured."""
        ...


class LadderStep(Protocol):
    """A small training job's steps across the group (one rung of the scaling ladder)."""

    def run(self, group: Group, steps: int) -> Measurement:
        """``ladder_throughput`` (samples/s for the whole group, measured on node rank 0).

        While it runs, the agent reads every GPU's utilisation through NVML every 0.2 s (from
        0.2 s after the start) for ``gpu_utilisation``: a rung shorter than that gives no
        utilisation (could_not_run), so a simulated runner keeps its GPUs busy that long.
        """
        ...


@dataclass(frozen=True, slots=True)
class PreflightRunners:
    """The runners one agent carries checks out with.

    A missing one makes its checks could_not_run on this node (no GPUs to measure, no HCAs).
    """

    pair: PairBandwidth | None = None
    host: HostBandwidth | None = None
    collective: Collective | None = None
    ib: IbBandwidth | None = None
    ladder: LadderStep | None = None
