"""``fleetwatch incidents``, ``actions``, ``silence``, ``jobs``: the JSON API for people.

Changes (``silence add|remove``, ``drains release``, ``jobs JOB --dump``) send the collector's
API token as ``Authorization: Bearer``, read from ``--token-file`` or else
``$FLEETWATCH_API_TOKEN``; reads send no token.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Final, TextIO

from cli.output import cut, gpu_names, has_gpu_uuid, print_json, table

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from pathlib import Path

DEFAULT_API: Final = "http://127.0.0.1:9470"
TIMEOUT_S: Final = 10.0
# A dump waits for the agents (15 s each, at once) and the collector's loop: answered by 24 s.
DUMP_TIMEOUT_S: Final = 40.0
TOKEN_ENV: Final = "FLEETWATCH_API_TOKEN"  # noqa: S105 - the variable's name


class ApiCallError(Exception):
    """The collector could not be reached or refused the request; the message says which.

    ``status`` is the HTTP status of a refusal (None: no answer came).
    """

    def __init__(self, message: str, status: int | None = None) -> None:
        """Keep the status beside the message."""
        super().__init__(message)
        self.status = status


def read_token(token_file: Path | None, environ: Mapping[str, str]) -> str | None:
    """The API token from ``token_file``, else from ``$FLEETWATCH_API_TOKEN``; None: neither.

    Whitespace around it is dropped. An unreadable or empty file is an ApiCallError (naming the
    file, never its content); an empty variable counts as unset.
    """
    if token_file is None:
        return environ.get(TOKEN_ENV, "").strip() or None
    try:
        token = token_file.read_text("utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        msg = f"cannot read the API token file {token_file}: {getattr(exc, 'strerror', exc)}"
        raise ApiCallError(msg) from exc
    if not token:
        msg = f"the API token file {token_file} is empty"
        raise ApiCallError(msg)
    return token


def call(  # noqa: PLR0913 - the request, its body, and how it is sent
    api: str,
    method: str,
    path: str,
    body: dict[str, Any] | None = None,
    *,
    token: str | None = None,
    timeout_s: float = TIMEOUT_S,
) -> Any:  # noqa: ANN401 - JSON
    """One request to the collector's API; the decoded JSON answer.

    ``token`` goes out as ``Authorization: Bearer`` (pass it for changes only).
    """
    url = api.rstrip("/") + path
    if not url.startswith(("http://", "https://")):
        msg = f"the API address must start with http:// or https://, not {api!r}"
        raise ApiCallError(msg)
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)  # noqa: S310 - scheme checked above
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310
            return json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        raise refusal(exc, method, url, token) from exc
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise unreachable(api, exc) from exc


def refusal(exc: urllib.error.HTTPError, method: str, url: str, token: str | None) -> ApiCallError:
    """The error for an answer that refused the request: its status and the API's ``error``."""
    try:
        detail = json.loads(exc.read()).get("error", exc.reason)
    except (ValueError, AttributeError):
        detail = exc.reason
    msg = f"{method} {url}: {exc.code} {detail}"
    if exc.code == HTTPStatus.UNAUTHORIZED and token is None:
        msg += f" (set ${TOKEN_ENV} or pass --token-file)"
    return ApiCallError(msg, exc.code)


def unreachable(api: str, exc: Exception) -> ApiCallError:
    """The error for a request that got no answer (or one that could not be read)."""
    return ApiCallError(f"cannot reach the collector at {api}: {getattr(exc, 'reason', exc)}")


def span(seconds: float) -> str:
    """``2d3h``, ``4h10m``, ``5m7s`` or ``12s``: the two largest units."""
    whole = round(seconds)
    units = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))
    for i, (name, size) in enumerate(units[:-1]):
        if whole >= size:
            small_name, small_size = units[i + 1]
            rest = (whole % size) // small_size
            return f"{whole // size}{name}{rest}{small_name}" if rest else f"{whole // size}{name}"
    return f"{whole}s"


def _when(ms: int | None, now: float) -> str:
    if not ms:
        return "-"
    ago = now - ms / 1000
    return f"in {span(-ago)}" if ago < 0 else f"{span(ago)} ago"


def _incident_note(row: dict[str, Any]) -> str:
    if row.get("suppressed_by"):
        return f"suppressed by {row['suppressed_by']}"
    if row.get("silenced_by"):
        return f"silenced ({row['silenced_by']})"
    return "escalated" if row.get("escalated") else ""


def query_string(params: Mapping[str, object]) -> str:
    """``?a=1&b=x`` of the parameters given (None and "" left out), or ""."""
    given = {k: str(v) for k, v in params.items() if v is not None and v != ""}
    return f"?{urllib.parse.urlencode(given)}" if given else ""


def _listing(  # noqa: PLR0913 - what to fetch, and how to show it
    api: str,
    path: str,
    key: str,
    header: list[str],
    row: Callable[[dict[str, Any], float], list[str]],
    *,
    empty: str,
    output: str,
    out: TextIO,
) -> list[dict[str, Any]] | None:
    """GET ``path`` and print its ``key`` list as a table (or the JSON as it came).

    Returns the rows printed as a table (None when JSON was printed).
    """
    data = call(api, "GET", path)
    if output == "json":
        print_json(data, out)
        return None
    rows: list[dict[str, Any]] = data.get(key, [])
    if not rows:
        print(empty, file=out)
        return rows
    now = time.time()
    table([header, *(row(r, now) for r in rows)], out)
    return rows


def _gpu_indexes(api: str, nodes: set[str]) -> dict[str, int]:
    """GPU UUID -> index on ``nodes`` (one GET each; a node the API does not know: none)."""
    found: dict[str, int] = {}
    for name in sorted(nodes)[:50]:
        try:
            node = call(api, "GET", f"/api/v1/nodes/{urllib.parse.quote(name, safe='')}")
        except ApiCallError:
            continue
        for gpu in node.get("gpus", []) if isinstance(node, dict) else []:
            if isinstance(gpu, dict) and "uuid" in gpu and "index" in gpu:
                found[str(gpu["uuid"])] = int(gpu["index"])
    return found


def named_gpus(api: str, rows: list[dict[str, Any]], field: str) -> None:
    """Keep each row's ``field`` text with its GPU UUIDs, for :func:`gpu_names` to name."""
    nodes = {str(r.get("node", "")) for r in rows if has_gpu_uuid(str(r.get(field, "")))}
    indexes = _gpu_indexes(api, nodes) if nodes else {}
    for r in rows:
        r["_gpus"] = indexes


def _incident_row(r: dict[str, Any], now: float, output: str) -> list[str]:
    since = r.get("resolved_ms") if r["phase"] == "resolved" else r.get("fired_ms")
    evidence = gpu_names(str(r.get("evidence", "")), r.get("_gpus", {}), output)
    cells = [
        r["phase"],
        r["severity"],
        r["rule"],
        r["target"],
        _when(since or r.get("started_ms"), now),
        _incident_note(r),
        cut(evidence, output),
    ]
    return [r["id"], *cells] if output == "wide" else cells


def _rule_legend(rows: list[dict[str, Any]], out: TextIO, output: str) -> None:
    """Each rule of ``rows`` once: what it means and its runbook."""
    seen: dict[str, tuple[str, str]] = {}
    for r in rows:
        seen.setdefault(r["rule"], (str(r.get("description") or ""), str(r.get("runbook") or "")))
    lines = []
    for rule, (description, runbook) in sorted(seen.items()):
        if not (description or runbook):
            continue
        text = description.split(". ")[0].rstrip(".") + "." if output != "wide" else description
        lines.append(f"  {rule}: {text}" + (f" Runbook: {runbook}" if runbook else ""))
    if lines:
        print("\nrules:", file=out)
        print("\n".join(lines), file=out)


def incidents(  # noqa: PLR0913 - the filters, and how to show them
    api: str,
    *,
    show_all: bool,
    limit: int,
    output: str,
    out: TextIO,
    node: str | None = None,
    rule: str | None = None,
    since: str | None = None,
    until: str | None = None,
) -> int:
    """List open incidents (or all recent ones), newest first, of one node or rule if asked."""
    query = query_string(
        {
            "open": "0" if show_all else "1",
            "limit": limit,
            "node": node,
            "rule": rule,
            "since": since,
            "until": until,
        }
    )
    header = ["PHASE", "SEVERITY", "RULE", "TARGET", "SINCE", "NOTE", "EVIDENCE"]
    data = call(api, "GET", f"/api/v1/incidents{query}")
    if output == "json":
        print_json(data, out)
        return 0
    rows: list[dict[str, Any]] = data.get("incidents", [])
    if not rows:
        print("no incidents" if show_all else "no open incidents", file=out)
        return 0
    named_gpus(api, rows, "evidence")
    now = time.time()
    header = ["ID", *header] if output == "wide" else header
    table([header, *(_incident_row(r, now, output) for r in rows)], out)
    _rule_legend(rows, out, output)
    return 0


def actions(  # noqa: PLR0913 - the filters, and how to show them
    api: str,
    *,
    node: str | None,
    limit: int,
    output: str,
    out: TextIO,
    since: str | None = None,
    until: str | None = None,
) -> int:
    """List actions and their outcomes, newest first."""
    query = query_string({"limit": limit, "node": node, "since": since, "until": until})
    _listing(
        api,
        f"/api/v1/actions{query}",
        "actions",
        ["WHEN", "ACTION", "NODE", "TARGET", "STATE", "DETAIL"],
        lambda r, now: [
            _when(r.get("created_ms"), now),
            r["action"],
            r["node"],
            r["target"],
            r["state"],
            cut(r.get("detail", ""), output),
        ],
        empty="no actions",
        output=output,
        out=out,
    )
    return 0


def silences(api: str, *, output: str, out: TextIO, node: str | None = None) -> int:
    """List silences that are not over yet (including those still to start)."""
    _listing(
        api,
        f"/api/v1/silences{query_string({'node': node})}",
        "silences",
        ["ID", "NODE", "RULE", "STARTS", "ENDS", "BY", "REASON"],
        lambda r, now: [
            str(r["id"]),
            r["node"],
            r["rule"],
            _when(r["starts_ms"], now),
            _when(r["ends_ms"], now),
            str(r.get("created_by") or "-"),
            cut(r.get("reason", ""), output),
        ],
        empty="no silences",
        output=output,
        out=out,
    )
    return 0


def add_silence(
    api: str, body: dict[str, Any], out: TextIO, token: str | None = None, *, output: str = "table"
) -> int:
    """Add a silence (a maintenance window when it starts later); print its id."""
    answer = call(api, "POST", "/api/v1/silences", body, token=token)
    if output == "json":
        print_json(answer, out)
        return 0
    what = " ".join(f"{k}={body[k]}" for k in ("node", "rule") if body.get(k) not in (None, "*"))
    print(f"silence {answer['id']} added ({what or 'every rule on every node'})", file=out)
    return 0


def remove_silence(
    api: str, silence_id: int, out: TextIO, token: str | None = None, *, output: str = "table"
) -> int:
    """End a silence now."""
    answer = call(api, "DELETE", f"/api/v1/silences/{silence_id}", token=token)
    if output == "json":
        print_json(answer, out)
        return 0
    print(f"silence {silence_id} removed", file=out)
    return 0


def drains(api: str, *, output: str, out: TextIO, node: str | None = None) -> int:
    """List the nodes fleetwatch holds drained and the drains waiting behind the cap."""
    data = call(api, "GET", f"/api/v1/drains{query_string({'node': node})}")
    if output == "json":
        print_json(data, out)
        return 0
    drained: dict[str, str] = data.get("drained", {})
    cap = f"{len(drained)} of at most {data.get('drain_cap')} drained by fleetwatch"
    breaker = "; circuit breaker OPEN" if data.get("drain_breaker_open") else ""
    print(f"{cap}, {len(data.get('waiting', []))} drains waiting{breaker}", file=out)
    if drained:
        table([["NODE", "INCIDENT"], *([n, i] for n, i in drained.items())], out)
    return 0


def release(  # noqa: PLR0913 - the request, where to print, and its one option
    api: str,
    node: str,
    reason: str,
    out: TextIO,
    token: str | None = None,
    *,
    require_preflight: bool = False,
    output: str = "table",
) -> int:
    """Tell fleetwatch a node it drained is back in service (resumed by hand, repaired).

    ``require_preflight``: the collector releases it only if it passed a quick pre-flight run
    since it was drained (ApiCallError saying so otherwise).
    """
    path = f"/api/v1/drains/{urllib.parse.quote(node, safe='')}/release"
    body: dict[str, Any] = {"reason": reason}
    if require_preflight:
        body["require_preflight"] = True
    answer = call(api, "POST", path, body, token=token)
    if output == "json":
        print_json(answer, out)
        return 0
    print(f"{node} released: it no longer counts toward the drain cap", file=out)
    if require_preflight and isinstance(answer, dict) and answer.get("preflight"):
        print(answer["preflight"], file=out)
    return 0


# A running job with no step for this many of its step times (and at least STALLED_FLOOR_S) is
# shown stalled: its last tokens/s would say it still runs at that pace.
STALLED_STEPS: Final = 3.0
STALLED_FLOOR_S: Final = 10.0
MFU_IMPOSSIBLE: Final = 1.0


def stalled(r: Mapping[str, Any]) -> bool:
    """Whether a running job has finished no step for a while (not yet judged hung)."""
    silent, step = r.get("silent_s"), r.get("step_time_s") or 0.0
    if r.get("state") not in (None, "running") or not isinstance(silent, int | float):
        return False
    return bool(silent > max(STALLED_STEPS * step, STALLED_FLOOR_S))


def _job_row(r: dict[str, Any], _now: float) -> list[str]:
    drop = f"-{r['drop_share']:.0%} ({r['drop_cause'] or '?'})" if r["drop"] else "-"
    checkpoint = span(r["checkpoint_age_s"]) if r["checkpoint_age_s"] else "-"
    if r["checkpoint_interval_s"]:
        checkpoint += f" / {span(r['checkpoint_interval_s'])}"
    state = r.get("state") or ("running" if r["active"] else "idle")
    still = stalled(r)
    if still:
        state = f"stalled {span(r['silent_s'])}"
    mfu = r["mfu"]
    shown_mfu = f"{mfu:.1%}" if mfu else "-"
    if mfu and mfu > MFU_IMPOSSIBLE:
        shown_mfu += "!"
    return [
        r["id"],
        state,
        str(r["gpus"]),
        str(r.get("ranks_missing", 0) or "-"),
        str(r["step"]),
        "-" if still else f"{r['tokens_per_s']:,.0f}",
        "-" if still else shown_mfu,
        f"{r['ettr']:.1%}",
        ",".join(r["straggler_nodes"]) or "-",
        drop,
        checkpoint,
    ]


def _job_notes(rows: list[dict[str, Any]], out: TextIO) -> None:
    """What a reader must know to trust the table: an MFU no GPU can reach."""
    impossible = [r["id"] for r in rows if r.get("mfu") and r["mfu"] > MFU_IMPOSSIBLE]
    if impossible:
        print(
            f"\n! MFU over 100% ({', '.join(impossible)}): a reporting mistake, not a speed: the "
            "ranks report tokens for the whole job rather than their own, or the model's "
            "parameters or flops per token are wrong (docs/jobs.md)",
            file=out,
        )


def jobs(  # noqa: PLR0913 - which job, how to show it, and the dump's token
    api: str,
    job: str | None,
    *,
    output: str,
    out: TextIO,
    dump: bool = False,
    token: str | None = None,
    node: str | None = None,
) -> int:
    """List training jobs, or one job rank by rank; ``dump``: its ranks' stacks, gathered now."""
    if dump:
        return dump_stacks(api, job, output=output, out=out, token=token)
    if job is None:
        rows = _listing(
            api,
            f"/api/v1/jobs{query_string({'node': node})}",
            "jobs",
            [
                "JOB",
                "STATE",
                "GPUS",
                "MISSING",
                "STEP",
                "TOKENS/S",
                "MFU",
                "ETTR",
                "STRAGGLERS",
                "DROP",
                "CHECKPOINT AGE / ADVISED",
            ],
            _job_row,
            empty="no jobs",
            output=output,
            out=out,
        )
        if rows:
            _job_notes(rows, out)
        return 0
    path = f"/api/v1/jobs/{urllib.parse.quote(job, safe='')}"
    data = call(api, "GET", path)
    if output == "json":
        print_json(data, out)
        return 0
    print(data["summary"], file=out)
    if stalled(data):
        print(f"  stalled: no step finished for {span(data['silent_s'])}", file=out)
    for culprit in data.get("culprits", []):
        print(f"  culprit: {culprit}", file=out)
    evidence = data.get("evidence")
    if evidence:
        ago = span(max(0.0, time.time() - evidence["gathered_at"]))
        print(f"  stacks ({ago} ago): {evidence['verdict']}", file=out)
    ranks = [["RANK", "NODE", "GPU", "STEP", "PROCESS", "STEP S", "COMPUTE S", "RATIO", "NOTE"]]
    ranks.extend(
        [
            [
                str(r["rank"]),
                r["node"],
                "-" if r["gpu"] is None else str(r["gpu"]),
                str(r["step"]),
                r.get("process") or "-",
                f"{r['step_time_s']:.3f}",
                "-" if r["compute_time_s"] is None else f"{r['compute_time_s']:.3f}",
                "-" if r["compute_ratio"] is None else f"{r['compute_ratio']:.2f}",
                "missing" if r.get("missing") else "straggler" if r["straggler"] else "",
            ]
            for r in data["rank_detail"]
        ],
    )
    table(ranks, out)
    _job_notes([data], out)
    return 0


def dump_stacks(api: str, job: str | None, *, output: str, out: TextIO, token: str | None) -> int:
    """Ask the agents for each rank's stack now; print the stacks grouped and the verdict."""
    if job is None:
        msg = "--dump needs a JOB"
        raise ApiCallError(msg)
    path = f"/api/v1/jobs/{urllib.parse.quote(job, safe='')}/dump"
    data = call(api, "POST", path, {}, token=token, timeout_s=DUMP_TIMEOUT_S)
    if output == "json":
        print_json(data, out)
        return 0
    evidence = data["evidence"]
    took = ", ".join(
        f"{n['node']} {n['took_s']:.1f} s" + (f" ({n['error']})" if n["error"] else "")
        for n in evidence["nodes"]
    )
    print(
        f"job {job}: stacks gathered in {evidence['took_s']:.1f} s ({took or 'no nodes'})", file=out
    )
    print(evidence["verdict"], file=out)
    for suspect in evidence["suspects"]:
        print(f"  suspect: rank {suspect['rank']} on {suspect['node']}: {suspect['why']}", file=out)
    groups = evidence["groups"]
    if groups:
        rows = [["RANKS", "COUNT", "WAITS IN", "SIGNATURE"]]
        rows.extend(
            [
                _ranks_cell(g["ranks"]),
                str(g["count"]),
                g["where"] + (" (collective)" if g["collective"] else ""),
                " < ".join(g["signature"]),
            ]
            for g in groups
        )
        table(rows, out)
    for unknown in evidence["unknown"]:
        print(f"  no stack: rank {unknown['rank']}: {unknown['why']}", file=out)
    return 0


def _ranks_cell(ranks: list[int], shown: int = 8) -> str:
    text = ",".join(str(r) for r in ranks[:shown])
    return f"{text},... ({len(ranks)})" if len(ranks) > shown else text
