"""The drain, reset and reboot checks made against every collector's actions (a shared journal).

Pure functions of :class:`FleetActions`, the view the journal builds under its fleet lock; the
collector's own checks (:mod:`collector.actions.local_checks`) see only what this collector did.
Each answers (state, why, open the fleet-wide breaker until ms or 0); "planned" lets it run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collector.actions.safety import SafetyConfig
    from collector.store.incidents import Decision, FleetActions, IncidentRow

PLANNED: Decision = ("planned", "", 0)


def gpu_of(target: str) -> str:
    """``node/gpu/N`` of a target key at or below a GPU (the key itself otherwise)."""
    node, sep, rest = target.partition("/gpu/")
    return f"{node}/gpu/{rest.split('/', 1)[0]}" if sep else target


def _ago(now_ms: int, then_ms: int) -> str:
    return f"{(now_ms - then_ms) / 1000:.0f} s ago"


def reset_refusal(gpu: str, fleet: FleetActions, now_ms: int, safety: SafetyConfig) -> Decision:
    """A reset of ``gpu`` (``node/gpu/N``): not while one runs anywhere, not within cooldown."""
    if any(gpu_of(t) == gpu for t in fleet.resetting):
        return "skipped", f"{gpu} is being reset for another incident", 0
    starts = [t for (k, w), t in fleet.last_ms.items() if k == "reset_gpu" and gpu_of(w) == gpu]
    if starts and now_ms - max(starts) < safety.node_cooldown_s * 1000:
        return "skipped", f"cooldown: reset_gpu ran on {gpu} {_ago(now_ms, max(starts))}", 0
    return PLANNED


def _drained_already(
    incident: IncidentRow, fleet: FleetActions, now_ms: int, safety: SafetyConfig
) -> Decision | None:
    """Skip a drain of a node drained or draining anywhere, or drained within the cooldown."""
    node = incident.node
    holder = fleet.drained.get(node)
    if holder is not None and holder != incident.id:
        return "skipped", f"{node} is already drained by {holder}", 0
    if node in fleet.draining:
        return "skipped", f"{node} is being drained for another incident", 0
    last = fleet.last_ms.get(("drain_node", node))
    if last is not None and now_ms - last < safety.node_cooldown_s * 1000:
        return "skipped", f"cooldown: drain_node ran on {node} {_ago(now_ms, last)}", 0
    return None


def drain_refusal(  # noqa: PLR0913 - the incident, the view, the limits
    incident: IncidentRow,
    fleet: FleetActions,
    *,
    now_ms: int,
    safety: SafetyConfig,
    cap: int,
    size: int,
) -> Decision:
    """A drain of the incident's node: once per node, under the cap, while the breaker is shut.

    ``cap`` is the fleet's drain cap for ``size`` nodes; reaching ``breaker_max_drains`` drains
    in the window opens the breaker for everyone for ``breaker_cooldown_s``.
    """
    skip = _drained_already(incident, fleet, now_ms, safety)
    if skip is not None:
        return skip
    if now_ms < fleet.breaker_open_until_ms:
        return "deferred", "circuit breaker open: drains came too fast (fleet-wide)", 0
    taken = len(fleet.drained) + len(fleet.draining)
    if taken >= cap:
        why = f"drain cap reached: {taken} of {size} nodes drained or draining (cap {cap})"
        return "deferred", why, 0
    if fleet.drains_since >= safety.breaker_max_drains:
        until = now_ms + int(safety.breaker_cooldown_s * 1000)
        return "deferred", "circuit breaker opened: drains came too fast (fleet-wide)", until
    return PLANNED


def reboot_refusal(  # noqa: PLR0913 - the incident, the view, the limits
    incident: IncidentRow,
    fleet: FleetActions,
    *,
    now_ms: int,
    safety: SafetyConfig,
    cap: int,
    size: int,
) -> Decision:
    """A reboot of the incident's node: once per ``reboot_cooldown_s``, a few at once, capped.

    Never while one of the node runs anywhere, nor past ``max_rebooting_nodes`` in flight
    fleet-wide; a node no collector holds drained needs room under the drain cap (the reboot
    takes it out of service). What these hold back is skipped: a reboot never waits.
    """
    node = incident.node
    if node in fleet.rebooting_now:
        return "skipped", f"{node} is being rebooted for another incident", 0
    last = fleet.last_ms.get(("reboot_node", node))
    if last is not None and now_ms - last < safety.reboot_cooldown_s * 1000:
        return "skipped", f"cooldown: reboot_node ran on {node} {_ago(now_ms, last)}", 0
    others = fleet.rebooting - {node}
    if len(others) >= safety.max_rebooting_nodes:
        shown = ", ".join(sorted(others)[:4]) or "none may"
        why = (
            f"reboot limit reached: {len(others)} nodes rebooting ({shown}; max_rebooting_nodes "
            f"{safety.max_rebooting_nodes}, fleet-wide)"
        )
        return "skipped", why, 0
    if node in fleet.drained or node in fleet.draining:
        return PLANNED
    taken = len(set(fleet.drained) | fleet.draining | fleet.rebooting_now)
    if taken >= cap:
        why = (
            f"drain cap reached: a reboot takes {node} out of service too; {taken} of {size} "
            f"nodes drained or draining (cap {cap})"
        )
        return "skipped", why, 0
    return PLANNED
