"""The data a condition is evaluated on: a target's CEL maps, its window functions, the fleet.

A target's variables (``node``, ``gpu``, ``link``, ``port``, ``fleet``) are plain maps built
from the fleet model; its window functions (``events()``, ``xids()``, ``increase()``,
``rises()``, ``share_of_ports()``) read the rules' history through a :class:`WindowContext`.
The ``fleet`` counts are tallied once per regular tick, in parts (:class:`FleetTally`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol

from collector.model.recent_faults import NO_FAULTS

if TYPE_CHECKING:
    from collections.abc import Callable, Generator, Hashable, Mapping

    from collector.model.fleet import FleetModel
    from collector.model.history import History
    from collector.model.state import GpuState, NodeState, PortState
    from rules.xid_catalog import XidCatalog

# Nodes between two parts of a regular tick's fleet tally (the loop may take a turn between).
TALLY_CHUNK: Final = 256
# Xids whose xids() entries are kept made: more than any catalog lists (a node may send any).
MAX_XID_ENTRIES: Final = 4096


class XidEntries:
    """What ``xids()`` lists for each Xid: its catalog entry as a map, made once per catalog."""

    def __init__(self) -> None:
        """Start with none made."""
        self._of: XidCatalog | None = None  # the catalog the entries were made from
        self._entries: dict[int, dict[str, Any]] = {}

    def entry(self, catalog: XidCatalog, xid: int) -> dict[str, Any]:
        """The entry of ``xid`` in ``catalog`` (those of an earlier catalog are dropped)."""
        if self._of is not catalog:
            self._of, self._entries = catalog, {}
        found = self._entries.get(xid)
        if found is not None:
            return found
        entry = catalog.get(xid)
        made = {
            "xid": xid,
            "class": entry.xid_class if entry else "unknown",
            "action": entry.action if entry else "UNKNOWN",
            "fatal": entry.fatal if entry else False,
        }
        if len(self._entries) < MAX_XID_ENTRIES:
            self._entries[xid] = made
        return made


def _ports_over(nodes: list[NodeState], signal: str, above: float) -> int:
    """How many of the nodes' IB ports have ``signal`` over ``above``.

    A plain loop: every port of the fleet, every regular tick (a method call per port made it a
    third of a 2,048-node collector's rules time).
    """
    hot = 0
    for node in nodes:
        for port in node.ports.values():
            value = port.signals.get(signal)
            if value is not None and not isinstance(value, str) and value > above:
                hot += 1
    return hot


class FleetTally:
    """The ``fleet`` counts the model gives, and each ``share_of_ports()`` asked for."""

    def __init__(self, fleet: FleetModel) -> None:
        """Count ``fleet``; nothing is counted until the first tick."""
        self.fleet = fleet
        self.counts: dict[str, Any] | None = None  # the counts of the last regular tick
        # share_of_ports() of the last regular tick, by (signal, above); and the pairs asked for
        self.shares: dict[tuple[str, float], float] = {}
        self._asked: set[tuple[str, float]] = set()

    def parts(self) -> Generator[list[Any]]:
        """Tally the fleet in parts (:meth:`tally`) and keep the counts and shares.

        Each part yields an empty list: no outcomes, a turn for the loop.
        """
        self.counts, self.shares = yield from self.tally()

    def counts_now(self) -> dict[str, Any]:
        """The counts, at once, without keeping them."""
        tally = self.tally()
        while True:
            try:
                next(tally)
            except StopIteration as done:
                counts: dict[str, Any] = done.value[0]
                return counts

    def tally(
        self,
    ) -> Generator[list[Any], None, tuple[dict[str, Any], dict[tuple[str, float], float]]]:
        """The ``fleet`` counts, and each ``share_of_ports`` asked for, in parts of nodes.

        An empty part after every :data:`TALLY_CHUNK` nodes lets the incident service give the
        loop a turn: at 4,096 nodes the counts took 10 ms, and a share (every port of the fleet)
        20 to 40 ms, each as one piece of every regular tick with no stream read meanwhile.
        """
        nodes = list(self.fleet.view().values())
        asked = sorted(self._asked)
        hot = [0] * len(asked)
        reachable = gpus = ports = up = 0
        for start in range(0, len(nodes), TALLY_CHUNK):
            chunk = nodes[start : start + TALLY_CHUNK]
            for node in chunk:
                reachable += node.reachable
                gpus += len(node.gpus)
                ports += len(node.ports)
                for port in node.ports.values():
                    if port.state == "ACTIVE":
                        up += 1
            for i, (signal, above) in enumerate(asked):
                hot[i] += _ports_over(chunk, signal, above)
            yield []
        counts = {
            "nodes": len(nodes),
            "nodes_reachable": reachable,
            "gpus": gpus,
            "ib_ports": ports,
            "ib_ports_up": up,
        }
        return counts, {pair: hot[i] / ports if ports else 0.0 for i, pair in enumerate(asked)}

    def share_now(self, signal: str, above: float) -> float:
        """The share of the fleet's IB ports whose ``signal`` is over ``above``, counted now.

        The pair is counted in every regular tick's tally from now on.
        """
        self._asked.add((signal, above))
        nodes = list(self.fleet.view().values())
        total = sum(len(node.ports) for node in nodes)
        return _ports_over(nodes, signal, above) / total if total else 0.0


class WindowSource(Protocol):
    """What the window functions read: the rules' history, the Xid catalog, the fleet tally."""

    @property
    def history(self) -> History:
        """The events and counter samples of every target's windows."""
        ...

    @property
    def catalog(self) -> XidCatalog:
        """The catalog ``xids()`` names each Xid from."""
        ...

    @property
    def entries(self) -> XidEntries:
        """The catalog's entries as ``xids()`` lists them."""
        ...

    @property
    def tally(self) -> FleetTally:
        """The fleet's counts and shares of the last regular tick."""
        ...


@dataclass(slots=True)
class WindowContext:
    """The window functions' view of one target."""

    source: WindowSource
    key: str
    now: float

    def events(self, kind: str, window_s: float) -> int:
        """Events of ``kind`` on the target in the last ``window_s`` seconds."""
        return self.source.history.events(self.key, kind, self.now - window_s)

    def xids(self, window_s: float) -> list[dict[str, Any]]:
        """The target's Xids in the last ``window_s`` seconds, with their catalog entries."""
        source = self.source
        entries, catalog = source.entries, source.catalog
        xids = source.history.xids(self.key, self.now - window_s)
        return [entries.entry(catalog, xid) for xid in xids]

    def xids_key(self, window_s: float) -> Hashable:
        """What a remembered answer over ``xids(window_s)`` is keyed by.

        This target's window as it stands (the same two numbers of another target say nothing
        of its Xids), and the catalog that names them.
        """
        version = self.source.history.xids_version(self.key, self.now - window_s)
        return id(self.source.catalog), self.key, *version

    def increase(self, signal: str, window_s: float) -> float:
        """How much the target's counter ``signal`` grew in the last ``window_s`` seconds."""
        return self.source.history.increase(self.key, signal, self.now - window_s, self.now)

    def rises(self, signal: str, window_s: float) -> int:
        """How many times the target's counter ``signal`` went up in the last ``window_s``."""
        return self.source.history.rises(self.key, signal, self.now - window_s, self.now)

    def share_of_ports(self, signal: str, above: float) -> float:
        """The share of the fleet's IB ports whose ``signal`` is over ``above``."""
        # Counted in the regular tick's fleet tally; a threshold asked for the first time is
        # counted now, and in the tally from the next tick on.
        tally = self.source.tally
        share = tally.shares.get((signal, above))
        if share is None:
            share = tally.share_now(signal, above)
        return share


class StillContext:
    """The window functions of a target whose windows hold nothing that moves: all zero.

    A target the history does not call :meth:`~collector.model.history.History.moving` has every
    event older than the event window and every counter step older than its signal's window.
    """

    def events(self, kind: str, window_s: float) -> int:
        """No events."""
        del kind, window_s
        return 0

    def xids(self, window_s: float) -> list[dict[str, Any]]:
        """No Xids."""
        del window_s
        return []

    def increase(self, signal: str, window_s: float) -> float:
        """No growth."""
        del signal, window_s
        return 0.0

    def rises(self, signal: str, window_s: float) -> int:
        """No rise."""
        del signal, window_s
        return 0

    def share_of_ports(self, signal: str, above: float) -> float:
        """No share."""
        del signal, above
        return 0.0


def node_map(node: NodeState, faults: Mapping[str, Any] = NO_FAULTS) -> dict[str, Any]:
    """The ``node`` variable; ``faults`` its recent remediations and episodes (a lemon's)."""
    return {
        "name": node.name,
        "reachable": node.reachable,
        "connected": node.connected,
        "gpus": len(node.gpus),
        "gpus_lost": sum(1 for g in node.gpus.values() if not g.present),
        "nvlinks_down": sum(g.nvlinks_down for g in node.gpus.values()),
        "ib_ports": len(node.ports),
        "ib_ports_down": sum(1 for p in node.ports.values() if p.state and not p.up),
        **faults,
        "signals": node.signals,
    }


def gpu_map(gpu: GpuState) -> dict[str, Any]:
    """The ``gpu`` variable."""
    return {
        "index": gpu.index,
        "uuid": gpu.uuid,
        "model": gpu.model,
        "pci_bus_id": gpu.pci_bus_id,
        "present": gpu.present,
        "nvlink_count": gpu.nvlink_count,
        "nvlinks_down": gpu.nvlinks_down,
        "signals": gpu.signals,
    }


def port_map(port: PortState) -> dict[str, Any]:
    """The ``port`` variable."""
    return {
        "device": port.device,
        "port": port.port,
        "state": port.state,
        "phys_state": port.phys_state,
        "up": port.up,
        "rate": port.rate,
        "signals": port.signals,
    }


def base_map(
    made: dict[str, dict[str, Any]],
    fleet: dict[str, Any],
    node: NodeState,
    faults: Callable[[str], Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The ``node`` and ``fleet`` variables every target of ``node`` has.

    ``made`` keeps each node's map for the tick, so it is built once however many targets read it.
    ``faults`` gives a node's recent remediations and episodes (None: none).
    """
    node_data = made.get(node.name)
    if node_data is None:
        counts = faults(node.name) if faults is not None else NO_FAULTS
        node_data = made[node.name] = node_map(node, counts)
    return {"node": node_data, "fleet": fleet}


def cel_view(data: dict[str, Any], words: frozenset[str], *, cut_signals: bool) -> dict[str, Any]:
    """The part of ``data`` a condition with ``words`` can read.

    CEL converts every value it is handed, read or not: a GPU rule got the node's, the GPU's
    and the fleet's maps (about eighty signals) for the two or three it reads, and the
    conversion was half of its evaluation. Variables the condition does not name are left out,
    and, when ``cut_signals``, each ``signals`` map keeps only the names the condition says.
    """
    out: dict[str, Any] = {}
    for name, value in data.items():
        if name not in words:
            continue
        if cut_signals and isinstance(value, dict) and "signals" in value:
            signals = value["signals"]
            out[name] = {**value, "signals": {k: signals[k] for k in words if k in signals}}
        else:
            out[name] = value
    return out
