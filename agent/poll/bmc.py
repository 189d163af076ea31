"""The node's BMC: fans, power supplies, temperatures and new SEL entries, at their own interval.

A BMC answers in seconds when it answers at all, and some hang. Each read runs on a thread of its
own with a deadline; the event loop only awaits it. A read past the deadline costs that read's
values (``bmc_up`` becomes 0, ``agent_bmc_hung`` 1); while it has not returned, later reads are
skipped rather than stacked behind it. The thread is a daemon: a BMC that never answers does not
hold the agent at exit.

Events are edge-triggered like the rest: a fan that fails is reported once, and again when it
recovers. The component is the event's device (``Fan_3``, ``PSU1``); the node-wide figures go as
node samples, which the rules read ([signals.md](../docs/signals.md#the-nodes-bmc)).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import TYPE_CHECKING, Final, TypeVar

import structlog

from agent.poll.findings import PollResult
from agent.sources.bmc import BmcError, BmcReading, Place, SelRead, Severity, component_name
from fleetwatch.model import EventKind, Target

if TYPE_CHECKING:
    from collections.abc import Callable

    from agent.sources.bmc import BmcSource, SelEntry
    from agent.sources.sel_cursor import SelCursor

log = structlog.get_logger("agent.bmc")

T = TypeVar("T")
DEFAULT_INTERVAL_S: Final = 30.0
DEFAULT_TIMEOUT_S: Final = 20.0
MAX_SEL_EVENTS: Final = 100  # per read; a SEL flooding more is summarised in one line


class BmcHungError(BmcError):
    """The read did not return within the deadline, or an earlier one still has not."""


def _described(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:200]}"


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class _OffLoop:
    """Blocking work on a daemon thread per call, awaited with a deadline; one at a time."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._finished: threading.Event | None = None  # the last call's; set once it returned

    @property
    def hung(self) -> bool:
        return self._finished is not None and not self._finished.is_set()

    async def call(self, fn: Callable[[], T]) -> T:
        if self.hung:
            msg = "the last read has not returned yet"
            raise BmcHungError(msg)
        loop = asyncio.get_running_loop()
        returned: asyncio.Future[None] = loop.create_future()
        box: dict[str, object] = {}
        finished = self._finished = threading.Event()

        def work() -> None:
            try:
                box["value"] = fn()
            except BaseException as exc:  # noqa: BLE001 - handed back to the awaiting task
                box["error"] = exc
            finished.set()
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(_resolve, returned)

        threading.Thread(target=work, name="bmc-read", daemon=True).start()
        deadline = loop.call_later(self.timeout_s, _resolve, returned)
        try:
            await returned
        finally:
            deadline.cancel()
        if "error" in box:
            raise box["error"]  # type: ignore[misc]
        if "value" not in box:
            msg = f"no answer within {self.timeout_s:g} s"
            raise BmcHungError(msg)
        return box["value"]  # type: ignore[return-value]


class BmcPoller:
    """Reads the BMC, keeps what it said last, and turns changes into events."""

    def __init__(
        self,
        source: BmcSource,
        *,
        cursor: SelCursor | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        psus_needed: int = 0,
    ) -> None:
        """Start with nothing known.

        ``psus_needed``: working supplies the node needs (0: the BMC's word, else all but one
        of those installed).
        """
        self.source = source
        self._cursor = cursor
        self._sel_after = cursor.load() if cursor is not None else None
        self._sel_pending: int | None = None
        self._off_loop = _OffLoop(timeout_s)
        self._psus_needed = psus_needed
        self._fans: dict[str, bool] = {}  # name -> failed
        self._psus: dict[str, bool] = {}
        self._temps: dict[str, bool] = {}  # name -> critical
        self._redundancy_lost: bool | None = None
        self.errors = 0
        self.hung_reads = 0
        self.reads = 0

    @property
    def hung(self) -> bool:
        """True while a read that passed its deadline has not returned."""
        return self._off_loop.hung

    async def poll(self, now_ms: int) -> PollResult:
        """One read of the BMC, off the loop: samples, and events for what changed."""
        result = PollResult()
        node = Target.node()
        try:
            reading, sel = await self._off_loop.call(self._read)
            readings = PollResult()
            self._reading(reading, readings, now_ms)
        except Exception as exc:  # noqa: BLE001 - a BMC's answer, whatever it is, ends here
            self._failed(exc)
            result.samples[node, "bmc_up"] = 0
        else:
            self.reads += 1
            result.samples[node, "bmc_up"] = 1
            result.samples.update(readings.samples)
            result.events.extend(readings.events)
            if isinstance(sel, BmcError):
                self.errors += 1
                log.warning("bmc_sel_read_failed", bmc=self.source.address, error=str(sel))
            else:
                self._sel(sel, result, now_ms)
        result.samples[node, "agent_source_errors_bmc"] = self.errors
        result.samples[node, "agent_bmc_hung"] = int(self.hung)
        return result

    def _failed(self, exc: Exception) -> None:
        """Count a read that failed, and log the first and every hundredth.

        A parser's own error (an answer no BMC should send: a number too big, JSON nested too
        deep) is such a failure too, never the end of the agent.
        """
        self.errors += 1
        if isinstance(exc, BmcHungError):
            self.hung_reads += 1
        why = str(exc) if isinstance(exc, BmcError) else f"unreadable answer: {_described(exc)}"
        if self.errors == 1 or self.errors % 100 == 0:
            log.warning("bmc_read_failed", bmc=self.source.address, error=why)

    @property
    def sel_pending(self) -> int | None:
        """The SEL position the last read reached (None: none read yet)."""
        return self._sel_pending

    def commit_sel(self, key: int | None = None) -> None:
        """Move the cursor file to ``key``: the events of the entries up to it are durable.

        ``key`` None: as far as the reads so far went.
        """
        pending = self._sel_pending if key is None else key
        if pending is not None and self._cursor is not None:
            self._cursor.save(pending)

    def _read(self) -> tuple[BmcReading, SelRead | BmcError]:
        """On the read's thread: the sensors, then the SEL (whose failure costs only it)."""
        reading = self.source.read()
        try:
            sel: SelRead | BmcError = self.source.read_sel(self._sel_after)
        except BmcError as exc:
            sel = exc
        except Exception as exc:  # noqa: BLE001 - a hostile SEL costs the SEL only
            sel = BmcError(f"SEL: unreadable answer: {_described(exc)}")
        return reading, sel

    def _reading(self, reading: BmcReading, result: PollResult, now_ms: int) -> None:
        samples, node = result.samples, Target.node()
        fans = [f for f in reading.fans if f.present]
        samples[node, "bmc_fans"] = len(fans)
        samples[node, "bmc_fans_failed"] = sum(f.failed for f in fans)
        speeds = [f.rpm for f in fans if f.rpm is not None]
        if speeds:
            samples[node, "bmc_fan_rpm_min"] = min(speeds)
        for fan in reading.fans:
            self._edge(
                self._fans,
                fan.name,
                now=fan.failed,
                kinds=(EventKind.FAN_FAILED, EventKind.FAN_RECOVERED),
                detail=fan.describe(),
                result=result,
                now_ms=now_ms,
            )
        self._power(reading, result, now_ms)
        self._temperatures(reading, result, now_ms)

    def _power(self, reading: BmcReading, result: PollResult, now_ms: int) -> None:
        samples, node = result.samples, Target.node()
        installed = len(reading.psus)
        working = sum(p.working for p in reading.psus)
        failed = sum(p.failed for p in reading.psus)
        needed = self._psus_needed or reading.psus_needed or max(1, installed - 1)
        samples[node, "bmc_psus"] = installed
        samples[node, "bmc_psus_working"] = working
        samples[node, "bmc_psus_failed"] = failed
        samples[node, "bmc_psus_needed"] = needed
        if reading.power_watts is not None:
            samples[node, "bmc_power_watts"] = reading.power_watts
        for psu in reading.psus:
            self._edge(
                self._psus,
                psu.name,
                now=psu.down,
                kinds=(EventKind.PSU_FAILED, EventKind.PSU_RECOVERED),
                detail=psu.describe(),
                result=result,
                now_ms=now_ms,
            )
        if installed == 0:
            return
        lost = reading.redundancy_ok is False or (working <= needed < installed)
        samples[node, "bmc_psu_redundancy_lost"] = int(lost)
        before, self._redundancy_lost = self._redundancy_lost, lost
        if lost == bool(before):
            return
        detail = (
            f"{working} of {installed} power supplies working, {needed} needed"
            f"{'; the BMC reports redundancy lost' if reading.redundancy_ok is False else ''}"
        )
        kind = EventKind.PSU_REDUNDANCY_LOST if lost else EventKind.PSU_REDUNDANCY_RESTORED
        result.event(kind, node, now_ms, detail)

    def _temperatures(self, reading: BmcReading, result: PollResult, now_ms: int) -> None:
        samples, node = result.samples, Target.node()
        read = [t for t in reading.temperatures if t.celsius is not None]
        for place, signal in (
            (Place.INLET, "bmc_inlet_temperature_celsius"),
            (Place.OUTLET, "bmc_outlet_temperature_celsius"),
        ):
            values = [t.celsius for t in read if t.place == place and t.celsius is not None]
            if values:
                samples[node, signal] = max(values)
        if read:
            samples[node, "bmc_temperature_max_celsius"] = max(
                t.celsius for t in read if t.celsius is not None
            )
        samples[node, "bmc_temperatures_critical"] = sum(t.critical for t in reading.temperatures)
        for temp in reading.temperatures:
            self._edge(
                self._temps,
                temp.name,
                now=temp.critical,
                kinds=(EventKind.TEMPERATURE_CRITICAL, EventKind.TEMPERATURE_NORMAL),
                detail=temp.describe(),
                result=result,
                now_ms=now_ms,
            )

    def _sel(self, sel: SelRead, result: PollResult, now_ms: int) -> None:
        worth = [e for e in sel.entries if e.severity != Severity.OK]
        for entry in worth[:MAX_SEL_EVENTS]:
            result.event(
                _sel_kind(entry.severity == Severity.CRITICAL),
                Target.node_device(component_name(entry.sensor, "SEL")),
                now_ms,
                entry.describe(),
            )
        if len(worth) > MAX_SEL_EVENTS:
            rest: list[SelEntry] = worth[MAX_SEL_EVENTS:]
            result.event(
                _sel_kind(any(e.severity == Severity.CRITICAL for e in rest)),
                Target.node_device("SEL"),
                now_ms,
                f"{len(rest)} more warning or critical SEL entries, "
                f"{rest[0].key} to {rest[-1].key}",
            )
        self._sel_after = sel.last_key
        self._sel_pending = sel.last_key

    @staticmethod
    def _edge(  # noqa: PLR0913 - one component's state change and where it goes
        states: dict[str, bool],
        name: str,
        *,
        now: bool,
        kinds: tuple[EventKind, EventKind],
        detail: str,
        result: PollResult,
        now_ms: int,
    ) -> None:
        """An event when ``name`` turned bad (reported at the first read too) or good again."""
        before = states.get(name)
        states[name] = now
        if now == bool(before):
            return
        result.event(kinds[0] if now else kinds[1], Target.node_device(name), now_ms, detail)


def _sel_kind(critical: bool) -> EventKind:  # noqa: FBT001 - one fact, named by the caller
    """The event a SEL entry (or the count of the rest) is: critical ones page on their own."""
    return EventKind.BMC_SEL_CRITICAL if critical else EventKind.BMC_SEL_ENTRY
