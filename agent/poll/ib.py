"""InfiniBand ports: state every poll; counters (and their rates) when the sampler says so.

Every read under ``counters/`` sends a management datagram to the HCA's firmware, so the sampler
asks for the counter set at most once per counter interval however fast the agent polls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import structlog

from agent.exceptions import SourceError
from agent.poll.failure_episodes import FailureEpisodes
from agent.probes.counters import (
    IB_COUNTER_SPECS,
    IB_NARROW_COUNTER_SPECS,
    MLX5_HW_COUNTER_SPECS,
    CounterTracker,
    DeltaKind,
)
from fleetwatch.model import EventKind, Target
from fleetwatch.signals import RATE_COUNTERS, RATE_HW_COUNTERS, signal_name

if TYPE_CHECKING:
    from collections import Counter
    from collections.abc import Mapping

    from agent.poll.findings import PollResult
    from agent.sources.sysfs import IbPortInfo, IbPortStatus, SysfsReader
    from fleetwatch.clock import Clock

log = structlog.get_logger("agent.ib")

IB_ACTIVE: Final = "ACTIVE"


@dataclass(frozen=True, slots=True)
class _Names:
    """The sample names of one counter, worked out once."""

    value: str
    saturated: str | None  # for counters that stop at their top: flagged when there
    rate: str | None  # for counters whose rate is sent
    ceiling: int = 0  # the value a saturating counter stops at


def _signal_names(prefix: str, name: str, *, narrow: bool = False) -> _Names:
    specs, wanted = (
        (IB_NARROW_COUNTER_SPECS if narrow else IB_COUNTER_SPECS, RATE_COUNTERS)
        if prefix == "ib_"
        else (MLX5_HW_COUNTER_SPECS, RATE_HW_COUNTERS)
    )
    spec = specs.get(name)
    saturates = spec is not None and spec.saturates
    return _Names(
        value=signal_name(prefix, name),
        saturated=signal_name(prefix, name, "_saturated") if saturates else None,
        rate=signal_name(prefix, name, "_per_second") if name in wanted else None,
        ceiling=spec.max_value if spec is not None and saturates else 0,
    )


class IbPoller:
    """Samples and events for every IB port of the node."""

    def __init__(self, sysfs: SysfsReader, clock: Clock) -> None:
        """Keep the reader."""
        self._sysfs = sysfs
        self._clock = clock
        self._prev_state: dict[tuple[str, int], str] = {}
        self._base = CounterTracker(IB_COUNTER_SPECS)
        self._narrow = CounterTracker(IB_NARROW_COUNTER_SPECS)  # ports without extended counters
        self._hw = CounterTracker(MLX5_HW_COUNTER_SPECS)
        self._names: dict[tuple[str, str, bool], _Names] = {}
        self._failures = FailureEpisodes(log, "ib_read_failed")

    @property
    def counter_resets(self) -> int:
        """How many times a counter went backwards (HCA reset, driver reload)."""
        return self._base.resets + self._narrow.resets + self._hw.resets

    def poll(
        self,
        ports: tuple[IbPortInfo, ...],
        result: PollResult,
        now_ms: int,
        errors: Counter[str],
        *,
        counters: bool,
    ) -> None:
        """Read every port's state, and its counters when ``counters`` says they are due."""
        mono = self._clock.monotonic()
        for port in ports:
            key = (port.device, port.port)
            try:
                downed = self._counters(port, result, mono, errors) if counters else None
                problem = self._state(port, result, now_ms, downed)
            except SourceError as exc:
                problem = str(exc)
            if problem is None:
                self._failures.succeeded(key, device=port.device, port=port.port)
            else:
                errors["sysfs"] += 1
                self._failures.failed(key, problem, device=port.device, port=port.port)

    def _state(
        self,
        port: IbPortInfo,
        result: PollResult,
        now_ms: int,
        link_downed: int | None,
    ) -> str | None:
        """State and phys_state; ``link_downed`` too unless the counters already gave it.

        Each file counts on its own: what failed is unknown, said in the message returned.
        """
        status = self._sysfs.ib_port_status(
            port.device,
            port.port,
            link_downed=link_downed is None,
        )
        downed = status.link_downed if link_downed is None else link_downed
        target = Target.ib_port(port.device, port.port)
        if status.phys_state:
            result.samples[target, "ib_phys_state"] = status.phys_state
        if downed >= 0:  # -1: unknown (no PMA to count it, or its file unreadable)
            result.samples[target, "ib_link_downed"] = downed
        if status.state:
            self._edge(port, status, downed, result, now_ms)
        if not status.unreadable:
            return None
        files = ", ".join(status.unreadable)  # what was read is kept, the rest is unknown
        return f"sysfs: {port.device} port {port.port}: cannot read {files}"

    def _edge(
        self, port: IbPortInfo, status: IbPortStatus, downed: int, result: PollResult, now_ms: int
    ) -> None:
        """The state sample, and an event when the port went up or down."""
        state, phys_state = status.state, status.phys_state
        target = Target.ib_port(port.device, port.port)
        result.samples[target, "ib_state"] = state
        key = (port.device, port.port)
        prev = self._prev_state.get(key)
        self._prev_state[key] = state
        was_up, is_up = prev == IB_ACTIVE, state == IB_ACTIVE
        if (prev is None and is_up) or (prev is not None and was_up == is_up):
            return
        downed_text = str(downed) if downed >= 0 else "unknown"
        result.event(
            EventKind.IB_PORT_UP if is_up else EventKind.IB_PORT_DOWN,
            target,
            now_ms,
            f"state {state}, phys_state {phys_state or 'unknown'}, link_downed {downed_text}",
        )

    def _counters(
        self,
        port: IbPortInfo,
        result: PollResult,
        mono: float,
        errors: Counter[str],
    ) -> int | None:
        """Every counter of the port as samples, with rates; return ``link_downed``."""
        read = self._sysfs.ib_port_counters(port.device, port.port)
        if read.read_errors:
            errors["sysfs"] += read.read_errors
        target = Target.ib_port(port.device, port.port)
        scope = (port.device, port.port)
        narrow = not read.extended
        for prefix, values, tracker in (
            ("ib_", read.counters, self._narrow if narrow else self._base),
            ("ib_hw_", read.hw_counters, self._hw),
        ):
            self._counter_set(
                result,
                target,
                scope,
                prefix,
                values=values,
                tracker=tracker,
                at=mono,
                narrow=narrow and prefix == "ib_",
            )
        return read.counters.get("link_downed")

    def _counter_set(  # noqa: PLR0913 - one set of counters and where it goes
        self,
        result: PollResult,
        target: Target,
        scope: tuple[str, int],
        prefix: str,
        *,
        values: Mapping[str, int],
        tracker: CounterTracker,
        at: float,
        narrow: bool = False,
    ) -> None:
        samples = result.samples
        tracked: dict[str, int] = {}
        for name, value in values.items():
            names = self._names.get((prefix, name, narrow))
            if names is None:
                names = self._names[prefix, name, narrow] = _signal_names(
                    prefix, name, narrow=narrow
                )
            samples[target, names.value] = value
            if names.saturated is not None:
                samples[target, names.saturated] = int(value >= names.ceiling)
            if names.rate is not None:
                tracked[name] = value
        for name, delta in tracker.update(scope, tracked, at).items():
            if delta.kind == DeltaKind.RESET:
                log.info("ib_counter_reset", scope=scope, counter=name)
            rate = self._names[prefix, name, narrow].rate
            if rate is not None and delta.rate is not None:
                samples[target, rate] = round(delta.rate, 3)
