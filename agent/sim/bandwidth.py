"""What the simulated hardware would measure: bandwidths, bus bandwidth, training throughput.

Every figure is derived from the simulated state (:class:`agent.sim.hardware.SimNode`), so the
faults the simulator already plays lower it the way the real fault does, and nothing else does:

- an NVLink down takes its share of the GPU's 18 links away; a link whose data-link error
  counters grew (replays, recoveries, CRC errors) carries less, more so the more errors;
  peer-to-peer bandwidth between two GPUs is bounded by the weaker GPU's links, and by a
  ``p2p_low`` factor on the pair (a slow path that leaves no error counter behind);
- host<->device bandwidth follows the PCIe link the GPU trained at (generation and width);
- ``ib_write_bw`` on a rail follows the slower port's trained rate, the physical-layer errors
  either end counted, congestion (``port_xmit_wait``) and a ``bad_cable`` between the two nodes;
- an all-reduce across nodes runs one channel per rail, so the slowest rail between
  neighbouring nodes of the ring bounds it; inside a node the weakest GPU's NVLink does;
- a training step waits for its slowest GPU (``slow_gpu``, thermal clocks) and for the
  all-reduce of its gradients; a GPU's utilisation is the share of the step it was busy.

Healthy figures are those of an 8xH100 SXM node (NVLink 4 through NVSwitch, PCIe Gen5 x16) with
ConnectX-7 NDR ports, as public reports and the peers' acceptance bars put them. Measurements
carry small seeded noise (:class:`Noise`), so outlier detection sees a realistic spread and a
run is repeatable for a seed.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Sequence

    from agent.sim.devices import SimGpu
    from agent.sim.hardware import SimNode

# Healthy 8xH100 SXM + ConnectX-7 NDR figures.
P2P_GBS: Final = 380.0  # GB/s one direction, copy-engine read (nvbandwidth): 370-390
P2P_BIDIR_GBS: Final = 760.0  # GB/s both directions at once: 740-780
H2D_GBS: Final = 54.0  # GB/s host to device on Gen5 x16: 50-55
D2H_GBS: Final = 53.0  # GB/s device to host
ALLREDUCE_NODE_GBS: Final = 480.0  # single-node all-reduce bus bandwidth: 470-490
IB_EFFICIENCY: Final = 0.988  # ib_write_bw reaches ~395 Gb/s on a 400 Gb/s port
ALLREDUCE_IB_EFFICIENCY: Final = 0.94  # NCCL's bus bandwidth against the rails' sum
NOISE_SD: Final = 0.006  # relative standard deviation of a measurement

# How errors cost bandwidth. A link or port keeps the share 1 / (1 + errors / scale).
NVLINK_ERROR_SCALE: Final = 50.0  # replays + CRC errors (+ 4 per recovery) that halve a link
NVLINK_RECOVERY_WEIGHT: Final = 4
IB_ERROR_SCALE: Final = 2_000.0  # symbol + receive errors that halve a port's throughput
CONGESTION_SCALE: Final = 100_000.0  # xmit waits per second that halve a port's throughput
MIN_SHARE: Final = 0.05

# PCIe payload bandwidth per lane (GB/s) by generation, after line encoding.
PCIE_LANE_GBS: Final = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}

# The ladder's small training step (data parallel): per GPU, at full clocks.
STEP_COMPUTE_S: Final = 0.10
STEP_SAMPLES_PER_GPU: Final = 32
GRADIENT_BYTES: Final = 2.0e9  # all-reduced once per step
FULL_CLOCK_MHZ: Final = 1980


class ModelError(Exception):
    """The measurement cannot be made on this hardware (a lost GPU, a port that is down)."""


def _seed(*parts: object) -> int:
    digest = hashlib.blake2b("/".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


@dataclass(slots=True)
class Noise:
    """Seeded multiplicative noise: the n-th draw for a key is the same in every run of a seed."""

    seed: int = 0
    sd: float = NOISE_SD
    _draws: dict[str, int] = field(default_factory=dict)

    def factor(self, *key: object) -> float:
        """A factor near 1 for the next measurement of ``key`` (never below 0.5)."""
        if self.sd <= 0:
            return 1.0
        name = "/".join(map(str, key))
        n = self._draws.get(name, 0)
        self._draws[name] = n + 1
        rng = random.Random(_seed(self.seed, name, n))  # noqa: S311 - noise, not secrets
        return max(0.5, 1.0 + rng.gauss(0.0, self.sd))


def nvlink_share(gpu: SimGpu) -> float:
    """The share of the GPU's NVLink bandwidth its links carry (1.0: all up, no errors)."""
    if not gpu.nvlink_up:
        return 0.0
    total = 0.0
    for up, (replay, recovery, crc) in zip(gpu.nvlink_up, gpu.nvlink_errors, strict=True):
        if up:
            errors = replay + crc + NVLINK_RECOVERY_WEIGHT * recovery
            total += max(MIN_SHARE, 1.0 / (1.0 + errors / NVLINK_ERROR_SCALE))
    return total / len(gpu.nvlink_up)


def pair_factor(node: SimNode, i: int, j: int) -> float:
    """The share of peer-to-peer bandwidth between GPUs ``i`` and ``j`` of ``node``."""
    return min(nvlink_share(node.gpus[i]), nvlink_share(node.gpus[j])) * node.p2p_factors.get(
        (min(i, j), max(i, j)), 1.0
    )


def pcie_share(gpu: SimGpu) -> float:
    """The GPU's PCIe link bandwidth against the Gen5 x16 it is built for."""
    lane = PCIE_LANE_GBS.get(gpu.pcie_gen, 0.0)
    return lane * gpu.pcie_width / (PCIE_LANE_GBS[5] * 16)


def compute_factor(gpu: SimGpu) -> float:
    """How many times longer the GPU takes for a step than a healthy one (slowdown, clocks)."""
    clock = gpu.sm_clock_mhz or FULL_CLOCK_MHZ
    return gpu.slowdown * max(1.0, FULL_CLOCK_MHZ / clock)


def port_share(node: SimNode, port: int) -> float:
    """The share of its line rate a port delivers: errors and congestion cost throughput."""
    p = node.ib_ports[port]
    errors = 1.0 / (1.0 + (p.symbol_errors + p.rcv_errors) / IB_ERROR_SCALE)
    congestion = 1.0 / (1.0 + p.xmit_wait_per_s / CONGESTION_SCALE)
    return max(MIN_SHARE, errors * congestion)


def _usable(node: SimNode, gpus: Sequence[int]) -> None:
    for g in gpus:
        if node.gpus[g].lost:
            msg = f"GPU {g} of {node.name} is lost"
            raise ModelError(msg)


@dataclass(slots=True)
class BandwidthModel:
    """The measurements of simulated hardware, with seeded noise."""

    noise: Noise = field(default_factory=Noise)

    # ---- inside a node ----------------------------------------------------------------------

    def p2p(self, node: SimNode, src: int, dst: int) -> float:
        """GB/s copying from GPU ``src`` to GPU ``dst`` (one direction)."""
        _usable(node, (src, dst))
        clean = P2P_GBS * pair_factor(node, src, dst)
        return clean * self.noise.factor(node.name, "p2p", src, dst)

    def p2p_bidir(self, node: SimNode, i: int, j: int) -> float:
        """GB/s copying both ways between GPUs ``i`` and ``j`` at once."""
        _usable(node, (i, j))
        clean = P2P_BIDIR_GBS * pair_factor(node, i, j)
        return clean * self.noise.factor(node.name, "p2p_bidir", min(i, j), max(i, j))

    def h2d(self, node: SimNode, gpu: int) -> float:
        """GB/s host to device."""
        _usable(node, (gpu,))
        return H2D_GBS * pcie_share(node.gpus[gpu]) * self.noise.factor(node.name, "h2d", gpu)

    def d2h(self, node: SimNode, gpu: int) -> float:
        """GB/s device to host."""
        _usable(node, (gpu,))
        return D2H_GBS * pcie_share(node.gpus[gpu]) * self.noise.factor(node.name, "d2h", gpu)

    @staticmethod
    def node_share(node: SimNode, gpus: Sequence[int]) -> float:
        """An all-reduce over ``gpus`` of a node runs at its weakest GPU's and pair's share."""
        _usable(node, gpus)
        shares = [nvlink_share(node.gpus[g]) for g in gpus]
        pairs = [f for (i, j), f in node.p2p_factors.items() if i in gpus and j in gpus]
        return min(shares, default=1.0) * min(pairs, default=1.0)

    def allreduce_node(self, node: SimNode, gpus: Sequence[int]) -> float:
        """Bus bandwidth (GB/s) of an all-reduce over ``gpus`` of one node."""
        clean = ALLREDUCE_NODE_GBS * self.node_share(node, gpus)
        return clean * self.noise.factor(node.name, "allreduce_node")

    # ---- across nodes -----------------------------------------------------------------------

    @staticmethod
    def rail_gbps(a: SimNode, b: SimNode, port: int) -> float:
        """Gb/s ``ib_write_bw`` would reach on rail ``port`` between ``a`` and ``b`` (no noise)."""
        pa, pb = a.ib_ports[port], b.ib_ports[port]
        for node, p in ((a, pa), (b, pb)):
            if p.state != "ACTIVE":
                msg = f"port {p.device}/{p.port} of {node.name} is {p.state}, not ACTIVE"
                raise ModelError(msg)
        line = min(pa.rate_gbps, pb.rate_gbps)
        cable = a.cable_factors.get((b.name, port), 1.0) * b.cable_factors.get((a.name, port), 1.0)
        return line * IB_EFFICIENCY * min(port_share(a, port), port_share(b, port)) * cable

    def ib_write(self, server: SimNode, client: SimNode, port: int) -> float:
        """Gb/s ``ib_write_bw`` measures from ``client`` to ``server`` on rail ``port``."""
        clean = self.rail_gbps(server, client, port)
        return clean * self.noise.factor("ib", server.name, client.name, port)

    @staticmethod
    def ring_gbs(nodes: Sequence[SimNode], gpus_per_node: int) -> float:
        """Bus bandwidth (GB/s, no noise) of an all-reduce across ``nodes`` in ring order.

        One channel per rail: each rail's slowest hop between neighbours bounds its channel,
        the slowest channel bounds them all (they carry equal shares). NVLink bounds it too.
        """
        gpus = range(gpus_per_node)
        intra = min(ALLREDUCE_NODE_GBS * BandwidthModel.node_share(n, gpus) for n in nodes)
        if len(nodes) == 1:
            return intra
        rails = min(len(n.ib_ports) for n in nodes)
        hops = [(nodes[k], nodes[(k + 1) % len(nodes)]) for k in range(len(nodes))]
        slowest = min(
            BandwidthModel.rail_gbps(a, b, r) / IB_EFFICIENCY for r in range(rails) for a, b in hops
        )
        inter = rails * slowest / 8 * ALLREDUCE_IB_EFFICIENCY
        return min(intra, inter)

    def allreduce(self, nodes: Sequence[SimNode], gpus_per_node: int, run: str) -> float:
        """Bus bandwidth (GB/s) of an all-reduce across ``nodes`` (one node: inside it)."""
        return self.ring_gbs(nodes, gpus_per_node) * self.noise.factor(
            "allreduce", run, *(n.name for n in nodes)
        )

    # ---- the scaling ladder -----------------------------------------------------------------

    def step(self, nodes: Sequence[SimNode], gpus_per_node: int, run: str) -> LadderStepResult:
        """One data-parallel training step across ``nodes``: throughput and each GPU's use."""
        gpus = range(gpus_per_node)
        for n in nodes:
            _usable(n, gpus)
        computes = {
            (n.name, g): STEP_COMPUTE_S * compute_factor(n.gpus[g]) for n in nodes for g in gpus
        }
        ranks = len(nodes) * gpus_per_node
        busbw = self.ring_gbs(nodes, gpus_per_node) * 1e9
        comm = GRADIENT_BYTES * 2 * (ranks - 1) / ranks / busbw if ranks > 1 else 0.0
        noise = self.noise.factor("step", run, *(n.name for n in nodes))
        step_s = (max(computes.values()) + comm) * noise
        utilisation = {key: min(100.0, 100.0 * c / step_s) for key, c in computes.items()}
        return LadderStepResult(
            samples_per_s=ranks * STEP_SAMPLES_PER_GPU / step_s,
            step_s=step_s,
            utilisation=utilisation,
        )


@dataclass(frozen=True, slots=True)
class LadderStepResult:
    """One simulated training step: group throughput, step time, each GPU's busy percent."""

    samples_per_s: float
    step_s: float
    utilisation: dict[tuple[str, int], float]
