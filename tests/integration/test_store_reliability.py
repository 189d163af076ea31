"""The reads the reliability figures make, on both journal backends.

A window's moves (lean, the reason kept only where asked), where each node stood before it,
when each last left service, and the actions that succeeded: SQLite and PostgreSQL alike.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from collector.model.lifecycle import STILL_FIRING
from collector.store.incidents import ActionRow
from collector.store.lifecycle import Move, TransitionRow

if TYPE_CHECKING:
    from tests.integration.store_backend import Open

pytestmark = pytest.mark.integration


def action(key: str, node: str, name: str, state: str, at: int) -> ActionRow:
    return ActionRow(key, f"r:{node}:1", name, node, node, state, at, {}, finished_ms=at + 1)


class TestReliabilityReads:
    def test_window_before_left_and_succeeded(self, backend: Open):
        open_store, open_reader = backend
        store = open_store("c1")
        for row in (
            TransitionRow("n1", "suspect", "in_service", 10, "rule:r", reason="GPU 3 ..."),
            TransitionRow("n1", "drained", "suspect", 20, "action:drain_node"),
            TransitionRow("n2", "rma", "in_service", 30, "person:ana"),
            TransitionRow("n1", "in_service", "drained", 100, "person:ana"),
            TransitionRow("n1", "suspect", "in_service", 100, "rule:r", reason=STILL_FIRING),
            TransitionRow("n2", "in_repair", "rma", 110, "person:ana"),
        ):
            store.lifecycle.add(row)
        store.incidents.add_action(action("a", "n1", "drain_node", "succeeded", 20))
        store.incidents.add_action(action("b", "n1", "notify", "succeeded", 21))
        store.incidents.add_action(action("c", "n1", "reset_gpu", "skipped", 22))
        store.incidents.add_action(action("d", "n2", "escalated_drain_node", "succeeded", 5))
        reader = open_reader()
        try:
            moves, before, left = reader.read_lifecycle(
                lambda s: (
                    s.moves(50, keep_reason=STILL_FIRING),
                    s.before(50),
                    s.left_service_before(50),
                )
            )
            assert moves == [
                Move("n1", "in_service", "drained", 100, "person:ana", ""),
                Move("n1", "suspect", "in_service", 100, "rule:r", STILL_FIRING),
                Move("n2", "in_repair", "rma", 110, "person:ana", ""),
            ]
            assert {n: (r.state, r.at_ms) for n, r in before.items()} == {
                "n1": ("drained", 20),
                "n2": ("rma", 30),
            }
            assert left == {"n1": 20, "n2": 30}
            one = reader.read_lifecycle(lambda s: s.moves(0, "n2"))
            assert [m.state for m in one] == ["rma", "in_repair"]
            # every action that succeeded (which are remediations, the figures say by name)
            assert reader.read(lambda s: s.succeeded_since(10)) == [
                ("n1", "drain_node", 21),
                ("n1", "notify", 22),
            ]
            assert reader.read(lambda s: s.succeeded_since(0, "n2")) == [
                ("n2", "escalated_drain_node", 6)
            ]
        finally:
            reader.close()
            store.close()
