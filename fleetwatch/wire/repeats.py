"""How one event says it stands for many: a marker at the start of its detail.

An Xid storm prints the same fault thousands of times a second. The agent reports the first few
occurrences of a storm as events of their own and then one event per window that carries how
many more there were; the collector does the same with a sender that floods it with repeats of
one event. Such an event starts its detail with::

    [repeated 4990 times over 1.0 s] NVRM: Xid (PCI:0000:18:00): 13, ...
    [repeated 4990 times over 1.0 s, seq 11-5000] ...   (the collector's, naming the events)

and stands for that many occurrences (each a repeat of one reported before it). The journal keeps
the detail as it is; the fleet model counts the occurrences (``fleetwatch_gpu_xid_errors_total``
counts every Xid of a storm), and :func:`parse_repeats` reads the marker back.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from fleetwatch.wire.validate import MAX_DETAIL

# The count is bounded so that a sender cannot claim absurd numbers through the detail.
MAX_TIMES: Final = 999_999_999
_MARKER: Final = re.compile(
    r"\[repeated (?P<times>[0-9]{1,9}) times over [0-9]{1,9}(?:\.[0-9]) s"
    r"(?:, seq (?P<first>[0-9]{1,20})-(?P<last>[0-9]{1,20}))?\] ?"
)


@dataclass(frozen=True, slots=True)
class Repeats:
    """What a marker says: ``times`` occurrences, and the events' numbers when it names them."""

    times: int
    first_seq: int | None = None
    last_seq: int | None = None


def parse_repeats(detail: str) -> Repeats | None:
    """The marker at the start of ``detail``, or None when it has none."""
    match = _MARKER.match(detail)
    if match is None:
        return None
    first, last = match["first"], match["last"]
    return Repeats(
        times=int(match["times"]),
        first_seq=None if first is None else int(first),
        last_seq=None if last is None else int(last),
    )


def occurrences(detail: str) -> int:
    """How many occurrences an event with ``detail`` stands for (1 without a marker)."""
    found = parse_repeats(detail)
    return 1 if found is None else max(found.times, 1)


def seqs_covered(seq: int, detail: str) -> range:
    """The sequence numbers a journal row with ``seq`` and ``detail`` stands for.

    A row the collector coalesced covers the numbers its marker names (it is journaled under
    the last); any other row covers its own number.
    """
    found = parse_repeats(detail)
    if found is None or found.first_seq is None or found.last_seq != seq:
        return range(seq, seq + 1)
    return range(found.first_seq, seq + 1)


def strip_marker(detail: str) -> str:
    """``detail`` without its marker."""
    match = _MARKER.match(detail)
    return detail if match is None else detail[match.end() :]


def mark_repeats(
    detail: str,
    times: int,
    span_s: float,
    seqs: tuple[int, int] | None = None,
) -> str:
    """``detail`` (its own marker replaced) behind a marker, cut to :data:`MAX_DETAIL`."""
    times = min(max(times, 1), MAX_TIMES)
    span = min(span_s, 999_999_999.0) if span_s > 0 else 0.0  # NaN and -0.0 too
    where = "" if seqs is None else f", seq {seqs[0]}-{seqs[1]}"
    text = f"[repeated {times} times over {span:.1f} s{where}] {strip_marker(detail)}"
    return text if len(text) <= MAX_DETAIL else text[: MAX_DETAIL - 3] + "..."
