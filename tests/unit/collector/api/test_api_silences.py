"""POST /api/v1/silences made safe (issue 42): no fleet-wide silence by accident, no typos."""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import TYPE_CHECKING

import pytest

from collector.api.incidents import ApiError, Known, change, silence_from_json

if TYPE_CHECKING:
    from collector.store.incidents import SilenceRow

NOW = 1_000_000.0
KNOWN = Known(
    nodes=lambda: {"node-07", "node-17", "gpu-a01", "fleet"},
    rules=lambda: {"gpu_lost", "nvlink_down", "xid_fatal"},
)


def silence(known: Known | None = KNOWN, created_by: str = "", **body: object) -> SilenceRow:
    return silence_from_json(json.dumps(body).encode(), NOW, known=known, created_by=created_by)


def refused(**body: object) -> str:
    with pytest.raises(ApiError) as err:
        silence_from_json(json.dumps(body).encode(), NOW, known=KNOWN)
    assert err.value.status == HTTPStatus.BAD_REQUEST
    return str(err.value)


class TestScope:
    def test_every_rule_on_every_node_needs_all(self):
        """No node and no rule (absent or *) silenced the whole fleet; now it takes "all"."""
        message = 'a silence of every rule on every node needs "all": true'
        assert refused(duration="2h") == message
        assert refused(duration="2h", node="*", rule="*") == message
        row = silence(duration="2h", all=True)
        assert (row.node, row.rule) == ("*", "*")

    def test_all_with_a_node_or_rule_is_refused(self):
        assert "without a node or rule" in refused(duration="1h", node="node-07", all=True)
        assert "without a node or rule" in refused(duration="1h", rule="gpu_lost", all=True)

    def test_a_node_or_a_rule_alone_is_enough(self):
        assert silence(duration="1h", node="node-07").rule == "*"
        assert silence(duration="1h", rule="gpu_lost").node == "*"

    @pytest.mark.parametrize("name", ["node-*", "node-0?", "node-[01]7", "*node", ""])
    def test_a_pattern_is_refused_even_forced(self, name):
        """Silences match one name exactly, or * for all: node-* would silence nothing."""
        assert "no patterns" in refused(duration="1h", node=name, force=True)
        assert "no patterns" in refused(duration="1h", rule=name or "", node="node-07")

    @pytest.mark.parametrize("key", ["all", "force"])
    def test_all_and_force_are_booleans(self, key):
        assert f"{key} must be true or false" in refused(duration="1h", node="node-07", **{key: 1})


class TestKnownNames:
    def test_an_unknown_node_is_refused_with_what_is_close(self):
        message = refused(duration="1h", node="node-7")
        assert message.startswith("no node 'node-7' in the fleet (did you mean node-17, node-07?)")
        assert '"force": true' in message

    def test_an_unknown_rule_is_refused_with_what_is_close(self):
        message = refused(duration="1h", rule="nvlink_dwn")
        assert message.startswith(
            "no rule 'nvlink_dwn' among the loaded rules (did you mean nvlink_down?)"
        )

    def test_nothing_close_suggests_nothing(self):
        assert "did you mean" not in refused(duration="1h", node="zzzzzzzz")

    def test_force_takes_a_node_not_seen_yet(self):
        row = silence(duration="1h", node="node-99", rule="new_rule", force=True)
        assert (row.node, row.rule) == ("node-99", "new_rule")

    def test_rules_are_not_checked_when_the_server_does_not_know_them(self):
        known = Known(nodes=KNOWN.nodes)
        assert silence(known, duration="1h", rule="anything").rule == "anything"

    def test_names_are_read_only_when_one_is_given(self):
        """A node of * asks for no node list (a journal read on a big fleet)."""

        def boom() -> set[str]:
            raise AssertionError

        assert silence(Known(nodes=boom, rules=boom), duration="1h", all=True).node == "*"


class TestCreatedBy:
    def test_who_added_it_is_recorded(self):
        assert silence(created_by="token", duration="1h", node="node-07").created_by == "token"

    def test_change_passes_who_and_what_is_known(self):
        added: list[SilenceRow] = []

        class Writer:
            def add(self, row: SilenceRow) -> int:
                added.append(row)
                return 7

            def remove(self, _silence_id: int, by: str = "") -> bool:  # noqa: ARG002
                return False

        body = json.dumps({"node": "gpu-a01", "duration": "30m"}).encode()
        status, answer = change(
            "POST",
            "/api/v1/silences",
            body,
            writer=Writer(),
            now=NOW,
            known=KNOWN,
            created_by="loopback",
        )
        assert (status, answer) == (HTTPStatus.CREATED, {"id": 7})
        assert [(r.node, r.created_by) for r in added] == [("gpu-a01", "loopback")]
        with pytest.raises(ApiError, match="no node 'gpu-a1'"):
            change(
                "POST",
                "/api/v1/silences",
                body.replace(b"a01", b"a1"),
                writer=Writer(),
                now=NOW,
                known=KNOWN,
            )
