"""Simulated pre-flight runners, answered by the simulated hardware's bandwidth model.

Every interface of :mod:`agent.preflight.runners` has one here, reading
:mod:`agent.sim.bandwidth`.
The nodes of a simulated cluster share one process, so the runners of different nodes meet in a
:class:`SimFabric`: an ``ib_write_bw`` server waits there for its client, and the members of a
collective or ladder rung wait for each other before one figure is computed for them all. They
answer at once (milliseconds of real time); what the real tool would have taken is modelled
(:data:`TOOL_SECONDS`) and kept in :attr:`SimFabric.ledger` for the harness to add up.

A runner never raises for a check that could not run: a lost GPU, a port that is down, a peer that
never came or a tool that "crashes" (:attr:`SimFabric.broken`) is a measurement with an error.
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from agent.preflight.runners import PreflightRunners
from agent.sim.bandwidth import BandwidthModel, ModelError, Noise
from fleetwatch.preflight.vocabulary import Check, Measurement

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence

    from agent.preflight.runners import Group, Rail
    from agent.sim.devices import SimGpu
    from agent.sim.hardware import SimNode

# What each real tool takes on an 8xH100 node (seconds), as modelled for the harness's sums:
# nvbandwidth's pair tests (each a few hundred copies of 512 MiB), all_reduce_perf's sweep to
# 8 GiB, perftest's default 5 s test plus its connection setup, a ladder rung's start-up,
# warm-up and timed steps.
TOOL_SECONDS: Final[dict[str, float]] = {
    "p2p_pair": 1.5,  # one ordered pair, one direction
    "p2p_bidir_pair": 2.0,
    "host_copy": 1.5,  # one GPU, one direction
    "allreduce_node": 45.0,
    "allreduce_multi": 60.0,
    "ib_write_bw": 10.0,
    "ladder_rung": 90.0,
}
# However long a group's timeout, a simulated peer that has not come within this many real
# seconds never will (every node of a simulated cluster runs in this process).
MEET_WAIT_S: Final = 20.0


@dataclass(frozen=True, slots=True)
class Spent:
    """One tool run as the ledger keeps it: who ran what, and the simulated seconds it took."""

    node: str
    what: str
    seconds: float
    started: float  # real monotonic time the runner was called
    scope: tuple[str, ...] = ()  # the nodes the run involved (a group, a pair), in order


@dataclass(slots=True)
class _Meeting:
    """Members of one group (or both ends of one ib_write_bw test) waiting for each other."""

    expected: int
    arrived: set[str] = field(default_factory=set)
    done: threading.Event = field(default_factory=threading.Event)
    value: float | None = None
    error: str = ""
    evidence: str = ""
    busy: dict[tuple[str, int], float] = field(default_factory=dict)  # a rung's GPU shares
    compute: Callable[[_Meeting], tuple[float, str]] | None = None


@dataclass(frozen=True, slots=True)
class SimNodeRunners:
    """One node's simulated runners, one per interface of :mod:`agent.preflight.runners`."""

    pair: SimPairBandwidth
    host: SimHostBandwidth
    collective: SimCollective
    ib: SimIbBandwidth
    ladder: SimLadderStep


class SimFabric:
    """Where the simulated runners of every node meet, and the model they measure with."""

    def __init__(  # noqa: PLR0913 - the fabric and its timing
        self,
        nodes: Mapping[str, SimNode],
        *,
        model: BandwidthModel | None = None,
        seed: int = 0,
        addresses: Mapping[str, str] | None = None,
        meet_wait_s: float = MEET_WAIT_S,
        util_hold_s: float = 0.0,
    ) -> None:
        """The fabric of ``nodes``.

        ``addresses`` maps an address a server listens at to its node (a node's own name always
        works). ``util_hold_s``: how long (real seconds) a ladder rung keeps its GPUs busy, for
        an executor that samples utilisation on a real-time period while a rung runs.
        """
        self.nodes = dict(nodes)
        self.model = model or BandwidthModel(Noise(seed=seed))
        self.addresses = dict(addresses or {})
        self.meet_wait_s = meet_wait_s
        self.util_hold_s = util_hold_s
        self.ledger: list[Spent] = []
        # The (server, client) pairs the harness says the plan has: several simulated nodes
        # can share one address (every agent of one process is 127.0.0.1 to the collector),
        # and then a client's server is the one planned for it at that address.
        self._servers_of: dict[str, set[str]] = {}
        # Tools that "crash" on a node: (node, what) -> the message the tool would print.
        self.broken: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()
        self._meetings: dict[tuple[object, ...], _Meeting] = {}

    def runners(self, node: str) -> SimNodeRunners:
        """The runners of one node of the fabric."""
        return SimNodeRunners(
            pair=SimPairBandwidth(self, node),
            host=SimHostBandwidth(self, node),
            collective=SimCollective(self, node),
            ib=SimIbBandwidth(self, node),
            ladder=SimLadderStep(self, node),
        )

    def runners_for(self, name: str, node: SimNode) -> PreflightRunners:
        """Take ``node`` into the fabric; its runners as the agent takes them.

        What :class:`agent.sim.cluster.SimCluster` calls for each node it builds.
        """
        self.nodes[name] = node
        r = self.runners(name)
        return PreflightRunners(
            pair=r.pair, host=r.host, collective=r.collective, ib=r.ib, ladder=r.ladder
        )

    def spend(self, node: str, what: str, seconds: float, scope: tuple[str, ...] = ()) -> None:
        """Note that ``node`` ran ``what`` for ``seconds`` of (simulated) tool time."""
        with self._lock:
            self.ledger.append(Spent(node, what, seconds, time.monotonic(), scope or (node,)))

    def expect_pairs(self, pairs: Iterable[tuple[str, str]]) -> None:
        """The ``ib_write_bw`` (server, client) pairs a plan holds (added to those before)."""
        with self._lock:
            for server, client in pairs:
                self._servers_of.setdefault(client, set()).add(server)

    def servers_at(self, address: str, client: str) -> list[str]:
        """The nodes that may be listening at ``address`` for ``client``.

        An address is a node's name or one :attr:`addresses` maps to a node; any other (one
        several nodes share) means one of the servers planned for ``client``.
        """
        name = self.addresses.get(address, address)
        if name in self.nodes:
            return [name]
        with self._lock:
            return sorted(self._servers_of.get(client, ()))

    def waiting(self, keys: Sequence[tuple[object, ...]], timeout_s: float) -> int | None:
        """The index of the first of ``keys`` whose meeting has begun (None: none in time)."""
        deadline = time.monotonic() + min(timeout_s, self.meet_wait_s)
        while True:
            with self._lock:
                for index, key in enumerate(keys):
                    if key in self._meetings:
                        return index
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.001)

    def keep_busy(self, busy: Sequence[tuple[SimGpu, int]], *, hold: bool) -> None:
        """A ladder rung's GPUs at their busy percent, held while the agent reads them, then idle.

        Held for :attr:`util_hold_s` of real time when ``hold`` (the rung ran). A harness that
        sees the agent's utilisation reads may hold until they came instead: the executor reads
        on a real-time period, which a loaded machine stretches.
        """
        for gpu, percent in busy:
            gpu.util_gpu = percent
        if hold and self.util_hold_s > 0:
            time.sleep(self.util_hold_s)  # busy while the executor reads utilisation
        for gpu, _ in busy:
            gpu.util_gpu = 0

    def crash(self, node: str, what: str) -> str:
        """The message of a tool made to fail on ``node`` ("" when it runs)."""
        return self.broken.get((node, what), "")

    # ---- meetings ---------------------------------------------------------------------------

    def meet(
        self,
        key: tuple[object, ...],
        member: str,
        expected: int,
        timeout_s: float,
        compute: Callable[[_Meeting], tuple[float, str]] | None,
    ) -> _Meeting:
        """Join meeting ``key``; the last of ``expected`` members to come computes the figure.

        The figure is what the ``compute`` a member brought (an ``ib_write_bw`` client brings it,
        its server none) makes of the meeting.

        Returns the meeting once it is done, or (with ``error`` set) when ``timeout_s`` (at most
        :attr:`meet_wait_s` of real time) passes first.
        """
        with self._lock:
            meeting = self._meetings.setdefault(key, _Meeting(expected))
            meeting.arrived.add(member)
            if compute is not None:
                meeting.compute = compute
            last = len(meeting.arrived) >= meeting.expected and not meeting.done.is_set()
        if last:
            if meeting.compute is None:
                meeting.error = "nobody measured"
            else:
                try:
                    meeting.value, meeting.evidence = meeting.compute(meeting)
                except ModelError as exc:
                    meeting.error = str(exc)
            with self._lock:  # the next meeting of the same key is a new one
                if self._meetings.get(key) is meeting:
                    del self._meetings[key]
            meeting.done.set()
        elif not meeting.done.wait(min(timeout_s, self.meet_wait_s)):
            with self._lock:
                came = sorted(meeting.arrived)
                if self._meetings.get(key) is meeting:
                    del self._meetings[key]
            return _Meeting(
                expected, set(came), meeting.done, None, f"only {', '.join(came)} came in time"
            )
        return meeting


def _pair(i: int, j: int) -> str:
    return f"gpu:{i}-gpu:{j}"


class _NodeRunner:
    """What every simulated runner holds: the fabric and the node it runs on."""

    def __init__(self, fabric: SimFabric, node: str) -> None:
        self.fabric = fabric
        self.name = node

    @property
    def node(self) -> SimNode:
        return self.fabric.nodes[self.name]

    def _measured(
        self,
        what: tuple[Check, str, str],
        read: Callable[[SimNode, int, int], float] | Callable[[SimNode, int], float],
        *gpus: int,
    ) -> Measurement:
        check, component, unit = what
        tool = "nvbandwidth"
        crashed = self.fabric.crash(self.name, tool)
        if crashed:
            return Measurement(check, component, None, unit, error=f"{tool} failed: {crashed}")
        try:
            value: float = read(self.node, *gpus)
        except ModelError as exc:
            return Measurement(check, component, None, unit, error=str(exc))
        evidence = f"simulated {tool}: {value:.1f} {unit}"
        return Measurement(check, component, round(value, 2), unit, evidence=evidence)


class SimPairBandwidth(_NodeRunner):
    """``p2p_bw`` for every ordered pair and ``p2p_bidir_bw`` for every pair, as nvbandwidth."""

    def measure(self, gpus: Sequence[int], timeout_s: float) -> list[Measurement]:  # noqa: ARG002
        """Every pair of ``gpus`` (the modelled time goes to the ledger)."""
        model = self.fabric.model
        out = [
            self._measured((Check.P2P_BW, _pair(i, j), "GB/s"), model.p2p, i, j)
            for i, j in itertools.permutations(gpus, 2)
        ]
        out += [
            self._measured((Check.P2P_BIDIR_BW, _pair(i, j), "GB/s"), model.p2p_bidir, i, j)
            for i, j in itertools.combinations(sorted(gpus), 2)
        ]
        n = len(gpus)
        seconds = n * (n - 1) * TOOL_SECONDS["p2p_pair"]
        seconds += n * (n - 1) // 2 * TOOL_SECONDS["p2p_bidir_pair"]
        self.fabric.spend(self.name, "p2p", seconds)
        return out


class SimHostBandwidth(_NodeRunner):
    """``h2d_bw`` and ``d2h_bw`` of each GPU."""

    def measure(self, gpus: Sequence[int], timeout_s: float) -> list[Measurement]:  # noqa: ARG002
        """Both directions of every GPU in ``gpus``."""
        model = self.fabric.model
        out: list[Measurement] = []
        for g in gpus:
            out.append(self._measured((Check.H2D_BW, f"gpu:{g}", "GB/s"), model.h2d, g))
            out.append(self._measured((Check.D2H_BW, f"gpu:{g}", "GB/s"), model.d2h, g))
        self.fabric.spend(self.name, "host", len(gpus) * 2 * TOOL_SECONDS["host_copy"])
        return out


def _group_nodes(fabric: SimFabric, group: Group) -> list[SimNode]:
    missing = [n for n in group.nodes if n not in fabric.nodes]
    if missing:
        msg = f"no simulated node {', '.join(missing)}"
        raise ModelError(msg)
    return [fabric.nodes[n] for n in group.nodes]


class SimCollective(_NodeRunner):
    """An all-reduce across the group, as all_reduce_perf reports its bus bandwidth."""

    def all_reduce(self, group: Group) -> Measurement:
        """``allreduce_node`` for one node, ``allreduce_multi`` across several."""
        fabric = self.fabric
        single = len(group.nodes) == 1
        check = Check.ALLREDUCE_NODE if single else Check.ALLREDUCE_MULTI
        component = "node" if single else f"nodes:{len(group.nodes)}"
        tool = "all_reduce_perf"
        crashed = fabric.crash(self.name, tool)
        if crashed:
            return Measurement(check, component, None, "GB/s", error=f"{tool} failed: {crashed}")
        gpus = range(group.gpus_per_node)

        def compute(_: _Meeting) -> tuple[float, str]:
            nodes = _group_nodes(fabric, group)
            if single:
                value = fabric.model.allreduce_node(nodes[0], gpus)
            else:
                value = fabric.model.allreduce(nodes, group.gpus_per_node, group.run_id)
            return value, (
                f"simulated {tool}: {len(group.nodes) * group.gpus_per_node} ranks, "
                f"size {group.size_bytes} B, busbw {value:.1f} GB/s"
            )

        key = ("allreduce", group.run_id, group.nodes, group.size_bytes)
        met = fabric.meet(key, self.name, len(group.nodes), group.timeout_s, compute)
        fabric.spend(self.name, check.value, TOOL_SECONDS[check.value], group.nodes)
        value = None if met.value is None else round(met.value, 2)
        return Measurement(check, component, value, "GB/s", error=met.error, evidence=met.evidence)


class SimIbBandwidth(_NodeRunner):
    """``ib_write_bw`` on one rail between two simulated nodes."""

    def _key(self, rail: Rail, server: str, tcp_port: int) -> tuple[object, ...]:
        return ("ib", server, rail.device, rail.port, tcp_port)

    def _port_index(self, rail: Rail) -> int:
        for index, port in enumerate(self.node.ib_ports):
            if port.device == rail.device and port.port == rail.port:
                return index
        msg = f"no IB port {rail.device}/{rail.port} on {self.name}"
        raise ModelError(msg)

    def _answer(self, rail: Rail, met: _Meeting, peer: str, *, server: bool) -> Measurement:
        srv, cli = (self.name, peer) if server else (peer, self.name)
        component = f"rail:{rail.device}/{rail.port}:{srv}-{cli}"
        self.fabric.spend(self.name, "ib_write_bw", TOOL_SECONDS["ib_write_bw"], (srv, cli))
        value = None if met.value is None else round(met.value, 2)
        return Measurement(
            Check.IB_WRITE_BW, component, value, "Gb/s", error=met.error, evidence=met.evidence
        )

    def serve(self, rail: Rail, tcp_port: int, timeout_s: float) -> Measurement:
        """Wait for one client on ``rail``; answer what it measured."""
        crashed = self.fabric.crash(self.name, "ib_write_bw")
        if crashed:
            component = f"rail:{rail.device}/{rail.port}:{self.name}-?"
            return Measurement(
                Check.IB_WRITE_BW, component, None, "Gb/s", error=f"ib_write_bw failed: {crashed}"
            )
        key = self._key(rail, self.name, tcp_port)
        met = self.fabric.meet(key, self.name, 2, timeout_s, None)
        peer = next((n for n in sorted(met.arrived) if n != self.name), "?")
        if met.value is None and not met.error:
            met.error = "no client connected"
        return self._answer(rail, met, peer, server=True)

    def connect(self, rail: Rail, server_addr: str, tcp_port: int, timeout_s: float) -> Measurement:
        """Write to the server at ``server_addr`` on ``rail``; the Gb/s measured."""
        fabric = self.fabric
        crashed = fabric.crash(self.name, "ib_write_bw")
        if crashed:
            met = _Meeting(2, error=f"ib_write_bw failed: {crashed}")
            return self._answer(rail, met, server_addr, server=False)
        candidates = fabric.servers_at(server_addr, self.name)
        if not candidates:
            met = _Meeting(2, error=f"cannot reach {server_addr}: no such simulated node")
            return self._answer(rail, met, server_addr, server=False)
        keys = [self._key(rail, name, tcp_port) for name in candidates]
        index = 0 if len(keys) == 1 else fabric.waiting(keys, timeout_s)
        if index is None:
            met = _Meeting(2, error=f"no server listened at {server_addr} port {tcp_port}")
            return self._answer(rail, met, server_addr, server=False)
        server, client = fabric.nodes[candidates[index]], self.node

        def compute(_: _Meeting) -> tuple[float, str]:
            port = self._port_index(rail)
            value = fabric.model.ib_write(server, client, port)
            return value, (
                f"simulated ib_write_bw -d {rail.device} -i {rail.port} -p {tcp_port} "
                f"{server_addr}: BW average {value:.2f} Gb/sec"
            )

        met = fabric.meet(keys[index], self.name, 2, timeout_s, compute)
        return self._answer(rail, met, server.name, server=False)


class SimLadderStep(_NodeRunner):
    """A small data-parallel training job's steps across the group.

    While it runs each GPU of the node reports the share of the step it was busy as its
    utilisation, held by :meth:`SimFabric.keep_busy` (the only real wait of these runners: the
    agent's executor reads utilisation on a real-time period while a rung runs); idle (0) after.
    """

    def run(self, group: Group, steps: int) -> Measurement:
        """``ladder_throughput`` of the group (the same figure on every member)."""
        fabric = self.fabric
        component = f"nodes:{len(group.nodes)}"
        crashed = fabric.crash(self.name, "ladder")
        if crashed:
            return Measurement(
                Check.LADDER_THROUGHPUT, component, None, "samples/s", error=f"failed: {crashed}"
            )

        def compute(meeting: _Meeting) -> tuple[float, str]:
            nodes = _group_nodes(fabric, group)
            result = fabric.model.step(nodes, group.gpus_per_node, group.run_id)
            meeting.busy = result.utilisation
            return result.samples_per_s, (
                f"simulated training: {steps} steps of {result.step_s * 1000:.1f} ms on "
                f"{len(group.nodes) * group.gpus_per_node} GPUs"
            )

        key = ("ladder", group.run_id, group.nodes)
        met = fabric.meet(key, self.name, len(group.nodes), group.timeout_s, compute)
        busy = [
            (gpu, round(met.busy.get((self.name, gpu.index), 0.0)))
            for gpu in self.node.gpus[: group.gpus_per_node]
        ]
        fabric.keep_busy(busy, hold=met.value is not None)
        fabric.spend(self.name, "ladder_rung", TOOL_SECONDS["ladder_rung"], group.nodes)
        value = None if met.value is None else round(met.value, 1)
        return Measurement(
            Check.LADDER_THROUGHPUT,
            component,
            value,
            "samples/s",
            error=met.error,
            evidence=met.evidence,
        )
