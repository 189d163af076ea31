"""The nodes' series for ``/metrics``: rendered once per change, kept, and split into shards.

A node's text is rendered (:class:`collector.export.node_text.NodeLines`) when it changed, and at
most once per ``render_interval_s`` while only its samples and times change; a change that must
show at once (a Hello, an event, the node's reachability or stream, its state) renders it on the
next scrape. Between renders every scrape reuses the node's pieces, one per family, which are
joined family by family under one HELP and TYPE.

The nodes are split into shards of at most ``nodes_per_shard`` (from the sample budget a target
may carry and the per-node series budget). A node keeps its shard while it is in the fleet; a new
node takes the first shard with room. Each shard is a scrape target of its own
(``/metrics/shards/<n>``, listed for Prometheus' HTTP service discovery), so no target carries
more than the budget and Prometheus scrapes them in parallel. A shard's body and its gzip are kept
and served again while none of its nodes was rendered anew.

Several collectors sharing a journal each list only their own nodes: a node whose stream ended
here and that a live peer now holds (``held_elsewhere``) leaves this collector's shards at once,
before the liveness check forgets it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from isal import igzip

from collector.export.node_text import NODE_FAMILIES, NodeLines
from collector.model.node_states import NodeFlags, node_state

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from collector.export.catalog import MetricSpec
    from collector.model.fleet import FleetModel
    from collector.model.state import NodeState

# Samples one shard target may carry, at most (Prometheus' sample_limit goes above it).
SHARD_SAMPLES: Final = 4000
RENDER_INTERVAL_S: Final = 5.0
# The shards are made again from the fleet's names at once when a node came or went, and at least
# this often (a node a peer took is noticed so), not on every scrape: that is O(nodes) each time.
RESYNC_S: Final = 1.0
# gzip level: 1 costs a tenth of 9 (the default of gzip.compress) for 5.1 % of the text instead
# of 3.9 % (a 1,024-node fleet's exposition). ISA-L's deflate (isal) at level 1 takes a fifth of
# zlib's CPU at level 1 for the same size (docs/decisions.md); any gzip reader reads it.
GZIP_LEVEL: Final = 1
TEXT: Final = "text"
OPENMETRICS: Final = "openmetrics"


def help_text(doc: str, *, openmetrics: bool) -> str:
    """A HELP line's text, escaped as each format wants."""
    text = doc.replace("\\", "\\\\").replace("\n", "\\n")
    return text.replace('"', '\\"') if openmetrics else text


def header(spec: MetricSpec, *, openmetrics: bool) -> bytes:
    """A family's HELP and TYPE lines (OpenMetrics names a counter without ``_total``)."""
    name = spec.name
    if openmetrics and spec.kind == "counter":
        name = name.removesuffix("_total")
    doc = help_text(spec.help, openmetrics=openmetrics)
    return f"# HELP {name} {doc}\n# TYPE {name} {spec.kind}\n".encode()


_HEADERS: Final = {
    fmt: tuple(header(s, openmetrics=fmt == OPENMETRICS) for s in NODE_FAMILIES)
    for fmt in (TEXT, OPENMETRICS)
}


def join_families(nodes: list[tuple[bytes, ...]], fmt: str) -> bytes:
    """The nodes' pieces, family by family, each family under its HELP and TYPE once."""
    out: list[bytes] = []
    for i, head in enumerate(_HEADERS[fmt]):
        out.append(head)
        out.extend(pieces[i] for pieces in nodes)
    return b"".join(out)


@dataclass(slots=True)
class _NodeText:
    changed: int
    urgent: int
    state: str
    at: float
    pieces: tuple[bytes, ...]


@dataclass(slots=True)
class _ShardBody:
    key: tuple[int, ...]
    bodies: dict[tuple[str, bool], bytes] = field(default_factory=dict)


class ShardPlan:
    """Which shard each node is in: stable while the node stays, bounded in size."""

    def __init__(self, nodes_per_shard: int) -> None:
        """Shards of at most ``nodes_per_shard`` nodes."""
        if nodes_per_shard < 1:
            msg = f"a shard must hold at least one node, not {nodes_per_shard}"
            raise ValueError(msg)
        self.nodes_per_shard = nodes_per_shard
        self._where: dict[str, int] = {}
        self._shards: list[list[str]] = []

    def sync(self, names: Iterable[str]) -> None:
        """Take the fleet's current node names: those gone leave, new ones (sorted) join."""
        now = set(names)
        for name in [n for n in self._where if n not in now]:
            self._shards[self._where.pop(name)].remove(name)
        free = 0
        for name in sorted(now - self._where.keys()):
            while free < len(self._shards) and len(self._shards[free]) >= self.nodes_per_shard:
                free += 1
            if free == len(self._shards):
                self._shards.append([])
            self._shards[free].append(name)
            self._where[name] = free

    def shards(self) -> list[int]:
        """The shards that hold a node."""
        return [i for i, names in enumerate(self._shards) if names]

    def nodes(self, shard: int) -> list[str]:
        """The nodes of ``shard`` (none for one that does not exist)."""
        return list(self._shards[shard]) if 0 <= shard < len(self._shards) else []

    def holds(self, name: str) -> bool:
        """Whether ``name`` is in a shard."""
        return name in self._where

    def shard_of(self, name: str) -> int | None:
        """The shard ``name`` is in, or None."""
        return self._where.get(name)


class NodeExposition:
    """Every node's series as exposition text, kept between scrapes, whole or shard by shard."""

    def __init__(  # noqa: PLR0913 - what it reads and its three knobs
        self,
        fleet: FleetModel,
        *,
        monotonic: Callable[[], float],
        flags: Callable[[], NodeFlags] = NodeFlags,
        xid_class: Callable[[int], str] | None = None,
        render_interval_s: float = RENDER_INTERVAL_S,
        nodes_per_shard: int = 6,
        held_elsewhere: Callable[[], frozenset[str]] | None = None,
    ) -> None:
        """Render from ``fleet``; ``flags`` and ``xid_class`` as for ``FleetCollector``.

        ``render_interval_s``: how long a node's text may be served while only its samples
        changed; ``held_elsewhere``: the nodes a live peer collector holds now.
        """
        self._fleet = fleet
        self._monotonic = monotonic
        self._flags = flags
        self._xid_class = xid_class or _unknown_class
        self.render_interval_s = render_interval_s
        self._held_elsewhere = held_elsewhere
        self._lock = threading.Lock()
        self._texts: dict[str, _NodeText] = {}
        self._lines: dict[str, NodeLines] = {}
        self._bodies: dict[int, _ShardBody] = {}
        self.plan = ShardPlan(nodes_per_shard)
        self._synced: tuple[int, float] | None = None  # (the fleet's membership, when)
        self.renders = 0  # node texts rendered, for tests and the benchmark

    def _names(self) -> list[str]:
        names = self._fleet.node_names()
        elsewhere = self._held_elsewhere() if self._held_elsewhere is not None else frozenset()
        if not elsewhere:
            return names
        # A node whose stream is open here is ours whatever the journal says.
        return [n for n in names if n not in elsewhere or self._connected_here(n)]

    def _connected_here(self, name: str) -> bool:
        return bool(self._fleet.read_node(name, lambda node, _c, _u: node.connected))

    def _sync(self) -> None:
        """Take the fleet's names into the shards if a node came or went, or a second passed."""
        membership, now = self._fleet.membership, self._monotonic()
        if (
            self._synced is None
            or self._synced[0] != membership
            or now - self._synced[1] >= RESYNC_S
        ):
            self.plan.sync(self._names())
            self._synced = (membership, now)
            for gone in [n for n in self._texts if not self.plan.holds(n)]:
                del self._texts[gone]  # a node that left: its kept text goes with it
                self._lines.pop(gone, None)
            for shard in [s for s in self._bodies if not self.plan.nodes(s)]:
                del self._bodies[shard]

    def shards(self) -> list[int]:
        """The shards holding a node now."""
        with self._lock:
            self._sync()
            return self.plan.shards()

    def _text(self, name: str, flags: NodeFlags, now: float) -> _NodeText | None:
        """The node's text, rendered anew if it must be (call with ``_lock`` held)."""
        old = self._texts.get(name)

        def read(node: NodeState, changed: int, urgent: int) -> _NodeText:
            state = node_state(node, flags)
            if old is not None and (
                old.urgent == urgent
                and old.state == state
                and (old.changed == changed or now - old.at < self.render_interval_s)
            ):
                return old
            self.renders += 1
            lines = self._lines.get(name)
            if lines is None:
                lines = self._lines[name] = NodeLines()
            pieces = lines.render(node, state, self._xid_class)
            return _NodeText(changed, urgent, state, now, pieces)

        text = self._fleet.read_node(name, read)
        if text is None:
            self._texts.pop(name, None)
            self._lines.pop(name, None)
        else:
            self._texts[name] = text
        return text

    def _pieces(self, names: list[str]) -> list[_NodeText]:
        flags, now = self._flags(), self._monotonic()
        texts = [self._text(name, flags, now) for name in names]
        return [t for t in texts if t is not None]

    def everything(self, fmt: str) -> bytes:
        """Every node's series (for the whole ``/metrics``), family by family."""
        with self._lock:
            names = self._names()
            self.plan.sync(names)
            texts = self._pieces(names)
            for gone in self._texts.keys() - set(names):
                del self._texts[gone]
                self._lines.pop(gone, None)
        return join_families([t.pieces for t in texts], fmt)

    def shard(self, shard: int, fmt: str, *, gzipped: bool) -> bytes | None:
        """One shard's series (None for a shard that holds no node), gzipped if asked.

        The body is kept while none of the shard's nodes was rendered anew, for the next scrape
        of it (a second Prometheus, or one scraping faster than nodes are rendered).
        """
        with self._lock:
            self._sync()
            names = self.plan.nodes(shard)
            if not names:
                self._bodies.pop(shard, None)
                return None
            texts = self._pieces(names)
            key = tuple(id(t.pieces) for t in texts)
            kept = self._bodies.get(shard)
            if kept is None or kept.key != key:
                kept = self._bodies[shard] = _ShardBody(key)
            body = kept.bodies.get((fmt, gzipped))
            if body is None:  # only what was asked for is kept (Prometheus: the gzip)
                body = join_families([t.pieces for t in texts], fmt)
                if fmt == OPENMETRICS:
                    body += b"# EOF\n"
                if gzipped:
                    body = gzip_body(body)
                kept.bodies[fmt, gzipped] = body
            return body


def gzip_body(body: bytes) -> bytes:
    """``body`` as a gzip member (no name, mtime 0), compressed by ISA-L at ``GZIP_LEVEL``."""
    return igzip.compress(body, GZIP_LEVEL, mtime=0)


def _unknown_class(_xid: int) -> str:
    return "unknown"
