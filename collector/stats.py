"""The collector's own counters (what it accepted, rejected and deduplicated)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass(slots=True)
class JournalHealth:
    """Whether the journal can commit, written on the event loop, read by the scrape thread."""

    # the last write failed for want of disk space: nothing is acked until one commits again
    full: bool = False
    # writes that failed as a whole, by reason (disk_full, other)
    failures: Counter[str] = field(default_factory=Counter)

    def failures_snapshot(self) -> dict[str, int]:
        """Copy the failure counts."""
        return dict(self.failures)


@dataclass(slots=True)
class CollectorStats:
    """Counters written on the event loop and read by the scrape thread."""

    streams_active: int = 0
    streams_total: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    events_journaled: int = 0
    events_duplicate: int = 0
    seq_gaps: int = 0
    reports: int = 0
    # heavy Reports (a node's first) that waited for a later turn of the event loop
    reports_deferred: int = 0
    samples: int = 0
    job_steps: int = 0
    # events journaled as part of a coalesced row (a flood of alike events)
    events_coalesced: int = 0
    # report samples refused on their own (bad name or target, impossible value), by reason
    samples_rejected: Counter[str] = field(default_factory=Counter)
    # agent clocks that cannot be right (event_time_future, report_time_backwards, ...)
    bad_times: Counter[str] = field(default_factory=Counter)
    # counter samples lower than the value before them (taken as a reset)
    counter_resets: int = 0
    # HTTP API changes refused, by reason (written by the HTTP threads under the guard's lock)
    api_refused: Counter[str] = field(default_factory=Counter)
    # pre-flight results (or measurements in them) refused, by reason
    preflight_refused: Counter[str] = field(default_factory=Counter)
    journal: JournalHealth = field(default_factory=JournalHealth)

    def rejected_snapshot(self) -> dict[str, int]:
        """Copy the rejection counts (a dict copy is atomic under the GIL)."""
        return dict(self.rejected)

    def samples_rejected_snapshot(self) -> dict[str, int]:
        """Copy the sample refusal counts."""
        return dict(self.samples_rejected)

    def bad_times_snapshot(self) -> dict[str, int]:
        """Copy the bad-time counts."""
        return dict(self.bad_times)

    def api_refused_snapshot(self) -> dict[str, int]:
        """Copy the API refusal counts."""
        return dict(self.api_refused)
