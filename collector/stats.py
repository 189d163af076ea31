"""The collector's own counters (what it accepted, rejected and deduplicated)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


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
    samples: int = 0
    job_steps: int = 0
    # HTTP API changes refused, by reason (written by the HTTP threads under the guard's lock)
    api_refused: Counter[str] = field(default_factory=Counter)

    def rejected_snapshot(self) -> dict[str, int]:
        """Copy the rejection counts (a dict copy is atomic under the GIL)."""
        return dict(self.rejected)

    def api_refused_snapshot(self) -> dict[str, int]:
        """Copy the API refusal counts."""
        return dict(self.api_refused)
