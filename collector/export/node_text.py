"""One node's series as exposition text, written straight from the fleet model.

The same series :class:`collector.export.fleet.FleetCollector` yields through prometheus_client,
without its per-sample objects: each label set is formatted once per node and each sample is one
line appended to its family's list. :func:`render_node` returns one ``bytes`` piece per family of
:data:`NODE_FAMILIES` (empty where the node has no sample of it), so that pieces of many nodes can
be joined family by family under one HELP and TYPE (:mod:`collector.export.exposition`).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Final

from collector.export.catalog import NODE_STATES, MetricSpec, by_name
from collector.export.fleet import (
    AGENT_SIGNALS,
    AGENT_SOURCES,
    FLEET_FAMILIES,
    GPU_GAUGES,
    GPU_LABELLED,
    NVLINK_ERRORS,
    PORT_COUNTERS,
    PORT_ERRORS,
    PORT_HW_COUNTERS,
    THROTTLE_REASONS,
    not_here,
)
from fleetwatch.signals import REFUSAL_REASONS, REFUSED_SIGNAL_PREFIX

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from collector.model.state import GpuState, NodeState, PortState
    from fleetwatch.model import SampleValue

# The per-node families, in the order a scrape gives them (the catalog's).
NODE_FAMILIES: Final[tuple[MetricSpec, ...]] = tuple(
    by_name()[n] for n in FLEET_FAMILIES if not not_here(n)
)
_INDEX: Final = {spec.name: i for i, spec in enumerate(NODE_FAMILIES)}


def escape(value: str) -> str:
    """A label value as the exposition formats write it (backslash, quote, newline escaped)."""
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return value


def number(value: float) -> str:
    """A sample value as Prometheus reads it (``+Inf``, ``-Inf``, ``NaN`` spelled its way)."""
    text = repr(value)
    if text[-1] in "fn":  # inf, -inf, nan: every finite repr ends in a digit
        return {"inf": "+Inf", "-inf": "-Inf"}.get(text, "NaN")
    return text


def _spelled(text: str) -> str:
    """``text`` with Python's spelling of the non-finite values replaced by Prometheus'."""
    if " inf\n" in text or " -inf\n" in text or " nan\n" in text:
        text = text.replace(" inf\n", " +Inf\n").replace(" -inf\n", " -Inf\n")
        text = text.replace(" nan\n", " NaN\n")
    return text


def _rows(rows: Iterable[tuple[str, str]]) -> tuple[tuple[int, str, str], ...]:
    return tuple((_INDEX[metric], metric, signal) for metric, signal in rows)


_AGENT_ROWS: Final = _rows(AGENT_SIGNALS)
_PORT_ROWS: Final = _rows(PORT_COUNTERS)
_GPU_GAUGE_ROWS: Final = tuple(
    (_INDEX[metric], metric, signal, scale) for metric, signal, scale in GPU_GAUGES
)
_GPU_LABELLED_ROWS: Final = tuple(
    (_INDEX[metric], f'{metric}{{{{{{}},{by_name()[metric].labels[-1]}="{kind}"}}}} ', signal)
    for metric, rows in GPU_LABELLED
    for kind, signal in rows
)
_PORT_ERROR_ROWS: Final = tuple(
    (f'fleetwatch_ib_port_errors_total{{{{{{}},type="{kind}"}}}} ', signal)
    for kind, signal in PORT_ERRORS
)
_PORT_HW_ROWS: Final = tuple(
    (f'fleetwatch_ib_port_hw_events_total{{{{{{}},counter="{c}"}}}} ', f"ib_hw_{c}")
    for c in PORT_HW_COUNTERS
)
_NVLINK_SIGNALS: Final = tuple(signal for _, signal in NVLINK_ERRORS)


def _i(name: str) -> int:
    return _INDEX[name]


_UP, _CONNECTED, _SEEN, _STATE, _INFO, _EVENTS = (
    _i("fleetwatch_node_up"),
    _i("fleetwatch_node_connected"),
    _i("fleetwatch_node_last_seen_timestamp_seconds"),
    _i("fleetwatch_node_state"),
    _i("fleetwatch_node_info"),
    _i("fleetwatch_node_events_total"),
)
_SOURCE_ERRORS, _REFUSED = (
    _i("fleetwatch_agent_source_errors_total"),
    _i("fleetwatch_agent_job_reports_refused_total"),
)
_GPU_INFO, _PRESENT, _NVLINKS, _NVLINKS_DOWN, _REPLAYS, _XIDS, _THROTTLED, _NVLINK_ERRORS = (
    _i("fleetwatch_gpu_info"),
    _i("fleetwatch_gpu_present"),
    _i("fleetwatch_gpu_nvlinks"),
    _i("fleetwatch_gpu_nvlinks_down"),
    _i("fleetwatch_gpu_pcie_replays_total"),
    _i("fleetwatch_gpu_xid_errors_total"),
    _i("fleetwatch_gpu_clocks_throttled"),
    _i("fleetwatch_gpu_nvlink_errors_total"),
)
_PORT_UP, _PORT_STATE, _PORT_ERRORS, _PORT_HW = (
    _i("fleetwatch_ib_port_up"),
    _i("fleetwatch_ib_port_state"),
    _i("fleetwatch_ib_port_errors_total"),
    _i("fleetwatch_ib_port_hw_events_total"),
)


# What one sample line is made of: (family index, which of the node's signal dicts, signal,
# scale, the line up to its value). Built once per node shape, see NodeLines.
Row = tuple[int, int, str, float, str]


def _signal_rows(lbl: str, di: int, rows: Iterable[tuple[int, str, str, float]]) -> list[Row]:
    return [(i, di, signal, scale, f"{prefix}{{{lbl}}} ") for i, prefix, signal, scale in rows]


def _labelled_rows(lbl: str, di: int, rows: Iterable[tuple[int, str, str]]) -> list[Row]:
    return [(i, di, signal, 1.0, line.format(lbl)) for i, line, signal in rows]


_NODE_SIGNAL_ROWS: Final = tuple((i, metric, signal, 1.0) for i, metric, signal in _AGENT_ROWS)
_NODE_LABELLED_ROWS: Final = tuple(
    (
        _SOURCE_ERRORS,
        f'fleetwatch_agent_source_errors_total{{{{{{}},source="{source}"}}}} ',
        f"agent_source_errors_{source}",
    )
    for source in AGENT_SOURCES
) + tuple(
    (
        _REFUSED,
        f'fleetwatch_agent_job_reports_refused_total{{{{{{}},reason="{reason}"}}}} ',
        REFUSED_SIGNAL_PREFIX + reason,
    )
    for reason in REFUSAL_REASONS
)
_GPU_SIGNAL_ROWS: Final = _GPU_GAUGE_ROWS
_PORT_SIGNAL_ROWS: Final = tuple((i, metric, signal, 1.0) for i, metric, signal in _PORT_ROWS)
_PORT_LABELLED_ROWS: Final = tuple(
    (_PORT_ERRORS, line, signal) for line, signal in _PORT_ERROR_ROWS
) + tuple((_PORT_HW, line, signal) for line, signal in _PORT_HW_ROWS)


def render_node(node: NodeState, state: str, xid_class: Callable[[int], str]) -> tuple[bytes, ...]:
    """Every series of ``node`` (in ``state``), one piece per family of :data:`NODE_FAMILIES`."""
    return NodeLines().render(node, state, xid_class)


# (family index, line) pairs: the lines of one source that are not plain samples.
Pairs = tuple[tuple[int, str], ...]
# A source's lines as they were last made: (what they were made of, lines by family index).
Kept = tuple[tuple[object, ...], dict[int, tuple[str, ...]]]

_NODE_LIVE: Final = frozenset({_UP, _CONNECTED, _SEEN})
_NODE_REST: Final = frozenset({_STATE, _INFO, _EVENTS})
_GPU_FAMILIES: Final = frozenset(
    {_GPU_INFO, _PRESENT, _NVLINKS, _NVLINKS_DOWN, _REPLAYS, _XIDS, _THROTTLED, _NVLINK_ERRORS}
)
_PORT_FAMILIES: Final = frozenset({_PORT_UP, _PORT_STATE})


def _by_family(pairs: Pairs) -> dict[int, tuple[str, ...]]:
    out: dict[int, list[str]] = {}
    for i, line in pairs:
        out.setdefault(i, []).append(line)
    return {i: tuple(lines) for i, lines in out.items()}


class NodeLines:
    """One node's text, kept between renders, redone only where values changed.

    A sample line is formatted again only when its value changed (formatting a float is most of
    what a line costs), a family's piece encoded again only when one of its lines changed.

    The lines drawn from the node's signal dicts (its agent's, each GPU's, each port's) follow
    a plan made from the signals present, made again when a signal appears or the node's GPUs
    or ports change. The other lines (states, identities, links down, NVLink error sums, Xids,
    throttle flags) come from sources (the node, each GPU, each port), each kept with what it
    was made of and made again when that changes.
    """

    __slots__ = (
        "_family_rows",
        "_family_sources",
        "_group_values",
        "_groups",
        "_lines",
        "_pieces",
        "_rows",
        "_shape",
        "_sources",
        "_values",
    )

    def __init__(self) -> None:
        """No plan yet: the first render makes one."""
        self._shape: tuple[object, ...] | None = None
        self._rows: list[Row] = []
        self._values: list[object] = []
        self._lines: list[str | None] = []
        # The rows by signal dict: (dict index, its signals, their rows), and the values each
        # dict gave last time; the rows of each family.
        self._groups: tuple[tuple[int, tuple[str, ...], tuple[int, ...]], ...] = ()
        self._group_values: list[tuple[object, ...] | None] = []
        self._family_rows: tuple[tuple[int, ...], ...] = ()
        # The sources: the node's live lines, its other lines, each GPU's, each port's; and
        # which sources write each family. (Summing 18 links' error counters at every render
        # was a fifth of it.)
        self._sources: list[Kept | None] = []
        self._family_sources: tuple[tuple[int, ...], ...] = ()
        # A tuple of bytes: not tracked by the garbage collector, so the kept text adds few
        # objects for CPython's collections to walk.
        self._pieces: tuple[bytes, ...] = ()

    def _plan(
        self, lbl: str, gpus: list[tuple[str, GpuState]], ports: list[tuple[str, PortState]]
    ) -> None:
        rows = _signal_rows(lbl, 0, _NODE_SIGNAL_ROWS) + _labelled_rows(lbl, 0, _NODE_LABELLED_ROWS)
        for di, (glbl, _) in enumerate(gpus, start=1):
            rows += _signal_rows(glbl, di, _GPU_SIGNAL_ROWS)
            rows += _labelled_rows(glbl, di, _GPU_LABELLED_ROWS)
        for di, (plbl, _) in enumerate(ports, start=1 + len(gpus)):
            rows += _signal_rows(plbl, di, _PORT_SIGNAL_ROWS)
            rows += _labelled_rows(plbl, di, _PORT_LABELLED_ROWS)
        self._rows = rows
        self._values = [None] * len(rows)
        self._lines = [None] * len(rows)
        groups: dict[int, list[int]] = {}
        family_rows: list[list[int]] = [[] for _ in NODE_FAMILIES]
        for k, (i, di, _, _, _) in enumerate(rows):
            groups.setdefault(di, []).append(k)
            family_rows[i].append(k)
        self._groups = tuple(
            (di, tuple(rows[k][2] for k in ks), tuple(ks)) for di, ks in sorted(groups.items())
        )
        self._group_values = [None] * len(self._groups)
        self._family_rows = tuple(tuple(ks) for ks in family_rows)
        gpu_sources = tuple(range(2, 2 + len(gpus)))
        port_sources = tuple(range(2 + len(gpus), 2 + len(gpus) + len(ports)))
        self._family_sources = tuple(
            (0,)
            if i in _NODE_LIVE
            else (1,)
            if i in _NODE_REST
            else gpu_sources
            if i in _GPU_FAMILIES
            else port_sources
            if i in _PORT_FAMILIES
            else ()
            for i in range(len(NODE_FAMILIES))
        )
        self._sources = [None] * (2 + len(gpus) + len(ports))
        self._pieces = ()

    def render(
        self, node: NodeState, state: str, xid_class: Callable[[int], str]
    ) -> tuple[bytes, ...]:
        """Every series of ``node`` (in ``state``), one piece per family."""
        lbl = f'node="{escape(node.name)}"'
        gpus = [
            (f'{lbl},gpu="{gpu.index}"', gpu)
            for gpu in sorted(node.gpus.values(), key=lambda g: g.index)
        ]
        ports = [
            (f'{lbl},device="{escape(port.device)}",port="{port.port}"', port)
            for port in node.ports.values()
        ]
        dicts = [node.signals, *(g.signals for _, g in gpus), *(p.signals for _, p in ports)]
        shape = (lbl, tuple(node.gpus), tuple(node.ports), tuple(len(d) for d in dicts))
        if shape != self._shape:
            self._plan(lbl, gpus, ports)
            self._shape = shape
        changed = self._changed_sources(
            lbl, node=node, state=state, gpus=gpus, ports=ports, xid_class=xid_class
        )
        changed |= self._changed_families(dicts)
        if self._pieces:
            pieces = list(self._pieces)
        else:  # a new plan: every family
            pieces = [b""] * len(NODE_FAMILIES)
            changed = set(range(len(NODE_FAMILIES)))
        sources, row_lines = self._sources, self._lines
        for i in changed:
            lines = [
                line
                for s in self._family_sources[i]
                if (kept := sources[s]) is not None
                for line in kept[1].get(i, ())
            ]
            lines += [line for k in self._family_rows[i] if (line := row_lines[k])]
            pieces[i] = _spelled("".join(lines)).encode() if lines else b""
        self._pieces = tuple(pieces)
        return self._pieces

    def _changed_sources(  # noqa: PLR0913 - the node's parts, as render has them
        self,
        lbl: str,
        *,
        node: NodeState,
        state: str,
        gpus: list[tuple[str, GpuState]],
        ports: list[tuple[str, PortState]],
        xid_class: Callable[[int], str],
    ) -> set[int]:
        """Make again each source whose inputs changed; return the families whose lines did."""
        made: list[tuple[tuple[object, ...], Callable[[], Pairs]]] = [
            (
                (node.reachable, node.connected, node.last_seen_unix),
                partial(_node_live, lbl, node),
            ),
            (
                (state, node.agent_version, node.driver_version, tuple(node.events.items())),
                partial(_node_rest, lbl, node, state),
            ),
        ]
        made.extend((_gpu_key(gpu), partial(_gpu, glbl, gpu, xid_class)) for glbl, gpu in gpus)
        made.extend(
            ((port.up, port.state, port.phys_state), partial(_port, plbl, port))
            for plbl, port in ports
        )
        changed: set[int] = set()
        sources = self._sources
        for s, (key, make) in enumerate(made):
            old = sources[s]
            if old is not None and old[0] == key:
                continue
            by_family = _by_family(make())
            if old is None:
                changed.update(by_family)
            elif old[1] != by_family:
                changed.update(old[1].keys() | by_family.keys())
            sources[s] = (key, by_family)
        return changed

    def _changed_families(self, dicts: list[dict[str, SampleValue]]) -> set[int]:
        """Write again the lines of the samples whose value changed; return their families.

        A signal dict whose values are all as last time (most of a node's at any render: a
        Report changes a few dozen of its five hundred values) costs one comparison.
        """
        rows, values, lines = self._rows, self._values, self._lines
        group_values = self._group_values
        changed: set[int] = set()
        for g, (di, signals, ks) in enumerate(self._groups):
            now = tuple(map(dicts[di].get, signals))
            before = group_values[g]
            if now == before:
                continue
            group_values[g] = now
            # The model keeps a value's object until a new value comes: most are the same object.
            moved = (
                range(len(now))
                if before is None
                else [j for j, (a, b) in enumerate(zip(now, before, strict=True)) if a is not b]
            )
            for j in moved:
                k, value = ks[j], now[j]
                if value == values[k] and value is not None:
                    continue
                i, _, _, scale, prefix = rows[k]
                values[k] = value
                line = (
                    None
                    if value is None or value.__class__ is str
                    else f"{prefix}{float(value) * scale!r}\n"
                )
                if line != lines[k]:
                    lines[k] = line
                    changed.add(i)
        return changed


def _node_live(lbl: str, node: NodeState) -> Pairs:
    return (
        (_UP, f"fleetwatch_node_up{{{lbl}}} {float(node.reachable)!r}\n"),
        (_CONNECTED, f"fleetwatch_node_connected{{{lbl}}} {float(node.connected)!r}\n"),
        (
            _SEEN,
            (
                f"fleetwatch_node_last_seen_timestamp_seconds{{{lbl}}} "
                f"{float(node.last_seen_unix)!r}\n"
            ),
        ),
    )


def _node_rest(lbl: str, node: NodeState, state: str) -> Pairs:
    out = [
        (_STATE, f'fleetwatch_node_state{{{lbl},state="{name}"}} {float(name == state)!r}\n')
        for name in NODE_STATES
    ]
    out.append(
        (
            _INFO,
            (
                f'fleetwatch_node_info{{{lbl},agent_version="{escape(node.agent_version)}",'
                f'driver_version="{escape(node.driver_version)}"}} 1.0\n'
            ),
        )
    )
    out.extend(
        (
            _EVENTS,
            f'fleetwatch_node_events_total{{{lbl},kind="{escape(kind)}"}} {float(count)!r}\n',
        )
        for kind, count in sorted(node.events.items())
    )
    return tuple(out)


def _gpu_key(gpu: GpuState) -> tuple[object, ...]:
    """Everything :func:`_gpu` reads of ``gpu``: its lines are written again when this changes."""
    return (
        gpu.uuid,
        gpu.pci_bus_id,
        gpu.model,
        gpu.present,
        gpu.nvlink_count,
        gpu.link_generation,  # the links' states and error counters
        gpu.pcie_replay_count,
        tuple(gpu.xid_counts.items()),
        gpu.signals.get("clock_event_reasons"),
    )


def _gpu(lbl: str, gpu: GpuState, xid_class: Callable[[int], str]) -> tuple[tuple[int, str], ...]:
    """The GPU's lines that are not plain samples: (family index, line)."""
    out = [
        (
            _GPU_INFO,
            (
                f'fleetwatch_gpu_info{{{lbl},uuid="{escape(gpu.uuid)}",'
                f'pci_bus_id="{escape(gpu.pci_bus_id)}",model="{escape(gpu.model)}"}} 1.0\n'
            ),
        ),
        (_PRESENT, f"fleetwatch_gpu_present{{{lbl}}} {float(gpu.present)!r}\n"),
        (_NVLINKS, f"fleetwatch_gpu_nvlinks{{{lbl}}} {float(gpu.nvlink_count)!r}\n"),
        (_NVLINKS_DOWN, f"fleetwatch_gpu_nvlinks_down{{{lbl}}} {float(gpu.nvlinks_down)!r}\n"),
    ]
    if gpu.pcie_replay_count is not None:
        out.append(
            (
                _REPLAYS,
                f"fleetwatch_gpu_pcie_replays_total{{{lbl}}} {float(gpu.pcie_replay_count)!r}\n",
            )
        )
    out.extend(
        (
            _XIDS,
            (
                f'fleetwatch_gpu_xid_errors_total{{{lbl},xid="{xid or "other"}",'
                f'class="{escape(xid_class(xid)) if xid else "other"}"}} {float(count)!r}\n'
            ),
        )
        for xid, count in sorted(gpu.xid_counts.items())
    )
    reasons = gpu.signals.get("clock_event_reasons")
    if reasons is not None and reasons.__class__ is not str:
        bits = int(reasons)
        out.extend(
            (
                _THROTTLED,
                (
                    f'fleetwatch_gpu_clocks_throttled{{{lbl},reason="{reason}"}} '
                    f"{float(bool(bits & mask))!r}\n"
                ),
            )
            for reason, mask in THROTTLE_REASONS
        )
    out.extend((_NVLINK_ERRORS, line) for line in _nvlink_errors(lbl, gpu))
    return tuple(out)


def _nvlink_errors(lbl: str, gpu: GpuState) -> list[str]:
    """The GPU's NVLink error counters, summed over its links."""
    links = gpu.link_signals.values()
    out = []
    for kind, signal in NVLINK_ERRORS:
        values = [v for d in links if (v := d.get(signal)) is not None and v.__class__ is not str]
        if values:
            out.append(
                f'fleetwatch_gpu_nvlink_errors_total{{{lbl},type="{kind}"}} '
                f"{float(sum(values))!r}\n"  # type: ignore[arg-type]
            )
    return out


def _port(lbl: str, port: PortState) -> Pairs:
    return (
        (_PORT_UP, f"fleetwatch_ib_port_up{{{lbl}}} {float(port.up)!r}\n"),
        (
            _PORT_STATE,
            (
                f'fleetwatch_ib_port_state{{{lbl},state="{escape(port.state)}",'
                f'phys_state="{escape(port.phys_state)}"}} 1.0\n'
            ),
        ),
    )
