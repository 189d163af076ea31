"""The pre-flight routes of the JSON API.

    GET  /api/v1/preflight?limit=&node=   runs, newest first (those in progress first)
    GET  /api/v1/preflight/<id>|latest    one run: its verdict, each node's verdict and checks,
                                          what localisation blamed, every judged result
    POST /api/v1/preflight                {"level": "quick"|"standard"|"full", "nodes": "all",
                                          "dry_run": false}: plan (and start) a run
    POST /api/v1/drains/<node>/release    {"reason": "...", "require_preflight": true}: release
                                          only a node that passed a quick run since its drain

The POSTs are changes: the server lets them through the same Host, Origin, token and
Content-Type checks as every other change before they get here.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import unquote

from collector.api.incidents import MAX_LIMIT, ApiError, json_object
from collector.incidents.service import _LoopBridge
from collector.preflight.orchestrator import PlanError
from fleetwatch.preflight.vocabulary import RANK, Level, Verdict
from fleetwatch.wire.validate_preflight import RUN_ID

if TYPE_CHECKING:
    from collector.actions.dispatcher import Dispatcher
    from collector.api.query import Params
    from collector.preflight.orchestrator import PreflightService
    from collector.store.events import EventReader
    from collector.store.preflight import RunRow

PREFIX: Final = "/api/v1/preflight"
_RUN_KEYS: Final = frozenset({"level", "nodes", "dry_run"})
_RELEASE_KEYS: Final = frozenset({"reason", "require_preflight"})
MAX_NODES_EXPR: Final = 4096


class PreflightDesk(_LoopBridge):
    """Starts runs and checked releases for the HTTP thread, on the event loop."""

    what = "the pre-flight desk"

    def __init__(self, service: PreflightService, dispatcher: Dispatcher | None = None) -> None:
        """Bind to the running loop with :meth:`bind` before use."""
        super().__init__()
        self.service = service
        self._dispatcher = dispatcher

    def submit(self, level: str, nodes: str, *, dry_run: bool) -> dict[str, Any]:
        """Plan a run (and start it unless ``dry_run``); PlanError when it cannot be planned."""

        async def go() -> dict[str, Any]:
            if dry_run:
                return {"dry_run": True, "plan": self.service.plan(level, nodes).to_json()}
            plan = await self.service.submit(level, nodes)
            return {"run_id": plan.run_id, "plan": plan.to_json()}

        return self._call(go())

    def release(self, node: str, reason: str) -> tuple[bool, str]:
        """Release ``node``'s drain only if it passed a quick run since it was drained."""
        dispatcher = self._dispatcher

        async def go() -> tuple[bool, str]:
            if dispatcher is None:
                return False, "no actions are configured"
            incident = dispatcher.drained.get(node)
            if incident is None:
                return False, f"fleetwatch holds no drain of {node!r}"
            holds = self.service.holds
            if holds is None:
                return False, "pre-flight holds are not configured"
            ok, why = await holds.release_allowed(node, incident)
            if not ok:
                return False, why
            done = await dispatcher.release(node, f"{reason} ({why})".strip())
            return done, why

        return self._call(go())


def get(
    path: str, params: Params, reader: EventReader, desk: PreflightDesk | None
) -> tuple[HTTPStatus, object]:
    """Answer a GET under /api/v1/preflight (``path``, its parameters checked)."""
    live = [] if desk is None else [r.to_json() for r in list(desk.service.live.values())]
    if path == PREFIX:
        node = params.text("node")
        limit = params.integer("limit", 50, 1, MAX_LIMIT)
        runs = reader.read_preflight(lambda s: s.runs(limit=limit, node=node))
        running = {r["id"] for r in live}
        listed = [r for r in live if node is None or node in r["nodes"]]
        listed += [r.to_json() for r in runs if r.id not in running]
        return HTTPStatus.OK, {"runs": listed[:limit]}
    run_id = unquote(path.removeprefix(PREFIX + "/"))
    if run_id == "latest":
        newest = reader.read_preflight(lambda s: s.runs(limit=1))
        if not newest:
            return HTTPStatus.NOT_FOUND, {"error": "no pre-flight run has finished yet"}
        run_id = newest[0].id
    if RUN_ID.fullmatch(run_id) is None:
        raise ApiError(HTTPStatus.BAD_REQUEST, f"{run_id[:80]!r} is not a run id")
    for r in live:
        if r["id"] == run_id:
            return HTTPStatus.OK, {"run": r, "nodes": {}, "results": []}
    row = reader.read_preflight(lambda s: s.run(run_id))
    if row is None:
        return HTTPStatus.NOT_FOUND, {"error": f"no pre-flight run {run_id!r}"}
    results = reader.read_preflight(lambda s: s.results(run_id))
    return HTTPStatus.OK, run_detail(row, [r.to_json() for r in results])


def run_detail(row: RunRow, results: list[dict[str, Any]]) -> dict[str, Any]:
    """A run with each node's verdict and the worst verdict of each of its checks."""
    nodes: dict[str, dict[str, Any]] = {
        n: {"verdict": (row.node_verdicts or {}).get(n, "could_not_run"), "checks": {}}
        for n in row.nodes
    }
    for r in results:
        checks = nodes.setdefault(r["node"], {"verdict": "could_not_run", "checks": {}})["checks"]
        before = checks.get(r["check"])
        if before is None or RANK[Verdict(r["verdict"])] > RANK[Verdict(before)]:
            checks[r["check"]] = r["verdict"]
    return {"run": row.to_json(), "nodes": nodes, "results": results}


def claims(method: str, path: str, body: bytes) -> bool:
    """Whether this module answers the change (a run, or a release that asks for pre-flight)."""
    if method != "POST":
        return False
    if path == PREFIX:
        return True
    if path.startswith("/api/v1/drains/") and path.endswith("/release"):
        return b"require_preflight" in body
    return False


def change(path: str, body: bytes, desk: PreflightDesk | None) -> tuple[HTTPStatus, object]:
    """Answer a POST this module :func:`claims`."""
    if desk is None:
        raise ApiError(HTTPStatus.NOT_FOUND, "pre-flight is not configured on this collector")
    if path == PREFIX:
        return _start(body, desk)
    data = json_object(body, "a release")
    if set(data) - _RELEASE_KEYS:
        raise ApiError(HTTPStatus.BAD_REQUEST, "a release takes a reason and require_preflight")
    node = unquote(path.removeprefix("/api/v1/drains/").removesuffix("/release"))
    reason = str(data.get("reason", ""))[:500]
    if data.get("require_preflight") is not True:
        raise ApiError(HTTPStatus.BAD_REQUEST, "require_preflight must be true here")
    ok, why = desk.release(node, reason)
    if not ok:
        return HTTPStatus.CONFLICT, {"error": why}
    return HTTPStatus.OK, {"released": node, "preflight": why}


def _start(body: bytes, desk: PreflightDesk) -> tuple[HTTPStatus, object]:
    data = json_object(body, "a pre-flight run")
    unknown = set(data) - _RUN_KEYS
    if unknown:
        raise ApiError(HTTPStatus.BAD_REQUEST, f"unknown keys: {', '.join(sorted(unknown))[:200]}")
    level = data.get("level", Level.QUICK.value)
    if level not in {lv.value for lv in Level}:
        raise ApiError(HTTPStatus.BAD_REQUEST, "level must be quick, standard or full")
    nodes = data.get("nodes", "all")
    if not isinstance(nodes, str) or not nodes or len(nodes) > MAX_NODES_EXPR:
        raise ApiError(HTTPStatus.BAD_REQUEST, "nodes must be a node expression (e.g. all)")
    dry_run = data.get("dry_run", False)
    if not isinstance(dry_run, bool):
        raise ApiError(HTTPStatus.BAD_REQUEST, "dry_run must be true or false")
    try:
        answer = desk.submit(str(level), nodes, dry_run=dry_run)
    except PlanError as exc:
        raise ApiError(HTTPStatus.BAD_REQUEST, str(exc)) from exc
    return (HTTPStatus.OK if dry_run else HTTPStatus.ACCEPTED), answer
