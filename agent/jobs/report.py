"""One step report message from a training rank, parsed and checked into a ``JobStep``.

Everything here is about what the message says; who sent it is :mod:`agent.jobs.peer_identity`'s and
:mod:`agent.jobs.claims`'s business. Each way a message can be refused has a short reason, the
label it is counted under (``REFUSAL_REASONS``; the agent sends the counts as the node signals
``agent_job_reports_refused_<reason>``).
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

from fleetwatch.config_file import short_repr
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb
from fleetwatch.wire.validate import WireError
from fleetwatch.wire.validate_jobs import validate_job_step

if TYPE_CHECKING:
    from agent.poll.sampler import NodeInventory


class JobReportError(ValueError):
    """A message is not a usable step report; ``reason`` is a short label for counting."""

    def __init__(self, reason: str, message: str) -> None:
        """Keep the label apart from the message."""
        super().__init__(message)
        self.reason = reason


def _field(report: dict[str, Any], key: str, kind: type, *, required: bool = False) -> Any:  # noqa: ANN401 - JSON values
    value = report.get(key)
    if value is None:
        if required:
            raise JobReportError("missing_field", f"step report has no {key!r}")
        return None
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or isinstance(value, bool):
        msg = f"step report field {key!r} must be {kind.__name__}, got {type(value).__name__}"
        raise JobReportError("bad_type", msg)
    if isinstance(value, float) and not math.isfinite(value):
        raise JobReportError("bad_value", f"step report field {key!r} is not finite")
    return value


def _gpu_uuid(gpu: object, inventory: NodeInventory) -> str:
    if gpu is None:
        return ""
    if isinstance(gpu, int) and not isinstance(gpu, bool):
        for g in inventory.gpus:
            if g.index == gpu:
                return g.uuid
        raise JobReportError("unknown_gpu", f"this node has no GPU with index {gpu}")
    if isinstance(gpu, str):
        for g in inventory.gpus:
            if g.uuid.lower() == gpu.lower():
                return g.uuid
        raise JobReportError("unknown_gpu", f"this node has no GPU {gpu[:80]!r}")
    raise JobReportError("bad_type", "step report field 'gpu' must be an index or a GPU UUID")


def parse_report(data: bytes, inventory: NodeInventory, *, default_job: str = "") -> pb.JobStep:
    """Turn one message into a checked JobStep, or raise JobReportError saying why not.

    ``default_job`` stands in for a report that names no job (the sender's Slurm job).
    """
    try:
        return _parse(data, inventory, default_job)
    except (ValueError, OverflowError, TypeError) as exc:
        if isinstance(exc, JobReportError):
            raise
        # numbers beyond what the wire carries (a 2**40 rank, a time of 1e308)
        msg = f"step report value out of range: {str(exc)[:200]}"
        raise JobReportError("bad_value", msg) from exc


def _parse(data: bytes, inventory: NodeInventory, default_job: str) -> pb.JobStep:
    try:
        report = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise JobReportError("not_json", f"step report is not JSON: {exc}") from exc
    except RecursionError as exc:  # [[[[... nested deeper than the parser goes
        raise JobReportError("not_json", "step report is not JSON: nested too deeply") from exc
    if not isinstance(report, dict):
        raise JobReportError("not_json", "step report must be a JSON object")
    if report.get("v", 1) != 1:
        shown = short_repr(report.get("v"))
        raise JobReportError("version", f"step report version {shown} is not 1")
    job = _field(report, "job", str, required=not default_job) or default_job
    step = pb.JobStep(
        job_id=job,
        rank=_nonnegative(_field(report, "rank", int, required=True), "rank"),
        step=_nonnegative(_field(report, "step", int, required=True), "step"),
        time_unix_ms=int(_field(report, "time", float, required=True) * 1000),
        step_time_s=_field(report, "step_time", float, required=True),
        tokens=_field(report, "tokens", float) or 0.0,
        gpu_uuid=_gpu_uuid(report.get("gpu"), inventory),
        world_size=_nonnegative(_field(report, "world_size", int) or 0, "world_size"),
        params=_field(report, "params", float) or 0.0,
        flops_per_token=_field(report, "flops_per_token", float) or 0.0,
    )
    compute = _field(report, "compute_time", float)
    if compute is not None:
        step.compute_time_s = compute
    checkpointing = report.get("checkpointing")
    if checkpointing is not None and not isinstance(checkpointing, bool):
        msg = "step report field 'checkpointing' must be true or false"
        raise JobReportError("bad_type", msg)
    step.checkpointing = checkpointing is True
    checkpoint = _field(report, "checkpoint", list)
    if checkpoint is not None:
        if len(checkpoint) != 2 or not all(  # noqa: PLR2004 - a pair
            isinstance(t, int | float) and not isinstance(t, bool) and math.isfinite(t)
            for t in checkpoint
        ):
            raise JobReportError("bad_value", "step report checkpoint must be [start, end]")
        step.checkpoint_start_unix_ms = int(checkpoint[0] * 1000)
        step.checkpoint_end_unix_ms = int(checkpoint[1] * 1000)
    try:
        validate_job_step(step)
    except WireError as exc:
        raise JobReportError("bad_value", str(exc)) from exc
    return step


def unsent_count(data: bytes) -> int:
    """How many reports the sender could not send before this one (0 when it says nothing)."""
    try:
        value = json.loads(data).get("unsent", 0)
    except (ValueError, AttributeError, RecursionError):
        return 0
    return value if isinstance(value, int) and 0 < value < 2**31 else 0


def _nonnegative(value: int, key: str) -> int:
    if value < 0 or value >= 2**63:
        raise JobReportError("bad_value", f"step report field {key!r} must be 0 or more")
    return value
