"""Change detection: send a sample only when its value differs from what this stream last sent."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping

    from fleetwatch.model import SampleKey, SampleValue


class ChangeDetector:
    """Remembers what was sent on one stream; a new stream starts with a new detector."""

    __slots__ = ("_sent",)

    def __init__(self) -> None:
        """Nothing has been sent yet, so the first diff is the full snapshot."""
        self._sent: dict[SampleKey, SampleValue] = {}

    def diff(
        self,
        snapshot: Mapping[SampleKey, SampleValue],
    ) -> list[tuple[SampleKey, SampleValue]]:
        """Return the samples whose value changed (or is new), and remember them as sent."""
        changed = [(key, value) for key, value in snapshot.items() if self._sent.get(key) != value]
        for key, value in changed:
            self._sent[key] = value
        return changed
