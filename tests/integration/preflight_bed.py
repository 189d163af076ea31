"""The pre-flight test bed: a collector, simulated nodes whose measured checks run on fixed-value
stand-ins for the hardware, and the ``fleetwatch preflight`` command run in-process against it.

The ``bed`` fixture (in ``conftest.py``) builds a :class:`Bed` from these parts.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import threading
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agent.preflight import executor
from agent.preflight.runners import Group, PreflightRunners, Rail
from cli import conventions
from cli import preflight as cli_preflight
from fleetwatch.preflight.vocabulary import Check, Measurement

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    import pytest

    from agent.sim.cluster import SimCluster
    from agent.sim.devices import SimGpu
    from agent.sim.hardware import SimNode
    from cli.dev.webhook_receiver import WebhookReceiver
    from collector.main import CollectorService

NODES = ["gpu-01", "gpu-02", "gpu-03", "gpu-04"]


@dataclass
class Fixed:
    """One node's hardware stand-in: fixed figures; ``hang`` blocks the pair test."""

    p2p: float = 380.0
    bidir: float = 745.0
    host: float = 55.0
    node_busbw: float = 480.0
    multi_busbw: float = 370.0
    ib: float = 395.0
    per_node: float = 1000.0  # ladder samples/s per node (perfect scaling)
    low_pairs: dict[tuple[int, int], float] = field(default_factory=dict)
    hang: threading.Event | None = None
    entered: threading.Event = field(default_factory=threading.Event)

    def measure_pairs(self, gpus: Sequence[int]) -> list[Measurement]:
        out = []
        for i in gpus:
            for j in gpus:
                if i != j:
                    value = self.low_pairs.get((min(i, j), max(i, j)), self.p2p)
                    out.append(Measurement(Check.P2P_BW, f"gpu:{i}-gpu:{j}", value, "GB/s"))
                    if i < j:
                        both = 2 * value if (i, j) in self.low_pairs else self.bidir
                        out.append(
                            Measurement(Check.P2P_BIDIR_BW, f"gpu:{i}-gpu:{j}", both, "GB/s")
                        )
        return out


class Pair:
    def __init__(self, f: Fixed) -> None:
        self.f = f

    def measure(self, gpus: Sequence[int], timeout_s: float) -> list[Measurement]:
        self.f.entered.set()
        if self.f.hang is not None:
            self.f.hang.wait(timeout_s + 30)
        return self.f.measure_pairs(gpus)


class Host:
    def __init__(self, f: Fixed) -> None:
        self.f = f

    def measure(self, gpus: Sequence[int], timeout_s: float) -> list[Measurement]:  # noqa: ARG002
        return [
            Measurement(check, f"gpu:{g}", self.f.host, "GB/s")
            for g in gpus
            for check in (Check.H2D_BW, Check.D2H_BW)
        ]


class Coll:
    """A group's bus bandwidth is its slowest member's (``multi_busbw``)."""

    def __init__(self, f: Fixed, figures: dict[str, Fixed]) -> None:
        self.f = f
        self.figures = figures

    def all_reduce(self, group: Group) -> Measurement:
        if len(group.nodes) == 1:
            return Measurement(Check.ALLREDUCE_NODE, "node", self.f.node_busbw, "GB/s")
        comp = f"nodes:{len(group.nodes)}"
        busbw = min(self.figures[n].multi_busbw for n in group.nodes)
        return Measurement(Check.ALLREDUCE_MULTI, comp, busbw, "GB/s")


class Ib:
    def __init__(self, f: Fixed) -> None:
        self.f = f

    def serve(self, rail: Rail, tcp_port: int, timeout_s: float) -> Measurement:  # noqa: ARG002
        return Measurement(Check.IB_WRITE_BW, f"ib:{rail.device}/{rail.port}", self.f.ib, "Gb/s")

    def connect(
        self,
        rail: Rail,
        server_addr: str,  # noqa: ARG002
        tcp_port: int,  # noqa: ARG002
        timeout_s: float,  # noqa: ARG002
    ) -> Measurement:
        return Measurement(Check.IB_WRITE_BW, f"ib:{rail.device}/{rail.port}", self.f.ib, "Gb/s")


class UtilRounds:
    """The executor's utilisation reads while a rung runs, each round of a node's GPUs whole.

    A stand-in rung is over at once where a real one runs minutes. Held for a fixed time, a
    loaded machine's reader could miss it, or read its GPUs turn busy or idle halfway through a
    round, whose idle GPUs lowered the mean below the 70 % bar. Here a rung's GPUs turn busy and
    idle only between two rounds, and stay busy until two rounds read them so.
    """

    ROUNDS = 2

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self._rounds = threading.Condition()
        self._busy: Counter[str] = Counter()  # rounds that read each GPU (by uuid) busy
        rounds = self

        class WholeRounds(executor._UtilSampler):
            def _read(self) -> None:
                with rounds._rounds:
                    super()._read()
                    with self._lock:
                        last = self._reads[-1]
                    rounds._busy.update(g.uuid for g in self._gpus if last.get(g.index))
                    rounds._rounds.notify_all()

        monkeypatch.setattr(executor, "_UtilSampler", WholeRounds)

    def keep_busy(self, gpus: Sequence[SimGpu], percent: int) -> None:
        """``gpus`` at ``percent`` until the executor read them so, then idle."""
        with self._rounds:
            for gpu in gpus:
                gpu.util_gpu = percent
            wanted = {g.uuid: self._busy[g.uuid] + self.ROUNDS for g in gpus}
            self._rounds.wait_for(
                lambda: all(self._busy[uuid] >= n for uuid, n in wanted.items()),
                30,  # never read: the rung's utilisation fails, and says so
            )
            for gpu in gpus:
                gpu.util_gpu = 0


class Ladder:
    """A training step keeps the node's (simulated) GPUs busy while it runs."""

    def __init__(self, f: Fixed, node: SimNode, rounds: UtilRounds) -> None:
        self.f = f
        self.node = node
        self.rounds = rounds

    def run(self, group: Group, steps: int) -> Measurement:  # noqa: ARG002
        # the executor reads utilisation on a real-time period while a rung runs
        self.rounds.keep_busy(self.node.gpus, 96)
        thr = self.f.per_node * len(group.nodes)
        return Measurement(Check.LADDER_THROUGHPUT, f"nodes:{len(group.nodes)}", thr, "samples/s")


def runners_of(
    figures: dict[str, Fixed], rounds: UtilRounds
) -> Callable[[str, SimNode], PreflightRunners]:
    def make(name: str, node: SimNode) -> PreflightRunners:
        f = figures.setdefault(name, Fixed())
        return PreflightRunners(
            pair=Pair(f),
            host=Host(f),
            collective=Coll(f, figures),
            ib=Ib(f),
            ladder=Ladder(f, node, rounds),
        )

    return make


@dataclass
class Bed:
    """A running collector, its simulated nodes, their stand-ins' figures, and the receiver."""

    service: CollectorService
    cluster: SimCluster
    figures: dict[str, Fixed]
    receiver: WebhookReceiver


def cli(bed: Bed, *argv: str) -> tuple[int, str]:
    """``fleetwatch preflight ...`` in-process against the collector's real HTTP API."""
    out = io.StringIO()
    api_url = f"http://127.0.0.1:{bed.service.http_port}"
    args = cli_preflight_args(api_url, argv)
    code = cli_preflight.run_command(args, lambda: None, out)
    return code, out.getvalue()


def cli_preflight_args(api_url: str, argv: Sequence[str]) -> Any:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    cli_preflight.add_parser(sub, api_url)
    conventions.share(parser)
    return conventions.parse(parser, ["preflight", *argv, "--api", api_url], {})


async def run_cli(bed: Bed, *argv: str) -> tuple[int, str]:
    """:func:`cli` on a thread, so that the collector's loop serves it."""
    return await asyncio.to_thread(cli, bed, *argv)


def api_text(service: CollectorService, path: str) -> tuple[int, str]:
    """GET ``path`` of the collector's HTTP API: the status and the body as text."""
    with urllib.request.urlopen(f"http://127.0.0.1:{service.http_port}{path}", timeout=5) as r:
        return r.status, r.read().decode()
