"""The demo's pre-flight table shows, for each failed node, the drain that holds it out."""

from cli.demo.preflight import table
from collector.store.incidents import ActionRow
from collector.store.preflight import RunRow


def _drain(node: str, incident: str, state: str, detail: str, at_ms: int) -> ActionRow:
    return ActionRow(
        idempotency_key=f"{incident}:drain_node:{node}",
        incident_id=incident,
        action="drain_node",
        node=node,
        target=node,
        state=state,
        created_ms=at_ms,
        params={},
        detail=detail,
    )


def _run() -> RunRow:
    return RunRow(
        id="pf-1",
        level="full",
        nodes=("node-01", "node-02", "node-03"),
        started_ms=0,
        finished_ms=1,
        verdict="fail",
        node_verdicts={"node-01": "pass", "node-02": "fail", "node-03": "fail"},
        suspects=[],
    )


def test_a_rules_drain_that_came_first_is_shown_not_pre_flights_skip():
    """node-03's port rate is also a built-in rule's: the rule drained it first, and pre-flight's
    own drain was skipped as already done. The line shows the drain that holds the node out."""
    actions = [
        _drain("node-03", "rule-port", "succeeded", "", 1),
        _drain("node-02", "pf-1", "deferred", "drain cap reached", 2),
        _drain("node-03", "pf-1", "skipped", "node-03 is already drained by rule-port", 3),
    ]
    lines = table(_run(), [], actions, 1.0)
    assert any(line.split()[:4] == ["node-03", "FAIL", "drain", "succeeded"] for line in lines)
    assert any(line.split()[:4] == ["node-02", "FAIL", "drain", "deferred:"] for line in lines)


def test_a_rules_skip_after_pre_flights_drain_does_not_hide_it():
    actions = [
        _drain("node-03", "pf-1", "succeeded", "", 1),
        _drain("node-03", "rule-port", "skipped", "node-03 is already drained by pf-1", 2),
    ]
    lines = table(_run(), [], actions, 1.0)
    assert any(line.split()[:4] == ["node-03", "FAIL", "drain", "succeeded"] for line in lines)


def test_the_journals_newest_first_order_does_not_matter():
    """The journal lists actions newest first: a rule's waiting drain, dropped once its fault
    cleared, is older than pre-flight's drain that waits for room under the cap."""
    actions = [
        _drain("node-03", "pf-1", "deferred", "drain cap reached", 5),
        _drain("node-03", "rule-port", "skipped", "the fault cleared while the drain waited", 1),
    ]
    lines = table(_run(), [], actions, 1.0)
    assert any(line.split()[:4] == ["node-03", "FAIL", "drain", "deferred:"] for line in lines)


def test_a_node_whose_drains_were_all_skipped_says_why():
    actions = [_drain("node-02", "pf-1", "skipped", "cooldown: drain_node ran on node-02", 1)]
    lines = table(_run(), [], actions, 1.0)
    assert any("node-02" in line and "drain skipped: cooldown" in line for line in lines)
