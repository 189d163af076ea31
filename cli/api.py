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

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from pathlib import Path

DEFAULT_API: Final = "http://127.0.0.1:9470"
TIMEOUT_S: Final = 10.0
# A dump waits for the agents (15 s each, at once) and the collector's loop: answered by 24 s.
DUMP_TIMEOUT_S: Final = 40.0
EVIDENCE_WIDTH: Final = 72
TOKEN_ENV: Final = "FLEETWATCH_API_TOKEN"  # noqa: S105 - the variable's name


class ApiCallError(Exception):
    """The collector could not be reached or refused the request; the message says which."""


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
        try:
            detail = json.loads(exc.read()).get("error", exc.reason)
        except (ValueError, AttributeError):
            detail = exc.reason
        msg = f"{method} {url}: {exc.code} {detail}"
        if exc.code == HTTPStatus.UNAUTHORIZED and token is None:
            msg += f" (set ${TOKEN_ENV} or pass --token-file)"
        raise ApiCallError(msg) from exc
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        msg = f"cannot reach the collector at {api}: {reason}"
        raise ApiCallError(msg) from exc


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


def _table(rows: list[list[str]], out: TextIO) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip(), file=out)


def _incident_note(row: dict[str, Any]) -> str:
    if row.get("suppressed_by"):
        return f"suppressed by {row['suppressed_by']}"
    if row.get("silenced_by"):
        return f"silenced ({row['silenced_by']})"
    return "escalated" if row.get("escalated") else ""


def _listing(  # noqa: PLR0913 - what to fetch, and how to show it
    api: str,
    path: str,
    key: str,
    header: list[str],
    row: Callable[[dict[str, Any], float], list[str]],
    *,
    empty: str,
    as_json: bool,
    out: TextIO,
) -> int:
    """GET ``path`` and print its ``key`` list as a table (or the JSON as it came)."""
    data = call(api, "GET", path)
    if as_json:
        print(json.dumps(data, indent=2), file=out)
        return 0
    rows: list[dict[str, Any]] = data.get(key, [])
    if not rows:
        print(empty, file=out)
        return 0
    now = time.time()
    _table([header, *(row(r, now) for r in rows)], out)
    return 0


def _incident_row(r: dict[str, Any], now: float) -> list[str]:
    since = r.get("resolved_ms") if r["phase"] == "resolved" else r.get("fired_ms")
    return [
        r["phase"],
        r["severity"],
        r["rule"],
        r["target"],
        _when(since or r.get("started_ms"), now),
        _incident_note(r),
        str(r.get("evidence", ""))[:EVIDENCE_WIDTH],
    ]


def incidents(api: str, *, show_all: bool, limit: int, as_json: bool, out: TextIO) -> int:
    """List open incidents (or all recent ones), newest first."""
    query = urllib.parse.urlencode({"open": "0" if show_all else "1", "limit": limit})
    return _listing(
        api,
        f"/api/v1/incidents?{query}",
        "incidents",
        ["PHASE", "SEVERITY", "RULE", "TARGET", "SINCE", "NOTE", "EVIDENCE"],
        _incident_row,
        empty="no incidents" if show_all else "no open incidents",
        as_json=as_json,
        out=out,
    )


def actions(api: str, *, node: str | None, limit: int, as_json: bool, out: TextIO) -> int:
    """List actions and their outcomes, newest first."""
    params: dict[str, str | int] = {"limit": limit}
    if node:
        params["node"] = node
    return _listing(
        api,
        f"/api/v1/actions?{urllib.parse.urlencode(params)}",
        "actions",
        ["WHEN", "ACTION", "NODE", "TARGET", "STATE", "DETAIL"],
        lambda r, now: [
            _when(r.get("created_ms"), now),
            r["action"],
            r["node"],
            r["target"],
            r["state"],
            str(r.get("detail", ""))[:EVIDENCE_WIDTH],
        ],
        empty="no actions",
        as_json=as_json,
        out=out,
    )


def silences(api: str, *, as_json: bool, out: TextIO) -> int:
    """List silences that are not over yet (including those still to start)."""
    return _listing(
        api,
        "/api/v1/silences",
        "silences",
        ["ID", "NODE", "RULE", "STARTS", "ENDS", "REASON"],
        lambda r, now: [
            str(r["id"]),
            r["node"],
            r["rule"],
            _when(r["starts_ms"], now),
            _when(r["ends_ms"], now),
            r.get("reason", ""),
        ],
        empty="no silences",
        as_json=as_json,
        out=out,
    )


def add_silence(api: str, body: dict[str, Any], out: TextIO, token: str | None = None) -> int:
    """Add a silence (a maintenance window when it starts later); print its id."""
    answer = call(api, "POST", "/api/v1/silences", body, token=token)
    print(f"silence {answer['id']} added", file=out)
    return 0


def remove_silence(api: str, silence_id: int, out: TextIO, token: str | None = None) -> int:
    """End a silence now."""
    call(api, "DELETE", f"/api/v1/silences/{silence_id}", token=token)
    print(f"silence {silence_id} removed", file=out)
    return 0


def drains(api: str, *, as_json: bool, out: TextIO) -> int:
    """List the nodes fleetwatch holds drained and the drains waiting behind the cap."""
    data = call(api, "GET", "/api/v1/drains")
    if as_json:
        print(json.dumps(data, indent=2), file=out)
        return 0
    drained: dict[str, str] = data.get("drained", {})
    cap = f"{len(drained)} of at most {data.get('drain_cap')} drained by fleetwatch"
    breaker = "; circuit breaker OPEN" if data.get("drain_breaker_open") else ""
    print(f"{cap}, {len(data.get('waiting', []))} drains waiting{breaker}", file=out)
    if drained:
        _table([["NODE", "INCIDENT"], *([n, i] for n, i in drained.items())], out)
    return 0


def release(  # noqa: PLR0913 - the request, where to print, and its one option
    api: str,
    node: str,
    reason: str,
    out: TextIO,
    token: str | None = None,
    *,
    require_preflight: bool = False,
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
    print(f"{node} released: it no longer counts toward the drain cap", file=out)
    if require_preflight and isinstance(answer, dict) and answer.get("preflight"):
        print(answer["preflight"], file=out)
    return 0


def _job_row(r: dict[str, Any], _now: float) -> list[str]:
    drop = f"-{r['drop_share']:.0%} ({r['drop_cause'] or '?'})" if r["drop"] else "-"
    checkpoint = span(r["checkpoint_age_s"]) if r["checkpoint_age_s"] else "-"
    if r["checkpoint_interval_s"]:
        checkpoint += f" / {span(r['checkpoint_interval_s'])}"
    return [
        r["id"],
        r.get("state") or ("running" if r["active"] else "idle"),
        str(r["gpus"]),
        str(r.get("ranks_missing", 0) or "-"),
        str(r["step"]),
        f"{r['tokens_per_s']:,.0f}",
        f"{r['mfu']:.1%}" if r["mfu"] else "-",
        f"{r['ettr']:.1%}",
        ",".join(r["straggler_nodes"]) or "-",
        drop,
        checkpoint,
    ]


def jobs(  # noqa: PLR0913 - which job, how to show it, and the dump's token
    api: str,
    job: str | None,
    *,
    as_json: bool,
    out: TextIO,
    dump: bool = False,
    token: str | None = None,
) -> int:
    """List training jobs, or one job rank by rank; ``dump``: its ranks' stacks, gathered now."""
    if dump:
        return dump_stacks(api, job, as_json=as_json, out=out, token=token)
    if job is None:
        return _listing(
            api,
            "/api/v1/jobs",
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
            as_json=as_json,
            out=out,
        )
    path = f"/api/v1/jobs/{urllib.parse.quote(job, safe='')}"
    data = call(api, "GET", path)
    if as_json:
        print(json.dumps(data, indent=2), file=out)
        return 0
    print(data["summary"], file=out)
    for culprit in data.get("culprits", []):
        print(f"  culprit: {culprit}", file=out)
    evidence = data.get("evidence")
    if evidence:
        ago = span(max(0.0, time.time() - evidence["gathered_at"]))
        print(f"  stacks ({ago} ago): {evidence['verdict']}", file=out)
    rows = [["RANK", "NODE", "GPU", "STEP", "PROCESS", "STEP S", "COMPUTE S", "RATIO", "NOTE"]]
    rows.extend(
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
    _table(rows, out)
    return 0


def dump_stacks(api: str, job: str | None, *, as_json: bool, out: TextIO, token: str | None) -> int:
    """Ask the agents for each rank's stack now; print the stacks grouped and the verdict."""
    if job is None:
        msg = "--dump needs a JOB"
        raise ApiCallError(msg)
    path = f"/api/v1/jobs/{urllib.parse.quote(job, safe='')}/dump"
    data = call(api, "POST", path, {}, token=token, timeout_s=DUMP_TIMEOUT_S)
    if as_json:
        print(json.dumps(data, indent=2), file=out)
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
        _table(rows, out)
    for unknown in evidence["unknown"]:
        print(f"  no stack: rank {unknown['rank']}: {unknown['why']}", file=out)
    return 0


def _ranks_cell(ranks: list[int], shown: int = 8) -> str:
    text = ",".join(str(r) for r in ranks[:shown])
    return f"{text},... ({len(ranks)})" if len(ranks) > shown else text
