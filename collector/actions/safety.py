"""The limits on what fleetwatch may do on its own (``[collector.actions]``, docs/rules.md).

Read by this collector's own checks (:mod:`collector.actions.local_checks`) and by the
fleet-wide checks over a shared journal (:mod:`collector.actions.fleet_checks`);
:mod:`collector.actions.config` parses them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SafetyConfig:
    """Limits on what fleetwatch may do on its own."""

    dry_run: bool = False
    max_drained_nodes: int = 4
    max_drained_share: float = 0.1
    node_cooldown_s: float = 300.0
    breaker_window_s: float = 600.0
    breaker_max_drains: int = 5
    breaker_cooldown_s: float = 3600.0
    reset_retry_s: float = 60.0
    max_requeues: int = 4  # requeue_job: at most this many within requeue_window_s
    requeue_window_s: float = 3600.0
    requeue_cooldown_s: float = 86400.0  # before the same job is requeued again
    max_rebooting_nodes: int = 2  # reboot_node: reboots in flight at once, at most
    reboot_cooldown_s: float = 3600.0  # before fleetwatch reboots the same node again
    reboot_timeout_s: float = 1800.0  # a reboot is in flight until the node is back, or this
