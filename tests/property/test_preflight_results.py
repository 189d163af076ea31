"""A node's pre-flight results, however hostile: the collector's wire screen refuses the whole
result or single measurements with a known reason and a short message, and takes only finite
values and well-formed text; its answer screen then keeps only what the plan asked of that node,
each (check, component) once, and reports the rest as the node's misfit. Nothing raises."""

from __future__ import annotations

import math
import re

from hypothesis import example, given
from hypothesis import strategies as st

from collector.ingest.session import parse_message
from collector.preflight.answers import Misfit, Screened, planned_components, screen_answer
from collector.preflight.plan import NodeFacts, plan_run
from fleetwatch.preflight.vocabulary import Check, Level, Measurement, rail_component
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb
from fleetwatch.wire.validate import WireError
from fleetwatch.wire.validate_preflight import (
    COMPONENT,
    MAX_ERROR,
    MAX_EVIDENCE,
    MAX_MEASUREMENTS,
    MAX_TEXT,
    MAX_VALUE,
    UNIT,
    screen_result,
    validate_task,
)
from tests.property.hostile import (
    ABSURD_FLOATS,
    MAX_MESSAGE,
    NUMBERS,
    WEIRD_TEXT,
    assert_clear,
    tried,
)

TARGET = "preflight_results"
WIRE_REASONS = frozenset({"oversized", "malformed", "invalid_preflight_result"})
MEASUREMENT_REASONS = frozenset({"unknown_check", "bad_component", "bad_value", "bad_text"})
ANSWER_REASONS = frozenset({"not_asked", "not_planned", "duplicate"})
# A misfit's reason quotes three refusals, each component cut to 80 characters (a repr of those
# is at most 10 characters each): bounded whatever the node sent, never in proportion to it.
MAX_MISFIT = 3 * (80 * 10 + 200) + 200

RAILS = (("mlx5_0", 1), ("mlx5_1", 1))


def _facts() -> list[NodeFacts]:
    return [
        NodeFacts("gpu-01", "10.0.0.1", 8, "H100", RAILS, 400.0),
        NodeFacts("gpu-02", "10.0.0.2", 8, "H100", RAILS, 400.0),
        NodeFacts("gpu-03", "10.0.0.3", 2, "H100", (*RAILS, ("mlx5_2", 2)), 400.0),
        NodeFacts("gpu-04", "10.0.0.4", 0, "", (), 0.0),
    ]


FACTS = {f.name: f for f in _facts()}
# Every task the planner makes for these nodes, at every level: (node, its task).
TASKS = [
    (node, task)
    for level in Level
    for count in (1, 2, 3, 4)
    for plan_round in plan_run(f"run-{level.value}-{count}", level, _facts()[:count]).rounds
    for node, task in sorted(plan_round.tasks.items())
]
# Components that name someone else's GPU, HCA, rail or rung, or are no component at all.
FOREIGN = [
    "node",
    "gpu:0",
    "gpu:7",
    "gpu:8",
    "gpu:99",
    "gpu:-1",
    "gpu:00",
    "gpu:0-gpu:0",
    "gpu:1-gpu:0",
    "gpu:0-gpu:1",
    "nic:mlx5_0",
    "nic:mlx5_9",
    "ib:mlx5_0/1",
    "ib:mlx5_0/2",
    "rail:mlx5_0/1:gpu-01-gpu-02",
    "rail:mlx5_0/1:gpu-02-gpu-01",
    "rail:mlx5_0/1:gpu-02-gpu-03",
    "rail:mlx5_0/1:gpu-03-gpu-04",
    "nodes:1",
    "nodes:2",
    "nodes:4",
    "nodes:0",
    "nodes:" + "9" * 5000,
    "a" * 201,
    "gpu:0\x00",
    "gpu:0\n",
    "node\u2028",
    "\x1b[31mnode",
    "gpu:\\u0030",
    "\U000e0001" * 100,
]
CHECK_NAMES = st.one_of(
    st.sampled_from([c.value for c in Check]),
    st.sampled_from(["", "GPU_COUNT", "gpu_count\x00", "gpu_count ", "x" * 5000]),
    WEIRD_TEXT,
)
VALUES = st.one_of(st.none(), NUMBERS, ABSURD_FLOATS, st.floats(-MAX_VALUE, MAX_VALUE))
TEXTS = st.one_of(
    st.just(""),
    WEIRD_TEXT,
    st.sampled_from(["GB/s", "Gb/s", "%", "count", "\x00", "\u2028", "\\x00\\n", "%s%n"]),
    st.integers(1, 3).map(lambda k: "e" * (MAX_EVIDENCE * k)),
)


def _float(value: float) -> float:
    """``value`` as a float; an integer past a float's range as infinity."""
    if isinstance(value, int) and abs(value) >= 2**1000:
        return math.inf if value > 0 else -math.inf
    return float(value)


def _mangle(raw: bytes, edits: list[tuple[int, int]]) -> bytes:
    """``raw`` with bytes flipped (a position and a mask each; mask 0 cuts the rest off)."""
    buf = bytearray(raw)
    for at, mask in edits:
        if not buf:
            break
        if mask == 0:
            del buf[at % len(buf) :]
        else:
            buf[at % len(buf)] ^= mask
    return bytes(buf)


def _planned(node: str, task: pb.PreflightTask) -> list[tuple[str, str]]:
    """Every (check, component) the plan asked of ``node``: what an honest node answers."""
    checks = {Check(c) for c in task.checks}
    if Check.LADDER_THROUGHPUT in checks:
        checks.add(Check.GPU_UTILISATION)
    return sorted(
        (check.value, component)
        for check in checks
        for component in planned_components(check, task, FACTS[node], node)
    )


@st.composite
def wire_measurement(draw: st.DrawFn, honest: list[tuple[str, str]]) -> pb.PreflightMeasurement:
    """A measurement: one the plan asked for, another node's, or anything; any values."""
    pick = draw(st.integers(0, 3))
    if pick <= 1 and honest:
        check, component = draw(st.sampled_from(honest))
    elif pick == 2:
        check = draw(st.sampled_from([c.value for c in Check]))
        component = draw(st.sampled_from(FOREIGN))
    else:
        check, component = draw(CHECK_NAMES), draw(st.one_of(st.sampled_from(FOREIGN), WEIRD_TEXT))
    m = pb.PreflightMeasurement(check=check, component=component)
    value = draw(VALUES)
    if value is not None:
        m.value = _float(value)
    if draw(st.booleans()):
        m.unit, m.text, m.error, m.evidence = (draw(TEXTS) for _ in range(4))
    return m


@st.composite
def results(draw: st.DrawFn) -> tuple[str, pb.PreflightTask, pb.PreflightResult]:
    """A node, its task, and the result it sent: copies, strangers and absurd values in it."""
    node, task = draw(st.sampled_from(TASKS))
    honest = _planned(node, task)
    measurements = draw(st.lists(wire_measurement(honest), max_size=12))
    if draw(st.booleans()) and measurements:  # one figure many times over
        measurements += [measurements[0]] * draw(st.integers(1, 300))
    result = pb.PreflightResult(
        run_id=draw(st.one_of(st.just(task.run_id), WEIRD_TEXT)),
        task_id=draw(st.one_of(st.just(task.task_id), WEIRD_TEXT)),
        refused=draw(st.one_of(st.just(""), TEXTS)),
        measurements=measurements,
    )
    return node, task, result


def _allowed(node: str, task: pb.PreflightTask, check: Check, component: str) -> bool:
    """Whether ``component`` is this node's own for ``check`` (worked out apart from the code)."""
    facts = FACTS[node]
    gpus = {f"gpu:{i}" for i in range(facts.gpus)}
    pair = re.fullmatch(r"(gpu:\d+)-(gpu:\d+)", component)
    by_check: dict[Check, bool] = {
        Check.IB_PORT: component in {f"ib:{h}/{p}" for h, p in facts.rails},
        Check.NIC_PCIE_LINK: component in {f"nic:{h}" for h, _ in facts.rails},
        Check.NIC_FIRMWARE: component in {f"nic:{h}" for h, _ in facts.rails},
        Check.P2P_BW: bool(pair and {*pair.groups()} <= gpus and pair[1] != pair[2]),
        Check.P2P_BIDIR_BW: bool(
            pair and {*pair.groups()} <= gpus and int(pair[1][4:]) < int(pair[2][4:])
        ),
        Check.IB_WRITE_BW: component
        in {rail_component(t.device, t.port, node, t.peer, server=t.server) for t in task.ib_tests},
    }
    if check in by_check:
        return by_check[check]
    if check in (Check.GPU_COUNT, Check.DRIVER_VERSION, Check.CUDA_VERSION):
        return component == "node"
    if check in (Check.ALLREDUCE_MULTI, Check.LADDER_THROUGHPUT, Check.GPU_UTILISATION):
        group = Check.ALLREDUCE_MULTI if check == Check.ALLREDUCE_MULTI else Check.LADDER_THROUGHPUT
        return component in {f"nodes:{len(g.nodes)}" for g in task.groups if g.check == group}
    if check == Check.ALLREDUCE_NODE:
        return component == "node" and any(g.check == check for g in task.groups)
    if check == Check.LADDER_EFFICIENCY:
        return False
    return component in gpus  # the per-GPU checks


def check_screened(
    node: str, task: pb.PreflightTask, given_ms: list[Measurement], out: Screened
) -> None:
    """Kept: asked of the node, its own, each once. Refused: counted, said why, a misfit."""
    assert len(out.kept) + len(out.refused) == len(given_ms)
    asked = {Check(c) for c in task.checks}
    if Check.LADDER_THROUGHPUT in asked:
        asked.add(Check.GPU_UTILISATION)
    keys = [(m.check, m.component) for m in out.kept]
    assert len(keys) == len(set(keys)), "a (check, component) kept twice"
    for m in out.kept:
        assert m.check in asked
        could_not_run = m.component == "node" and not m.ran
        assert could_not_run or _allowed(node, task, m.check, m.component), (m.check, m.component)
    assert set(out.reasons()) <= ANSWER_REASONS
    for _, why in out.refused:
        assert_clear(why, node, "duplicate")
    if out.refused:
        reason = Misfit(node, tuple(out.refused)).reason
        assert_clear(reason, node, limit=MAX_MISFIT)
        assert f"{len(out.refused)} result(s)" in reason


class TestResultOnTheWire:
    @given(results(), st.lists(st.tuples(st.integers(0, 2**20), st.integers(0, 255)), max_size=4))
    @example(  # more measurements than any node makes
        (
            *TASKS[0],
            pb.PreflightResult(
                run_id=TASKS[0][1].run_id,
                task_id=TASKS[0][1].task_id,
                measurements=[pb.PreflightMeasurement(check="gpu_count", component="node")]
                * (MAX_MEASUREMENTS + 1),
            ),
        ),
        [],
    )
    @example(  # the limit's worth of one figure: one kept, the rest duplicates
        (
            *TASKS[0],
            pb.PreflightResult(
                run_id=TASKS[0][1].run_id,
                task_id=TASKS[0][1].task_id,
                measurements=[pb.PreflightMeasurement(check="gpu_count", component="node")]
                * MAX_MEASUREMENTS,
            ),
        ),
        [],
    )
    def test_a_result_is_screened_then_fitted_to_the_plan(self, sent, edits):
        """Bytes of a result (mangled or not): refused whole or per measurement, then fitted."""
        tried(TARGET)
        node, task, result = sent
        raw = pb.AgentMessage(preflight_result=result).SerializeToString()
        raw = _mangle(raw, edits)
        try:
            message = parse_message(raw)
            if message.WhichOneof("body") != "preflight_result":
                return
            screened = screen_result(message.preflight_result)
        except WireError as exc:
            assert exc.reason in WIRE_REASONS
            assert_clear(exc)
            return
        sent_count = len(message.preflight_result.measurements)
        assert len(screened.measurements) + sum(screened.rejected.values()) == sent_count
        assert set(screened.rejected) <= MEASUREMENT_REASONS
        for reason, text in screened.examples.items():
            assert reason in screened.rejected
            assert_clear(text, limit=MAX_MESSAGE)
        for m in screened.measurements:
            assert m.value is None or (math.isfinite(m.value) and abs(m.value) <= MAX_VALUE)
            assert COMPONENT.fullmatch(m.component)
            assert UNIT.fullmatch(m.unit)
            assert len(m.text) <= MAX_TEXT
            assert len(m.error) <= MAX_ERROR
            assert len(m.evidence) <= MAX_EVIDENCE
        fitted = screen_answer(node, task, FACTS[node], screened.measurements)
        check_screened(node, task, screened.measurements, fitted)
        for m in fitted.kept:
            assert m.value is None or math.isfinite(m.value)


@st.composite
def measurements(draw: st.DrawFn, node: str, task: pb.PreflightTask) -> list[Measurement]:
    """Measurements as any code might hand the screen: no wire check has seen them."""
    honest = _planned(node, task)
    out = []
    for _ in range(draw(st.integers(0, 12))):
        if draw(st.booleans()) and honest:
            check, component = draw(st.sampled_from(honest))
        else:
            check = draw(st.sampled_from([c.value for c in Check]))
            component = draw(st.one_of(st.sampled_from(FOREIGN), WEIRD_TEXT))
        value = draw(VALUES)
        out.append(
            Measurement(
                Check(check),
                component,
                None if value is None else _float(value),
                draw(TEXTS),
                text=draw(TEXTS),
                error=draw(st.one_of(st.just(""), TEXTS)),
                evidence=draw(TEXTS),
            )
        )
    if draw(st.booleans()) and out:
        out += [out[-1]] * draw(st.integers(1, 300))
    return out


class TestAnswerScreen:
    @given(st.sampled_from(TASKS).flatmap(lambda t: st.tuples(st.just(t), measurements(*t))))
    def test_the_screen_never_raises_and_keeps_only_the_plan(self, drawn):
        """Any measurements of a planned task: the screen keeps the plan's, each once."""
        tried(TARGET)
        (node, task), given_ms = drawn
        out = screen_answer(node, task, FACTS[node], given_ms)
        check_screened(node, task, given_ms, out)


@st.composite
def tasks(draw: st.DrawFn) -> pb.PreflightTask:
    """A planned task with fields made hostile: what an agent might be sent."""
    task = pb.PreflightTask()
    task.CopyFrom(draw(st.sampled_from(TASKS))[1])
    for _ in range(draw(st.integers(0, 4))):
        field = draw(st.integers(0, 6))
        if field == 0:
            task.run_id = draw(WEIRD_TEXT)
        elif field == 1:
            task.checks.append(draw(CHECK_NAMES))
        elif field == 2:
            task.timeout_s = draw(st.floats(allow_nan=True, allow_infinity=True))
        elif field == 3:
            task.level = draw(st.one_of(WEIRD_TEXT, st.sampled_from([v.value for v in Level])))
        elif field == 4 and task.groups:
            group = task.groups[0]
            group.node_rank = draw(st.integers(0, 2**32 - 1))
            group.nodes.append(draw(WEIRD_TEXT))
            group.size_bytes = draw(st.integers(0, 2**64 - 1))
        elif field == 5 and task.ib_tests:
            test = task.ib_tests[0]
            test.peer, test.server_addr = draw(WEIRD_TEXT), draw(WEIRD_TEXT)
            test.port = draw(st.integers(0, 2**32 - 1))
        else:
            del task.checks[:]
    return task


class TestTask:
    @given(tasks())
    def test_a_task_is_valid_or_named_wrong(self, task):
        """What the agent checks of a task: valid (and every check known), or a clear refusal."""
        tried(TARGET)
        try:
            validate_task(task)
        except WireError as exc:
            assert exc.reason == "invalid_preflight_task"
            assert_clear(exc)
            return
        assert {Check(c) for c in task.checks}
        assert math.isfinite(task.timeout_s)
