"""A benchmark collector's config: its signed webhooks and lifted caps, and the whole file.

Benchmarks that inject one action-worthy fault per node want every drain to run: the drain cap
and the circuit breaker (tested elsewhere) are lifted, the drain webhook and the ``default``
notify channel go to one signed receiver (:func:`webhook_actions_toml`).
:func:`write_collector_config` writes the whole config ``bench/fault_to_action.py`` and
``bench/collector_ingest.py`` run their collectors with, signed with ``SECRET``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fleetwatch.testing import free_port

if TYPE_CHECKING:
    from pathlib import Path

SECRET = b"fault-to-action-bench-secret"


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


def write_collector_config(workdir: Path, receiver_url: str, nodes: int) -> Path:
    secret_file = workdir / "webhook.secret"
    secret_file.write_bytes(SECRET + b"\n")
    path = workdir / "collector.toml"
    path.write_text(
        f"""\
[collector]
listen = "127.0.0.1:{free_port()}"
http = "127.0.0.1:{free_port()}"
journal = "{workdir / "journal.db"}"

# The benchmark measures latency, not safety: every injected fault's drain must run; the
# node cooldown must be > 0 and one fault per node means it hides nothing.
{
            webhook_actions_toml(
                receiver_url,
                secret_file,
                max_drained_nodes=nodes,
                breaker_max_drains=nodes * 10,
                node_cooldown=0.001,
            )
        }""",
    )
    return path
