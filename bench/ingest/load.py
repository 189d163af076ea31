"""Load for ``bench/collector_ingest.py``: many nodes' streams, replayed from a recording.

Run by the benchmark as a child process: ``bench/ingest/load.py --collector HOST:PORT
--recording FILE --first N --count M``. Each of its nodes opens its own gRPC channel and stream
to the collector (as each real agent does) and sends, as raw bytes prepared from the recording
(``bench/ingest/wire.py``): its Hello, the first full Report, then one steady-state Report a second,
cycling through the recorded ones from a random place, at a random phase within the second (a real
fleet is not in step). ``--events-per-s`` times a second (the whole fleet's rate; this process sends
its share) a random node also sends the recorded corrected-AER event (a probe); the collector acks
an event once it is journaled, and since a stream is handled in order, the ack also says that
everything the node sent before the event is in the collector's model.

Nodes connect at most ``--connecting`` at a time: a node counts as connecting from its Hello
until the ack of an event sent right after its first Report (so the collector is never handed
thousands of 80 kB first Reports at once, and the time the fleet takes to connect is measured).

The pipe (``bench/helpers/pipe.py``, as ``bench/helpers/sim_fleet.py``'s): JSON lines on stdin,
JSON lines on stdout.

* ``{"op": "status"}`` -> ``{"op": "status", "connected": .., "ready": .., "failed": ..}``;
* ``{"op": "record"}``: start counting (the measurement window);
* ``{"op": "window"}`` -> ``{"op": "window", ...}``: what was sent and acked since ``record``;
* ``{"op": "fault", "id": .., "node": .., "kind": ..}`` -> ``{"op": "injected", "id": ..,
  "t": <time.time() just before the fault's first message was written>}``: the recorded
  messages an agent sent after that fault, as this node's (``kind``: a key of
  ``bench/helpers/faults.py``'s ``FAULTS``);
* ``{"op": "reconnect"}`` -> ``{"op": "reconnect"}``: from now on as ``--reconnect`` (each node
  reconnects with an agent's backoff when its stream ends, with no pacing of ours): a fleet
  measured without it can then be measured coming back after its collector's restart;
* ``{"op": "quit"}`` (or the end of stdin): close every stream and exit.

Figures in ``window``: reports and bytes written; ``late_ms_hist``: how late each report's
task woke for its slot (this process's own lateness: a busy event loop), as a histogram of whole
milliseconds; ``behind_ms_hist``: how far behind the slot a report went because the stream's
previous write had not finished (the collector not reading: gRPC flow control), and
``skipped``: slots given up because a stream was a whole interval behind (a real agent sends
its changes merged, later); ``event_lags``: each probe event's (send time since ``record``,
send-to-ack ms); ``events_unacked``: probe events sent in the window and not acked when asked,
with the oldest one's age; ``loop_lag_ms_hist``: how late this process's event loop woke from a
10 ms sleep, as a histogram of whole milliseconds (a probe's send-to-ack time holds this
process's own lag twice: its write and its ack's read); ``cpu_s``: this process's CPU seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import random
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from agent.config import AgentConfig
from agent.link.backoff import Backoff
from agent.link.stream import HEALTHY_AFTER_S, WELCOME_TIMEOUT_S
from collector.ingest.grpc_wakeups import DrainedWakeups, drain_wakeups
from fleetwatch.wire import settings
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, for bench.*
from bench.helpers.pipe import say, stdin_lines
from bench.ingest.wire import NodeWire, Recording, report_message

HIST_CAP_MS = 60_000
# The process's own event loop is timed with a sleep this long, over and over: how late it wakes
# is how long a probe's write or its ack's read waited here, not in the collector.
LAG_TICK_S = 0.01


@dataclass(slots=True)
class Window:
    """What happened since ``record``."""

    began_mono: float = field(default_factory=time.monotonic)
    began_cpu: float = 0.0
    reports: int = 0
    bytes: int = 0
    skipped: int = 0
    events: int = 0
    late: Counter[int] = field(default_factory=Counter)
    behind: Counter[int] = field(default_factory=Counter)
    lags: list[tuple[float, float]] = field(default_factory=list)
    write_max_ms: float = 0.0
    loop_lag: Counter[int] = field(default_factory=Counter)  # ms late, by whole ms


def cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


class Node:
    """One generated node's stream."""

    __slots__ = (
        "call",
        "channel",
        "connected",
        "failed",
        "lock",
        "pending",
        "ready",
        "ready_seq",
        "seq",
        "wire",
    )

    def __init__(self, wire: NodeWire) -> None:
        self.wire = wire
        self.call: grpc.aio.StreamStreamCall[bytes, bytes] | None = None
        self.channel: grpc.aio.Channel | None = None
        self.lock = asyncio.Lock()
        self.seq = 0
        self.ready_seq = 0
        self.pending: dict[int, tuple[float, bool]] = {}  # seq -> (sent mono, in window)
        self.connected = False
        self.ready = asyncio.Event()
        self.failed = ""


class Load:
    """Every node of this process, the schedule, and the figures."""

    def __init__(self, args: argparse.Namespace, recording: Recording) -> None:
        self.args = args
        self.rec = recording
        self.rng = random.Random(args.seed * 1_000_003 + args.first)
        self.nodes = {
            (w := NodeWire(recording, i)).name: Node(w)
            for i in range(args.first, args.first + args.count)
        }
        self.connecting = asyncio.Semaphore(args.connecting)
        self.window: Window | None = None
        self.tasks: list[asyncio.Task[None]] = []
        self.stream_errors: Counter[str] = Counter()
        self.commands = 0
        self.reconnects = 0
        self.wakeups: DrainedWakeups | None = None

    # ---- one node ------------------------------------------------------------------------

    async def run_node(self, node: Node) -> None:
        """Run the node's stream; with ``--reconnect``, again after each end, as an agent does.

        An agent's pacing (``agent/link/stream.py`` with one collector): a delay drawn from its
        backoff's window before each new try, the window grown after each failed one and
        started small again after a stream that lasted ``HEALTHY_AFTER_S``. Without it, the
        first stream's end is the node's, unless the ``reconnect`` op came meanwhile.
        """
        backoff = Backoff(self.args.backoff_initial, self.args.backoff_max, self.rng)
        while True:
            began = time.monotonic()
            await self._run_stream(node)
            if not self.args.reconnect:
                return
            self.reconnects += 1
            if node.call is not None:
                node.call.cancel()
            if node.channel is not None:
                await node.channel.close()
            node.call = node.channel = None
            node.connected = False
            node.ready.clear()
            node.pending.clear()
            node.failed = ""
            if time.monotonic() - began >= HEALTHY_AFTER_S:
                backoff.reset()
            await asyncio.sleep(backoff.next_delay())

    async def _run_stream(self, node: Node) -> None:
        """Connect, say Hello, send the first Report, then a Report every interval."""
        try:
            async with self.connecting:
                # Its own subchannel pool: its own TCP connection, as each real agent has
                # (channels to one address would otherwise share one connection).
                options = [*settings.client_options(), ("grpc.use_local_subchannel_pool", 1)]
                channel = grpc.aio.insecure_channel(self.args.collector, options=options)
                call: grpc.aio.StreamStreamCall[bytes, bytes] = channel.stream_stream(
                    settings.STREAM_METHOD
                )()
                node.call, node.channel = call, channel
                if self.wakeups is None:  # as the collector does: see collector/ingest/grpc_wakeups
                    self.wakeups = drain_wakeups(asyncio.get_running_loop())
                await self._open(node, call)
                await node.ready.wait()
            await self._steady(node, call)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - counted and shown; the run is judged on it
            what = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
            stage = "steady" if node.ready.is_set() else "connected" if node.connected else "hello"
            if stage == "hello" and what == "CANCELLED":
                # gRPC cancels a call the server has not taken up within 30 s
                # (grpc.server_max_unrequested_time_in_server): its event loop is too busy.
                what += " (the collector did not take the stream up: overloaded)"
            node.failed = f"{type(exc).__name__} ({stage}): {what}"[:300]
            # counted by kind, stage and message (numbers cut, so that alike ones add up)
            self.stream_errors[re.sub(r"\d+", "N", node.failed[:120])] += 1
            if not self.args.reconnect:
                print(f"{node.wire.name}: {node.failed}", file=sys.stderr, flush=True)

    async def _open(self, node: Node, call: grpc.aio.StreamStreamCall[bytes, bytes]) -> None:
        now_ms = int(time.time() * 1000)
        await call.write(node.wire.hello(self.rec, now_ms))
        began = time.monotonic()
        try:
            raw = await asyncio.wait_for(call.read(), WELCOME_TIMEOUT_S)
        except (TimeoutError, grpc.aio.AioRpcError) as exc:
            # A read cut short by the timeout cancels the call: it ends as CANCELLED.
            if time.monotonic() - began < WELCOME_TIMEOUT_S:
                raise
            msg = f"no Welcome within {WELCOME_TIMEOUT_S:g} s of the Hello"
            raise TimeoutError(msg) from exc
        if not isinstance(raw, bytes):
            msg = "the stream ended before the Welcome"
            raise ConnectionError(msg)
        welcome = pb.CollectorMessage.FromString(raw)
        if welcome.WhichOneof("body") != "welcome":
            msg = f"expected a Welcome, got {welcome.WhichOneof('body')}"
            raise ConnectionError(msg)
        node.seq = welcome.welcome.journaled.seq
        node.connected = True
        self.tasks.append(asyncio.create_task(self._read(node, call)))
        async with node.lock:
            await call.write(node.wire.report(self.rec.first, int(time.time() * 1000)))
            # known before the probe is written: a quick collector's ack can come first
            node.ready_seq = node.seq + 1
            # Not a probe of the window: it waits behind the node's own first Report, and its
            # ack is what makes the node ready (timed as such by the reconnect storm).
            await self._probe(node, call, counted=False)

    async def _probe(
        self, node: Node, call: grpc.aio.StreamStreamCall[bytes, bytes], *, counted: bool = True
    ) -> int:
        """Send the recorded AER event as the node's next event (the caller holds the lock).

        ``counted``: its send-to-ack time is one of the window's probe latencies.
        """
        node.seq += 1
        node.pending[node.seq] = (time.monotonic(), counted and self.window is not None)
        await call.write(node.wire.event(self.rec.probe, node.seq, int(time.time() * 1000)))
        if self.window is not None:
            self.window.events += 1
        return node.seq

    async def _steady(self, node: Node, call: grpc.aio.StreamStreamCall[bytes, bytes]) -> None:
        loop = asyncio.get_running_loop()
        steady = self.rec.steady
        k = self.rng.randrange(len(steady))
        interval = self.args.interval
        due = loop.time() + self.rng.uniform(0.0, interval)
        while True:
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
                late, behind = loop.time() - due, 0.0
            else:
                late, behind = 0.0, -delay
            if behind >= interval:  # a whole interval behind: give the slots up
                missed = int(behind // interval)
                due += missed * interval
                if self.window is not None:
                    self.window.skipped += missed
            data = node.wire.report(steady[k % len(steady)], int(time.time() * 1000))
            k += 1
            async with node.lock:
                began = loop.time()
                await call.write(data)
                wrote_at = loop.time()
            w = self.window
            if w is not None:
                w.reports += 1
                w.bytes += len(data)
                w.late[min(int(late * 1000), HIST_CAP_MS)] += 1
                w.behind[min(int(behind * 1000), HIST_CAP_MS)] += 1
                w.write_max_ms = max(w.write_max_ms, (wrote_at - began) * 1000)
            due += interval

    async def probes(self) -> None:
        """Send this process's share of ``--events-per-s`` probe events, evenly spaced.

        Each from a random node (one still connecting, or busy writing, is passed over).
        """
        rate = self.args.events_per_s * self.args.count / self.args.nodes
        if rate <= 0:
            return
        loop = asyncio.get_running_loop()
        nodes = list(self.nodes.values())
        due = loop.time()
        while True:
            due += 1.0 / rate
            await asyncio.sleep(max(0.0, due - loop.time()))
            node = self.rng.choice(nodes)
            if node.call is None or not node.ready.is_set() or node.lock.locked():
                continue
            # A stream that broke under it (its collector was killed) is the stream task's
            # to count; this task must go on probing the others.
            with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
                async with node.lock:
                    await self._probe(node, node.call)

    async def watch_lag(self) -> None:
        """Count how late this process's event loop wakes from a short sleep, in the window."""
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + LAG_TICK_S
            await asyncio.sleep(LAG_TICK_S)
            if self.window is not None:
                late_ms = (loop.time() - due) * 1000
                self.window.loop_lag[min(int(late_ms), HIST_CAP_MS)] += 1

    async def _read(self, node: Node, call: grpc.aio.StreamStreamCall[bytes, bytes]) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
            while isinstance(raw := await call.read(), bytes):
                msg = pb.CollectorMessage.FromString(raw)
                body = msg.WhichOneof("body")
                if body == "ack":
                    self._acked(node, msg.ack.seq)
                elif body == "command":
                    self.commands += 1
                    result = pb.CommandResult(
                        command_id=msg.command.command_id, ok=True, detail="bench: done"
                    )
                    async with node.lock:
                        await call.write(pb.AgentMessage(command_result=result).SerializeToString())

    def _acked(self, node: Node, seq: int) -> None:
        now = time.monotonic()
        w = self.window
        for s in [s for s in node.pending if s <= seq]:
            sent, in_window = node.pending.pop(s)
            if in_window and w is not None:
                w.lags.append((sent - w.began_mono, (now - sent) * 1000))
        if not node.ready.is_set() and seq >= node.ready_seq > 0:
            node.ready.set()

    # ---- commands from the benchmark ------------------------------------------------------

    async def fault(self, fid: int, name: str, kind: str) -> None:
        """Send the recorded messages of fault ``kind`` on node ``name``'s stream."""
        node = self.nodes[name]
        script = self.rec.faults[kind]
        pairs = node.wire.pairs(script.uuids)
        call = node.call
        if call is None:
            say(op="injected", id=fid, t=None, error="not connected")
            return
        async with node.lock:
            t = time.time()
            now_ms = int(t * 1000)
            for what, raw in script.messages:
                if what == "event":
                    node.seq += 1
                    node.pending[node.seq] = (time.monotonic(), False)
                    data = node.wire.event(raw, node.seq, now_ms, pairs)
                else:
                    data = report_message(now_ms, node.wire.render(raw, pairs))
                await call.write(data)
        say(op="injected", id=fid, t=t, gpu=script.gpu)

    def status(self) -> dict[str, Any]:
        """How many nodes are connected, ready (first Report in) and failed."""
        nodes = self.nodes.values()
        return {
            "connected": sum(n.connected for n in nodes),
            "ready": sum(n.ready.is_set() for n in nodes),
            "failed": 0 if self.args.reconnect else sum(bool(n.failed) for n in nodes),
            "reconnects": self.reconnects,
            "errors": dict(self.stream_errors),
            "first_error": next((n.failed for n in nodes if n.failed), None),
        }

    def window_figures(self) -> dict[str, Any]:
        """What was sent and acked since ``record`` (see the module docstring)."""
        w = self.window or Window()
        now = time.monotonic()
        unacked = [
            now - sent for n in self.nodes.values() for sent, inw in n.pending.values() if inw
        ]
        return {
            "seconds": round(now - w.began_mono, 3),
            "cpu_s": round(cpu_seconds() - w.began_cpu, 3),
            "reports": w.reports,
            "bytes": w.bytes,
            "skipped": w.skipped,
            "events": w.events,
            "late_ms_hist": {str(k): v for k, v in sorted(w.late.items())},
            "behind_ms_hist": {str(k): v for k, v in sorted(w.behind.items())},
            "write_max_ms": round(w.write_max_ms, 1),
            "loop_lag_ms_hist": {str(k): v for k, v in sorted(w.loop_lag.items())},
            "event_lags": [[round(t, 3), round(ms, 2)] for t, ms in w.lags],
            "events_unacked": len(unacked),
            "events_unacked_oldest_s": round(max(unacked, default=0.0), 3),
            "commands": self.commands,
            "role": self.args.role,
            **self.status(),
        }


def command(load: Load, msg: dict[str, Any], background: set[asyncio.Task[None]]) -> bool:
    """Carry out one command of the pipe (see the module's docstring); False for ``quit``."""
    op = msg.get("op")
    if op == "status":
        say(op="status", **load.status())
    elif op == "record":
        load.window = Window(began_cpu=cpu_seconds())
    elif op == "window":
        say(op="window", **load.window_figures())
        load.window = None
    elif op == "fault":
        task = asyncio.create_task(load.fault(int(msg["id"]), msg["node"], msg["kind"]))
        background.add(task)
        task.add_done_callback(background.discard)
    elif op == "reconnect":
        load.args.reconnect = True
        load.connecting = asyncio.Semaphore(len(load.nodes))  # the agents' backoff only
        say(op="reconnect")
    return op != "quit"


async def serve(args: argparse.Namespace) -> None:
    recording = Recording.load(args.recording)
    load = Load(args, recording)
    reader = await stdin_lines()
    load.tasks.extend(asyncio.create_task(load.run_node(n)) for n in load.nodes.values())
    load.tasks.append(asyncio.create_task(load.probes()))
    load.tasks.append(asyncio.create_task(load.watch_lag()))
    say(op="started", nodes=len(load.nodes))
    background: set[asyncio.Task[None]] = set()
    try:
        while (line := await reader.readline()) and command(load, json.loads(line), background):
            pass
    finally:
        for task in load.tasks:
            task.cancel()
        for node in load.nodes.values():
            if node.call is not None:
                node.call.cancel()
        await asyncio.gather(*load.tasks, return_exceptions=True)
        say(op="stats", cpu_s=round(cpu_seconds(), 2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--collector", required=True, help="host:port of the collector's gRPC")
    parser.add_argument("--recording", type=Path, required=True)
    parser.add_argument("--first", type=int, required=True, help="index of the first node")
    parser.add_argument("--count", type=int, required=True, help="nodes in this process")
    parser.add_argument("--nodes", type=int, required=True, help="nodes in the whole fleet")
    parser.add_argument(
        "--events-per-s", type=float, default=5.0, help="probe events a second, whole fleet"
    )
    parser.add_argument("--interval", type=float, default=1.0, help="s between a node's reports")
    parser.add_argument("--connecting", type=int, default=16, help="nodes connecting at once")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--role",
        choices=("load", "probe"),
        default="load",
        help="probe: a few nodes whose probes time the collector (the window says which)",
    )
    parser.add_argument(
        "--reconnect",
        action="store_true",
        help="a node whose stream ends connects again with an agent's backoff (never fails)",
    )
    agent = {f.name: f.default for f in dataclasses.fields(AgentConfig)}
    parser.add_argument("--backoff-initial", type=float, default=agent["backoff_initial"])
    parser.add_argument("--backoff-max", type=float, default=agent["backoff_max"])
    args = parser.parse_args()
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
