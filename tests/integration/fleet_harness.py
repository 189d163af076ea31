"""A collector with actions wired to a real signed-webhook receiver, and simulated nodes."""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from agent.sim.cluster import SimCluster
from cli.demo.wiring import demo_rules
from collector.actions.config import ActionsConfig, WebhookConfig
from collector.actions.safety import SafetyConfig
from collector.main import CollectorService
from fleetwatch.clock import SystemClock
from fleetwatch.testing import wait_for_more, wait_until

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from agent.jobs.stacks import StackDumper
    from cli.dev.webhook_receiver import WebhookReceiver
    from collector.config import CollectorConfig

SECRET = b"test-secret"
NODES = [f"node-{i}" for i in range(1, 5)]
BUILTIN_RULES = Path(__file__).parents[2] / "rules" / "default.yaml"


def builtin_rules(tmp_path: Path, *names: str) -> Path:
    """A rule file holding only the built-in rules ``names``, as shipped."""
    data = yaml.safe_load(BUILTIN_RULES.read_text("utf-8"))
    rules = [r for r in data["rules"] if r["name"] in names]
    assert sorted(names) == sorted(r["name"] for r in rules)
    path = tmp_path / "builtin-subset.yaml"
    path.write_text(yaml.safe_dump({"version": 1, "rules": rules}))
    return path


def actions(receiver: WebhookReceiver, tmp_path: Path, **safety: Any) -> ActionsConfig:
    secret_file = tmp_path / "secret"
    secret_file.write_bytes(SECRET + b"\n")
    hook = WebhookConfig(url=f"{receiver.url}/hooks", secret_file=secret_file, max_attempts=2)
    return ActionsConfig(
        safety=SafetyConfig(**safety),
        drain_webhook=hook,
        notify={"default": hook},
    )


async def start(
    make_config: Callable[..., CollectorConfig],
    tmp_path: Path,
    acts: ActionsConfig,
    *,
    nodes: list[str] | None = None,
    rules: tuple[Path, ...] = (),
) -> tuple[CollectorService, SimCluster]:
    """A collector acting through ``acts`` (built-in rules unless ``rules``), and its nodes."""
    nodes = nodes or NODES
    service = CollectorService(
        make_config(actions=acts, rules_interval=0.1, rules=rules), SystemClock()
    )
    await service.start()
    cluster = SimCluster(
        nodes,
        tmp_path / "nodes",
        SystemClock(),
        f"127.0.0.1:{service.grpc_port}",
        poll_interval=0.05,
        heartbeat_interval=0.2,
    )
    cluster.start()
    await wait_until(
        lambda: sum(n.connected for n in service.fleet.snapshot().values()) == len(nodes),
        what="agents connected",
    )
    return service, cluster


def dbe_counter_known(service: CollectorService, node: str, gpu: int) -> bool:
    """Whether the collector holds a value of the GPU's DBE counter, which a rise is measured
    from: a node counts as connected at its Hello, before its first report."""
    state = service.fleet.snapshot().get(node)
    gpus = state.gpus.values() if state is not None else ()
    return any(g.index == gpu and g.number("ecc_dbe_aggregate_total") is not None for g in gpus)


def kinds(receiver: WebhookReceiver) -> list[tuple[str, str]]:
    return sorted(
        (d.body["kind"], d.body["payload"].get("node", "")) for d in receiver.deliveries()
    )


def api(
    service: CollectorService,
    method: str,
    path: str,
    body: object = None,
    *,
    token: str | None = None,
) -> tuple[int, Any]:
    """One request to the collector's API (``token``: sent as a bearer token); status, JSON."""
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(
        f"http://127.0.0.1:{service.http_port}{path}",
        data=data,
        method=method,
        headers=headers,
    )
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:  # noqa: S310
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read())


@contextlib.asynccontextmanager
async def job_fleet(
    make_config: Callable[..., CollectorConfig],
    receiver: WebhookReceiver,
    tmp_path: Path,
    nodes: list[str],
    *,
    poll_interval: float,
    stacks: StackDumper | None = None,
    **config: Any,
) -> AsyncIterator[tuple[CollectorService, SimCluster]]:
    """A collector on the built-in rules with every ``for`` / 60, and nodes that take step reports.

    ``config`` adds to the collector's configuration (``jobs=JobsConfig(...)``, say);
    ``stacks`` reads the ranks' stacks (None: the simulated dumper).

    Yields once every agent is connected and listens on its job socket (in a short temp dir: a
    Unix socket path must stay under 108 bytes).
    """
    rules = demo_rules(tmp_path, 60.0).path  # gpu_straggler waits 1 s, its drain 30 s
    made = make_config(
        actions=actions(receiver, tmp_path), rules_interval=0.1, rules=(rules,), **config
    )
    service = CollectorService(made, SystemClock())
    await service.start()
    sockets = Path(tempfile.mkdtemp(prefix="fwjob", dir="/tmp"))
    cluster = SimCluster(
        nodes,
        tmp_path / "nodes",
        SystemClock(),
        f"127.0.0.1:{service.grpc_port}",
        poll_interval=poll_interval,
        heartbeat_interval=0.5,
        job_socket_dir=sockets,
        stacks=stacks,
    )
    cluster.start()
    try:
        await wait_until(
            lambda: sum(n.connected for n in service.fleet.snapshot().values()) == len(nodes),
            what="agents connected",
        )
        await wait_until(
            lambda: all(p.exists() for p in cluster.job_sockets.values()),
            what="job sockets bound",
        )
        yield service, cluster
    finally:
        await cluster.stop()
        await service.stop(grace=0)
        shutil.rmtree(sockets, ignore_errors=True)


async def later_ticks(service: CollectorService, count: int = 3) -> None:
    """Let ``count`` more rule ticks run and the actions they started finish: whatever those
    ticks would have done (again) is done and journaled by then."""
    await wait_for_more(lambda: service.incidents.ticks, count, what=f"{count} more rule ticks")
    await service.incidents.idle()


async def journaled(service: CollectorService, node: str, *wanted: tuple[str, str]) -> bool:
    """Whether ``node`` has an action journaled, and each (action, state) of ``wanted``."""
    rows = await service.journal.do(lambda s: s.incidents.actions(node=node))
    return bool(rows) and set(wanted) <= {(r.action, r.state) for r in rows}
