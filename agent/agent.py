"""The agent at run time: poll the sources on a timer and keep the link to the collector up.

Nothing that may block runs on the event loop: NVML is awaited on the NVML guard's worker
thread, the spool's writes and fsyncs (and the kernel log cursor's) run on the outbox's disk
thread, and discovery and shutdown, which make blocking NVML calls, run on a thread of their own.
So the loop goes on reading the kernel log, udev and the job socket and sending heartbeats
through a hung driver or a disk that takes seconds per fsync. Three tasks share the loop beside
the link: the timed polls, the event reads a source wakes, and the flusher that makes taken
events durable (:meth:`Agent.flush`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from functools import partial
from typing import TYPE_CHECKING

import structlog

from agent.exceptions import NoDriverError, NvmlError, OutboxFullError, SourceError
from agent.jobs.listener import serve_job_socket
from agent.sources.nvml import ERROR_LIBRARY_NOT_FOUND
from agent.sources.wakeup import MIN_EVENT_GAP_S, Wakeup
from fleetwatch import PROTOCOL_VERSION, __version__
from fleetwatch.clock import unix_ms
from fleetwatch.model import Target
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb
from fleetwatch.wire.validate import Inventory, WireError, validate_event, validate_hello

if TYPE_CHECKING:
    from pathlib import Path

    from agent.jobs.listener import JobQueue, JobSocket
    from agent.link.backoff import Backoff
    from agent.link.intervals import Intervals
    from agent.link.stream import CollectorLink
    from agent.outbox.changes import LiveSamples
    from agent.outbox.queue import Outbox
    from agent.poll.bmc import BmcPoller
    from agent.poll.findings import PendingEvent, PollResult
    from agent.poll.sampler import NodeInventory, Sampler
    from agent.poll.self_limits import SelfLimits
    from fleetwatch.clock import Clock
    from fleetwatch.model import SampleKey, SampleValue
    from fleetwatch.sd_notify import SdNotifier

log = structlog.get_logger("agent")

# While discovery retries, systemd is asked to wait for the next try plus this much; a try that
# hangs longer (NVML can, on a GPU that fell off the bus) lets TimeoutStartSec end the start.
START_GRACE_S = 60.0
# An outbox that stays full logs its first refused event, then every this many.
LOG_EVERY = 1000


def build_hello(node: str, boot_id: str, inv: NodeInventory, clock: Clock) -> pb.Hello:
    """Build the Hello from what discovery found."""
    return pb.Hello(
        node=node,
        boot_id=boot_id,
        agent_version=__version__,
        protocol_version=PROTOCOL_VERSION,
        driver_version=inv.driver_version,
        nvml_version=inv.nvml_version,
        gpus=[
            pb.Gpu(
                index=g.index,
                uuid=g.uuid,
                pci_bus_id=g.pci_bus_id,
                model=g.model,
                nvlink_count=g.nvlink_count,
            )
            for g in inv.gpus
        ],
        ib_ports=[
            pb.IbPort(device=p.device, port=p.port, rate=p.rate, link_layer=p.link_layer)
            for p in inv.ib_ports
        ],
        time_unix_ms=unix_ms(clock),
    )


class Agent:
    """Polls, numbers events into the outbox, and hands samples to the link."""

    def __init__(  # noqa: PLR0913 - the composition root passes every collaborator
        self,
        *,
        node: str,
        boot_id: str,
        sampler: Sampler,
        outbox: Outbox,
        live: LiveSamples,
        link: CollectorLink,
        clock: Clock,
        intervals: Intervals,
        start_backoff: Backoff,
        jobs: JobQueue | None = None,
        job_socket: Path | None = None,
        job_socket_mode: int = 0o666,
        notifier: SdNotifier | None = None,
        limits: SelfLimits | None = None,
        bmc: BmcPoller | None = None,
        bmc_interval: float = 30.0,
    ) -> None:
        """Wire the parts together; nothing runs until :meth:`run`.

        ``jobs`` is where step reports from the job socket at ``job_socket`` wait for the link
        (no socket: the agent takes no step reports). ``notifier`` tells systemd when the first
        poll is done and pings its watchdog from the event loop (None: not under systemd).
        ``limits`` watches the process's own memory and CPU (None: not watched, as where many
        simulated agents share one process). ``bmc`` reads the node's BMC every
        ``bmc_interval`` seconds, on a task of its own (None: no BMC is read).
        """
        self.node = node
        self.boot_id = boot_id
        self.sampler = sampler
        self.outbox = outbox
        self.live = live
        self.link = link
        self.clock = clock
        self.intervals = intervals
        self._start_backoff = start_backoff
        self.jobs = jobs
        self._job_socket = job_socket
        self._job_socket_mode = job_socket_mode
        self._notifier = notifier
        self.limits = limits
        self.bmc = bmc
        self._bmc_interval = bmc_interval
        self._inventory = Inventory()
        self.dropped_events: Counter[str] = Counter()
        if outbox.spool is not None and outbox.spool.previous_boot_events:
            self.dropped_events["previous_boot"] = outbox.spool.previous_boot_events
        self.polls = 0
        self.event_polls = 0
        outbox.on_release = live.changed.set  # events on disk: the sender sends them when woken
        self._flush_wanted = asyncio.Event()
        self._kmsg_taken = 0  # the last kernel log record whose events are in the outbox
        self._kmsg_committed = 0  # the last one handed to the disk thread for the cursor file

    async def start(self) -> None:
        """Discover the hardware, retrying with backoff while NVML cannot start.

        A node without NVML's library raises :class:`NoDriverError` at once: no wait brings it.
        Discovery makes blocking NVML calls (each under the guard's deadline): it runs on a
        thread of its own, so the loop (the systemd watchdog) goes on meanwhile.
        """
        while True:
            try:
                await asyncio.to_thread(self.sampler.discover)
                hello = build_hello(self.node, self.boot_id, self.sampler.inventory, self.clock)
                self._inventory = validate_hello(hello)
            except NvmlError as exc:
                if exc.code != ERROR_LIBRARY_NOT_FOUND:
                    await self._retry_start(exc)
                    continue
                raise NoDriverError from exc
            except SourceError as exc:
                await self._retry_start(exc)
                continue
            self.sampler.resume_kmsg_after(self.outbox.kmsg_seq())
            inv = self.sampler.inventory
            log.info(
                "agent_started",
                node=self.node,
                boot_id=self.boot_id,
                gpus=len(inv.gpus),
                ib_ports=len(inv.ib_ports),
                driver=inv.driver_version,
            )
            return

    async def _retry_start(self, exc: SourceError) -> None:
        """Log a failed discovery and wait out its backoff (systemd is told it takes longer)."""
        delay = self._start_backoff.next_delay()
        log.error("discovery_failed", error=str(exc), retry_in_s=round(delay, 1))
        if self._notifier is not None:  # still starting, and the loop is alive
            why = f"discovery failed, retrying in {delay:.0f} s: {exc}"
            self._notifier.extend_timeout(delay + START_GRACE_S, why)
        await self.clock.sleep(delay)

    def _accept(self, event: PendingEvent) -> None:
        """Check an event the way the collector will, then number it into the outbox."""
        try:
            validate_event(event.to_pb(self.outbox.last_seq + 1), self._inventory)
        except (WireError, ValueError, TypeError) as exc:  # to_pb may refuse a value too
            self.dropped_events[getattr(exc, "reason", "invalid_event")] += 1
            log.error("event_dropped_invalid", kind=event.kind, error=str(exc))
            return
        try:
            self.outbox.add(event)
        except OutboxFullError as exc:
            self.dropped_events["outbox_full"] += 1
            count = self.dropped_events["outbox_full"]
            if count == 1 or count % LOG_EVERY == 0:
                log.error(
                    "event_dropped_outbox_full",
                    kind=event.kind,
                    target=event.target.label(),
                    error=str(exc),
                    count=count,
                )

    async def poll_once(self) -> None:
        """Run one poll: its events on disk and released to the link, samples to the link.

        The event sources are read and their events numbered before NVML is awaited, so the
        numbers follow the kernel log's order whatever a wake-up reads meanwhile; the flusher
        sends them on while NVML is still being waited for.
        """
        events = self.sampler.poll_events()
        self._take(events)
        result = await self.sampler.poll_devices()
        self._take(result)
        result.samples.update(events.samples)  # the few of the event sources into the many
        self._publish(result.samples, events=bool(events.events or result.events))
        await self.flush()
        if self.jobs is not None:
            self.jobs.watch()  # the rank processes, for the collector's hang judgement
        self.polls += 1

    async def timed_poll(self) -> float:
        """Run one poll; return the seconds to wait for the next (stretched if polls cost much)."""
        limits = self.limits
        if limits is None:
            await self.poll_once()
            return self.intervals.poll
        began = limits.cpu_now()
        await self.poll_once()
        return limits.next_interval(limits.cpu_now() - began, self.intervals.poll)

    def poll_events(self) -> None:
        """Read only the event sources (a source woke us): their events are numbered now.

        Nothing here waits; the flusher (:meth:`flush`) puts them on disk and releases them.
        """
        result = self.sampler.poll_events()
        self._take(result)
        self._publish(result.samples, events=bool(result.events))
        self.event_polls += 1

    async def flush(self) -> bool:
        """Make the events taken so far durable (and so released to the link); True if they are.

        The fsync is awaited on the outbox's disk thread. Only then may the kernel log cursor
        pass their records: its file is written on the disk thread too, after that fsync.
        """
        kmsg = self._kmsg_taken
        durable = await self.outbox.sync()
        if durable and kmsg > self._kmsg_committed:
            self._kmsg_committed = kmsg
            self.outbox.on_disk_thread(partial(self.sampler.commit_kmsg, kmsg))
        return durable

    def _take(self, result: PollResult) -> None:
        """Number the events into the outbox; the flusher makes them durable."""
        for event in result.events:
            self._accept(event)
            log.info("event", kind=event.kind, target=event.target.label(), xid=event.xid)
        if result.kmsg_seq is not None:
            self._kmsg_taken = max(self._kmsg_taken, result.kmsg_seq)
        spool_behind = self.outbox.spool is not None and not self.outbox.durable
        if result.events or result.kmsg_seq is not None or spool_behind:
            self._flush_wanted.set()  # spool_behind: retry what the disk refused

    def _publish(self, samples: dict[SampleKey, SampleValue], *, events: bool) -> None:
        """Add the agent's own samples to a poll's and hand them all to the link."""
        if self.limits is not None:  # first: what it sheds shows in the samples below
            self._watch_self(self.limits, samples)
        node = Target.node()
        outbox, spool = self.outbox, self.outbox.spool_state
        samples[node, "agent_outbox_pending"] = len(outbox)
        samples[node, "agent_events_dropped"] = sum(self.dropped_events.values())
        samples[node, "agent_samples_refused"] = self.live.refused
        samples[node, "agent_spool_bytes"] = outbox.budget.held
        samples[node, "agent_spool_write_errors"] = spool.write_errors
        samples[node, "agent_spool_damaged"] = spool.damaged
        samples[node, "agent_telemetry_dropped"] = 0 if self.jobs is None else self.jobs.dropped
        if self.jobs is not None:  # received, lost, and refused by reason
            for signal, count in self.jobs.samples().items():
                samples[node, signal] = count
        self.live.update(samples)
        if events:
            self.live.changed.set()  # the sender sends what the outbox releases when woken

    def _watch_self(self, limits: SelfLimits, samples: dict[SampleKey, SampleValue]) -> None:
        """Over the memory ceiling, drop every held step report (events are never dropped)."""
        if limits.check_memory() and self.jobs is not None:
            self.jobs.shed(self.outbox.budget.telemetry)
        samples.update(limits.samples(self.intervals.poll))

    async def _open_job_socket(self) -> JobSocket | None:
        """Listen for step reports; a socket that cannot be bound is logged, not fatal."""
        if self.jobs is None or self._job_socket is None:
            return None
        jobs = self.jobs
        jobs.on_add = self.live.changed.set  # the sender forwards them when woken
        try:
            return await serve_job_socket(
                self._job_socket,
                self._job_socket_mode,
                jobs,
                lambda: self.sampler.inventory,
            )
        except OSError as exc:
            log.error("job_socket_failed", path=str(self._job_socket), error=str(exc))
            return None

    async def run(self) -> None:
        """Start, then poll on the interval, and read event sources as soon as they wake us."""
        notifier = self._notifier
        keep_alive = None
        if notifier is not None:
            keep_alive = asyncio.create_task(notifier.keep_alive(self.clock), name="watchdog")
        try:
            await self._run()
        finally:
            if notifier is not None:
                notifier.stopping()
            if keep_alive is not None:
                keep_alive.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await keep_alive

    async def _run(self) -> None:
        await self.start()
        wakeup = Wakeup(asyncio.get_running_loop())
        self.sampler.watch(wakeup)
        wait = await self.timed_poll()
        if self._notifier is not None:
            inv = self.sampler.inventory
            self._notifier.ready(
                f"polling {len(inv.gpus)} GPUs and {len(inv.ib_ports)} IB ports "
                f"every {self.intervals.poll:g} s"
            )
        job_transport = await self._open_job_socket()
        link_task = asyncio.create_task(self.link.run(), name=f"link-{self.node}")
        loops = {
            asyncio.create_task(self._poll_on_interval(wait), name=f"polls-{self.node}"),
            asyncio.create_task(self._read_when_woken(wakeup), name=f"events-{self.node}"),
            asyncio.create_task(self._flush_when_asked(), name=f"flush-{self.node}"),
        }
        if self.bmc is not None:
            loops.add(asyncio.create_task(self._poll_bmc(self.bmc), name=f"bmc-{self.node}"))
        try:
            done, _ = await asyncio.wait(loops, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()  # they end only by an exception: raise it
        finally:
            for task in loops:
                task.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
            wakeup.close()
            if job_transport is not None:
                job_transport.close()
            link_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await link_task
            await asyncio.to_thread(self.sampler.close)  # may wait a deadline on a hung NVML
            await self.outbox.close()

    async def _poll_on_interval(self, wait: float) -> None:
        while True:
            await self.clock.sleep(wait)
            wait = await self.timed_poll()

    async def poll_bmc_once(self, bmc: BmcPoller) -> None:
        """Read the BMC (off the loop, with its deadline).

        Once its events are durable, the SEL cursor moves past the entries they came from.
        """
        result = await bmc.poll(unix_ms(self.clock))
        reached = bmc.sel_pending  # what this read's events stand for, whatever comes later
        self._take(result)
        self._publish(result.samples, events=bool(result.events))
        if await self.flush():
            self.outbox.on_disk_thread(partial(bmc.commit_sel, reached))

    async def _poll_bmc(self, bmc: BmcPoller) -> None:
        """The BMC at its own interval: it is slow, and may hang, without holding up polls."""
        while True:
            await self.poll_bmc_once(bmc)
            await self.clock.sleep(self._bmc_interval)

    async def _read_when_woken(self, wakeup: Wakeup) -> None:
        """Read the event sources as soon as one wakes us; never waits on NVML or the disk."""
        while True:
            if not await wakeup.wait(self.intervals.poll, self.clock):
                continue
            self.poll_events()
            wakeup.rearm()
            await self.clock.sleep(MIN_EVENT_GAP_S)  # merge a burst into one read

    async def _flush_when_asked(self) -> None:
        """Flush after each take; takes while a flush waits on the disk share the next one."""
        while True:
            await self._flush_wanted.wait()
            self._flush_wanted.clear()
            await self.flush()
