"""The evidence bundle's format: what :mod:`collector.model.evidence` read, packed as one archive.

A gzip'd tar, ``fleetwatch-evidence-<node>-<YYYYmmddTHHMMSSZ>.tar.gz``, whose members sit in a
folder of the same name, always in this order::

    README.txt       for people: the node, its open incidents, last actions, pre-flight verdicts
    manifest.json    node, collector version, generated at, since, limits; per file its bytes
                     and sha256, and for the line files their rows and whether they were cut
    inventory.json   GPUs (UUID, PCI bus id, model, VBIOS), NVLinks, IB ports and rates,
                     versions, BMC readings
    events.jsonl     the node's journaled events, oldest first
    kernel.log       the text of its kernel events as ``<time> <node> kernel: <text>`` lines
    incidents.jsonl  incidents active in the window, oldest first
    actions.jsonl    actions created in the window, oldest first
    preflight.jsonl  pre-flight runs that qualified the node, with its verdict and results

Each line file keeps the newest rows that fit in :attr:`BundleLimits.member_bytes`; the
manifest says when one was cut. :func:`pack` is pure: the same evidence and time give the same
bytes (fixed member order, times, owners and modes; sorted JSON keys; no name in the gzip header).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

from fleetwatch import __version__

if TYPE_CHECKING:
    from collections.abc import Iterable

    from collector.store.events import EventRow

__all__ = [
    "FORMAT",
    "MEDIA_TYPE",
    "Bundle",
    "BundleLimits",
    "Evidence",
    "Member",
    "bundle_name",
    "iso",
    "kernel_line",
    "pack",
]

FORMAT: Final = "fleetwatch-evidence/1"
MEDIA_TYPE: Final = "application/gzip"
_SHOWN: Final = 10  # incidents, actions and runs README.txt lists
_WIDTH: Final = 100  # characters of an evidence or detail text README.txt shows
# C0 and C1 control characters and DEL, escaped: one event stays one line, and no text drives
# the terminal of whoever reads the file.
_TAB: Final = 0x09
_ESCAPES: Final = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0)) if c != _TAB}
_FILES: Final = (
    ("inventory.json", "GPUs, NVLinks, IB ports, versions, BMC readings"),
    ("events.jsonl", "journaled events, oldest first"),
    ("kernel.log", "the text of the kernel events (Xid, AER, GPU lost, ...)"),
    ("incidents.jsonl", "incidents active in the window, oldest first"),
    ("actions.jsonl", "actions taken in the window, oldest first"),
    ("preflight.jsonl", "pre-flight runs of the node, with its results"),
)


@dataclass(frozen=True, slots=True)
class BundleLimits:
    """The most rows each line file keeps (the newest), and the most bytes any of them holds."""

    events: int = 10_000
    kernel_lines: int = 2_000
    incidents: int = 1_000
    actions: int = 1_000
    preflight_runs: int = 50
    member_bytes: int = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Member:
    """The rows of one line file, oldest first; ``truncated``: older ones were left out."""

    rows: list[Any]
    truncated: bool = False


@dataclass(frozen=True, slots=True)
class Evidence:
    """Everything read for a bundle, before it is packed.

    ``events`` and ``kernel`` hold EventRows, ``incidents`` IncidentRows, ``actions``
    ActionRows, ``preflight`` one dict per run (``run``, ``node_verdict``, ``results``).
    """

    node: str
    since_ms: int
    inventory: dict[str, Any]
    events: Member
    kernel: Member
    incidents: Member
    actions: Member
    preflight: Member
    limits: BundleLimits = field(default_factory=BundleLimits)


@dataclass(frozen=True, slots=True)
class Bundle:
    """A packed bundle: its file name, the archive's bytes and its manifest."""

    name: str
    data: bytes
    manifest: dict[str, Any]


def iso(ms: int) -> str:
    """Unix milliseconds as an ISO-8601 UTC time, ``2026-12-02T03:00:00.000Z``."""
    when = datetime.fromtimestamp(ms / 1000, UTC)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def bundle_name(node: str, generated_ms: int) -> str:
    """``fleetwatch-evidence-<node>-<YYYYmmddTHHMMSSZ>.tar.gz``."""
    stamp = datetime.fromtimestamp(generated_ms // 1000, UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"fleetwatch-evidence-{node}-{stamp}.tar.gz"


def _text(value: str, width: int = 0) -> str:
    """``value`` on one line (control characters escaped), cut to ``width`` when given."""
    line = value.translate(_ESCAPES)
    return line if not width or len(line) <= width else line[: width - 1] + "…"


def kernel_line(node: str, event: EventRow) -> str:
    """One kernel.log line, in the syslog form ``fleetwatch scan`` reads."""
    return f"{iso(event.time_ms)} {node} kernel: {_text(event.detail)}\n"


def _jsonl(rows: Iterable[dict[str, Any]]) -> list[bytes]:
    return [
        json.dumps(r, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
        for r in rows
    ]


def _pretty(doc: dict[str, Any]) -> bytes:
    return (json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()


def _fit(lines: list[bytes], budget: int) -> tuple[list[bytes], bool]:
    """The newest ``lines`` (those at the end) that fit in ``budget`` bytes; True: some did not."""
    total = 0
    for i in range(len(lines) - 1, -1, -1):
        total += len(lines[i])
        if total > budget:
            return lines[i + 1 :], True
    return lines, False


def pack(ev: Evidence, now_ms: int) -> Bundle:
    """The archive of ``ev``, generated at ``now_ms`` (Unix milliseconds)."""
    name = bundle_name(ev.node, now_ms)
    lines = [
        (
            "events.jsonl",
            _jsonl({**asdict(e), "time": iso(e.time_ms)} for e in ev.events.rows),
            ev.events.truncated,
        ),
        (
            "kernel.log",
            [kernel_line(ev.node, e).encode() for e in ev.kernel.rows],
            ev.kernel.truncated,
        ),
        ("incidents.jsonl", _jsonl(asdict(i) for i in ev.incidents.rows), ev.incidents.truncated),
        ("actions.jsonl", _jsonl(asdict(a) for a in ev.actions.rows), ev.actions.truncated),
        ("preflight.jsonl", _jsonl(ev.preflight.rows), ev.preflight.truncated),
    ]
    files: dict[str, tuple[bytes, int, bool]] = {}
    for member, rows, truncated in lines:
        kept, cut = _fit(rows, ev.limits.member_bytes)
        files[member] = (b"".join(kept), len(kept), truncated or cut)
    counts = {m: (n, cut) for m, (_, n, cut) in files.items()}
    members = [
        ("README.txt", readme(ev, now_ms, counts).encode()),
        ("inventory.json", _pretty(ev.inventory)),
        *((m, data) for m, (data, _, _) in files.items()),
    ]
    manifest = {
        "format": FORMAT,
        "node": ev.node,
        "collector_version": __version__,
        "generated_at": iso(now_ms),
        "generated_ms": now_ms,
        "since": iso(ev.since_ms),
        "since_ms": ev.since_ms,
        "limits": asdict(ev.limits),
        "files": [
            {
                "name": m,
                "bytes": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
                **({"rows": counts[m][0], "truncated": counts[m][1]} if m in counts else {}),
            }
            for m, data in members
        ],
    }
    members.insert(1, ("manifest.json", _pretty(manifest)))
    return Bundle(name, _archive(name.removesuffix(".tar.gz"), members, now_ms), manifest)


def _archive(folder: str, members: list[tuple[str, bytes]], now_ms: int) -> bytes:
    """A gzip'd tar of ``members`` in ``folder``, with fixed times, owners and modes."""
    mtime = now_ms // 1000
    out = io.BytesIO()
    with (
        gzip.GzipFile(filename="", fileobj=out, mode="wb", compresslevel=6, mtime=mtime) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        top = tarfile.TarInfo(folder)
        top.type, top.mode, top.mtime = tarfile.DIRTYPE, 0o755, mtime
        tar.addfile(top)
        for member, data in members:
            info = tarfile.TarInfo(f"{folder}/{member}")
            info.size, info.mode, info.mtime = len(data), 0o644, mtime
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _node_lines(ev: Evidence) -> list[str]:
    """The node in two lines: who it is, and what of it is lost or down."""
    inv = ev.inventory
    lost = [
        f"GPU {g['index']} {g['uuid']} at {g['pci_bus_id']}"
        for g in inv["gpus"]
        if g.get("present") is False
    ]
    down = [
        f"{p['device']}/{p['port']}"
        for p in inv["ib_ports"]
        if p.get("state") and p["state"] != "ACTIVE"
    ]
    links = sum(len(g.get("nvlinks_down", [])) for g in inv["gpus"])
    reach = {True: "; reachable", False: "; unreachable"}.get(inv["reachable"], "")
    who = f"boot {inv['boot_id'] or '-'}, agent {inv['agent_version'] or '-'}"
    gpus = f"GPUs: {len(inv['gpus'])}, lost: {', '.join(lost) or 'none'}"
    ports = f"IB ports: {len(inv['ib_ports'])}, down: {', '.join(down) or 'none'}"
    return [
        f"{ev.node}: {who}, driver {inv['driver_version'] or '-'}{reach}",
        f"{gpus}; NVLinks down: {links}; {ports}",
    ]


def readme(ev: Evidence, now_ms: int, counts: dict[str, tuple[int, bool]]) -> str:
    """README.txt: the node, its open incidents, last actions and pre-flight verdicts, the files.

    ``counts`` gives each line file's rows and whether it was cut.
    """
    lines = [
        f"fleetwatch evidence bundle of {ev.node}",
        f"generated {iso(now_ms)} by fleetwatch {__version__}, from {iso(ev.since_ms)} on",
        "",
        *_node_lines(ev),
        "",
    ]
    open_ = [i for i in ev.incidents.rows if i.phase in ("pending", "firing")]
    lines.append(f"open incidents: {len(open_) or 'none'}")
    lines += [
        f"  {iso(i.fired_ms or i.started_ms)}  {i.phase}  {i.severity}  {i.rule}  {i.target}  "
        f"{_text(i.evidence, _WIDTH)}"
        for i in reversed(open_[-_SHOWN:])
    ]
    actions = ev.actions.rows[-_SHOWN:]
    lines.append(f"last actions, newest first: {len(actions) or 'none'}")
    lines += [
        f"  {iso(a.created_ms)}  {a.action}  {a.target}  {a.state}  {_text(a.detail, _WIDTH)}"
        for a in reversed(actions)
    ]
    runs = ev.preflight.rows[-_SHOWN:]
    lines.append(f"pre-flight runs, newest first: {len(runs) or 'none'}")
    lines += [
        f"  {iso(r['run']['started_ms'])}  run {r['run']['id']}  {r['run']['level']}  "
        f"{ev.node}: {r['node_verdict']}  (the run: {r['run']['verdict']})"
        for r in reversed(runs)
    ]
    lines += ["", "files (manifest.json gives each one's size and sha256, and what was cut):"]
    for member, what in _FILES:
        rows, cut = counts.get(member, (0, False))
        shown = f"{rows:>6}" if member in counts else " " * 6
        note = " (cut: the newest kept)" if cut else ""
        lines.append(f"  {member:<16}{shown}  {what}{note}")
    return "\n".join(lines) + "\n"
