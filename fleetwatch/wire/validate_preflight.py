"""Checks on pre-flight tasks and results; each failure names what was wrong.

The collector screens every :class:`PreflightResult` an agent sends (:func:`screen_result`): a
result whose ids are malformed, or that is too big, is refused whole; a measurement that breaks
the contract (an unknown check, a component that is no component name, a value that is not a
finite number, text past its bound) is refused on its own and counted by reason, and the rest of
the result is taken. The agent runs :func:`validate_task` on what the collector asks of it.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Final

from fleetwatch.preflight.vocabulary import Check, Level, Measurement
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb
from fleetwatch.wire.validate import DEVICE_NAME, NODE_NAME, WireError

RUN_ID: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}")
TASK_ID: Final = RUN_ID
# A component: node, gpu:3, gpu:0-gpu:1, nic:mlx5_0, ib:mlx5_0/1, rail:mlx5_0/1:a-b, nodes:8
COMPONENT: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/@+-]{0,199}")
UNIT: Final = re.compile(r"[A-Za-z0-9%/_. -]{0,16}")

MAX_MEASUREMENTS: Final = 4096  # 16 GPUs: 240 ordered pairs and 120 pairs, per-GPU checks, ...
MAX_TEXT: Final = 256
MAX_ERROR: Final = 512
MAX_EVIDENCE: Final = 2048
MAX_REFUSED: Final = 512
MAX_VALUE: Final = 1e15  # no bandwidth, count or rate comes near it
MAX_GROUPS: Final = 16
MAX_GROUP_NODES: Final = 4096
MAX_IB_TESTS: Final = 128
MAX_TIMEOUT_S: Final = 24 * 3600.0
MAX_SIZE_BYTES: Final = 1 << 36
MAX_STEPS: Final = 100_000

REASON_RESULT: Final = "invalid_preflight_result"
REASON_TASK: Final = "invalid_preflight_task"

_CHECKS: Final = frozenset(c.value for c in Check)
_GROUP_CHECKS: Final = frozenset(
    {Check.ALLREDUCE_NODE.value, Check.ALLREDUCE_MULTI.value, Check.LADDER_THROUGHPUT.value},
)
_LEVELS: Final = frozenset(level.value for level in Level)


def _require(ok: bool, reason: str, message: str) -> None:  # noqa: FBT001 - reads as an assertion
    if not ok:
        raise WireError(reason, message)


def _shown(text: str) -> str:
    return repr(text[:80])


@dataclass(frozen=True, slots=True)
class ScreenedResult:
    """What a result carried that may be taken, and what was refused, by reason."""

    run_id: str
    task_id: str
    refused: str
    measurements: list[Measurement]
    rejected: Counter[str] = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)


def measurement_problem(m: pb.PreflightMeasurement) -> tuple[str, str] | None:
    """(reason, message) when ``m`` breaks the contract; None when it may be taken."""
    if m.check not in _CHECKS:
        return "unknown_check", f"check {_shown(m.check)} is not a pre-flight check"
    if COMPONENT.fullmatch(m.component) is None:
        return "bad_component", f"{m.check}: component {_shown(m.component)} is malformed"
    if m.HasField("value") and not (math.isfinite(m.value) and abs(m.value) <= MAX_VALUE):
        return "bad_value", f"{m.check} {m.component}: value {m.value!r} is not a finite number"
    if UNIT.fullmatch(m.unit) is None:
        return "bad_text", f"{m.check} {m.component}: unit {_shown(m.unit)} is malformed"
    for name, text, bound in (
        ("text", m.text, MAX_TEXT),
        ("error", m.error, MAX_ERROR),
        ("evidence", m.evidence, MAX_EVIDENCE),
    ):
        if len(text) > bound:
            return "bad_text", f"{m.check} {m.component}: {name} longer than {bound} characters"
    return None


def screen_result(result: pb.PreflightResult) -> ScreenedResult:
    """Check a result: WireError for the whole of it, per-measurement refusals counted."""
    r = REASON_RESULT
    _require(RUN_ID.fullmatch(result.run_id) is not None, r, f"run id {_shown(result.run_id)}")
    _require(TASK_ID.fullmatch(result.task_id) is not None, r, f"task id {_shown(result.task_id)}")
    _require(len(result.refused) <= MAX_REFUSED, r, f"refusal longer than {MAX_REFUSED} characters")
    _require(
        len(result.measurements) <= MAX_MEASUREMENTS,
        r,
        f"{len(result.measurements)} measurements; limit {MAX_MEASUREMENTS}",
    )
    taken: list[Measurement] = []
    rejected: Counter[str] = Counter()
    examples: dict[str, str] = {}
    for m in result.measurements:
        problem = measurement_problem(m)
        if problem is not None:
            rejected[problem[0]] += 1
            examples.setdefault(problem[0], problem[1])
            continue
        taken.append(measurement_from_pb(m))
    return ScreenedResult(
        run_id=result.run_id,
        task_id=result.task_id,
        refused=result.refused,
        measurements=taken,
        rejected=rejected,
        examples=examples,
    )


def measurement_from_pb(m: pb.PreflightMeasurement) -> Measurement:
    """The vocabulary's measurement (``m`` already screened)."""
    return Measurement(
        check=Check(m.check),
        component=m.component,
        value=m.value if m.HasField("value") else None,
        unit=m.unit,
        text=m.text,
        error=m.error,
        evidence=m.evidence,
    )


def measurement_to_pb(m: Measurement) -> pb.PreflightMeasurement:
    """The wire form, cut to the contract's bounds (a tool's long output must not refuse it)."""
    out = pb.PreflightMeasurement(
        check=m.check.value,
        component=m.component[:200],
        unit=m.unit[:16],
        text=m.text[:MAX_TEXT],
        error=m.error[:MAX_ERROR],
        evidence=m.evidence[-MAX_EVIDENCE:],
    )
    if m.value is not None and math.isfinite(m.value):
        out.value = float(m.value)
    elif m.value is not None and not out.error:
        out.error = f"the tool gave {m.value!r}, not a number"
    return out


def validate_task(task: pb.PreflightTask) -> None:
    """Check what the collector asks of this agent; WireError naming the first problem."""
    r = REASON_TASK
    _require(RUN_ID.fullmatch(task.run_id) is not None, r, f"run id {_shown(task.run_id)}")
    _require(TASK_ID.fullmatch(task.task_id) is not None, r, f"task id {_shown(task.task_id)}")
    _require(task.level in _LEVELS, r, f"level {_shown(task.level)} is not a level")
    _require(0 < len(task.checks) <= len(_CHECKS), r, "a task names 1 to every check")
    for name in task.checks:
        _require(name in _CHECKS, r, f"check {_shown(name)} is not a pre-flight check")
    _require(
        math.isfinite(task.timeout_s) and 0 < task.timeout_s <= MAX_TIMEOUT_S,
        r,
        f"timeout_s {task.timeout_s!r} out of range",
    )
    _require(len(task.groups) <= MAX_GROUPS, r, f"more than {MAX_GROUPS} groups")
    for group in task.groups:
        _validate_group(group)
    _require(len(task.ib_tests) <= MAX_IB_TESTS, r, f"more than {MAX_IB_TESTS} ib_write_bw tests")
    for test in task.ib_tests:
        _require(DEVICE_NAME.fullmatch(test.device) is not None, r, "ib test device malformed")
        _require(1 <= test.port <= 255, r, f"ib test port {test.port} out of range")  # noqa: PLR2004
        _require(NODE_NAME.fullmatch(test.peer) is not None, r, "ib test peer is not a host name")
        _require(1 <= test.tcp_port <= 65535, r, f"ib test tcp_port {test.tcp_port}")  # noqa: PLR2004
        _require(
            test.server
            or NODE_NAME.fullmatch(test.server_addr) is not None
            or _is_address(test.server_addr),
            r,
            f"ib test server_addr {_shown(test.server_addr)} is no address",
        )


def _is_address(text: str) -> bool:
    return re.fullmatch(r"[0-9A-Fa-f:.\[\]]{2,64}", text) is not None


def _validate_group(group: pb.PreflightGroup) -> None:
    r = REASON_TASK
    _require(group.check in _GROUP_CHECKS, r, f"group check {_shown(group.check)}")
    _require(0 < len(group.nodes) <= MAX_GROUP_NODES, r, "a group holds 1 to 4096 nodes")
    for node in group.nodes:
        _require(NODE_NAME.fullmatch(node) is not None, r, f"group node {_shown(node)}")
    _require(group.node_rank < len(group.nodes), r, f"node_rank {group.node_rank} past the group")
    _require(0 < group.gpus_per_node <= 64, r, f"gpus_per_node {group.gpus_per_node}")  # noqa: PLR2004
    _require(
        NODE_NAME.fullmatch(group.master_addr) is not None or _is_address(group.master_addr),
        r,
        f"master_addr {_shown(group.master_addr)} is no address",
    )
    _require(0 < group.master_port <= 65535, r, f"master_port {group.master_port}")  # noqa: PLR2004
    _require(group.size_bytes <= MAX_SIZE_BYTES, r, f"size_bytes {group.size_bytes}")
    _require(group.steps <= MAX_STEPS, r, f"steps {group.steps}")
