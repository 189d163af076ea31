"""What the ``backend`` fixture (in ``conftest.py``) gives a test that runs on both journal
backends: a way to open a store as collector NAME, and a way to open a reader, on one journal."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from collector.store.events import EventReader, EventStore

Open = tuple["Callable[[str], EventStore]", "Callable[[], EventReader]"]
