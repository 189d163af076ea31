"""The ``[collector.actions]`` part of a benchmark collector's config: signed webhooks, lifted caps.

Benchmarks that inject one action-worthy fault per node want every drain to run: the drain cap
and the circuit breaker (tested elsewhere) are lifted, the drain webhook and the ``default``
notify channel go to one signed receiver.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path


def webhook_actions_toml(
    receiver_url: str,
    secret_file: Path,
    *,
    max_drained_nodes: int,
    breaker_max_drains: int,
    node_cooldown: float | None = None,
) -> str:
    """TOML for ``[collector.actions]`` and its two webhooks (``node_cooldown`` None: default)."""
    cooldown = "" if node_cooldown is None else f"node_cooldown = {node_cooldown}\n"
    return f"""\
[collector.actions]
max_drained_nodes = {max_drained_nodes}
max_drained_share = 1.0
{cooldown}breaker_window = 1
breaker_max_drains = {breaker_max_drains}
breaker_cooldown = 1

[collector.actions.drain_webhook]
url = "{receiver_url}/drain"
secret_file = "{secret_file}"

[collector.actions.notify.default]
url = "{receiver_url}/notify"
secret_file = "{secret_file}"
"""
