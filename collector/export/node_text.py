"""One node's series as exposition text, written straight from the fleet model.

The same series :class:`collector.export.fleet.FleetCollector` yields through prometheus_client,
without its per-sample objects: each label set is formatted once per node and each sample is one
line appended to its family's list. :func:`render_node` returns one ``bytes`` piece per family of
:data:`NODE_FAMILIES` (empty where the node has no sample of it), so that pieces of many nodes can
be joined family by family under one HELP and TYPE (:mod:`collector.export.exposition`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from agent.job_report import REFUSAL_REASONS, REFUSED_SIGNAL_PREFIX
from collector.export.catalog import BY_NAME, NODE_STATES, MetricSpec
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

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from collector.model.state import GpuState, NodeState, PortState

# The per-node families, in the order a scrape gives them (the catalog's).
NODE_FAMILIES: Final[tuple[MetricSpec, ...]] = tuple(
    BY_NAME[n] for n in FLEET_FAMILIES if not not_here(n)
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
    (_INDEX[metric], f'{metric}{{{{{{}},{BY_NAME[metric].labels[-1]}="{kind}"}}}} ', signal)
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


class NodeLines:
    """One node's text, kept between renders, redone only where values changed.

    A sample line is formatted again only when its value changed (formatting a float is most of
    what a line costs), a family's piece encoded again only when one of its lines changed.

    The lines drawn from the node's signal dicts (its agent's, each GPU's, each port's) follow
    a plan made from the signals present, made again when a signal appears or the node's GPUs
    or ports change; the others (states, identities, event counts, sums over NVLinks) are
    written each time.
    """

    __slots__ = ("_lines", "_pieces", "_plain", "_rows", "_shape", "_values")

    def __init__(self) -> None:
        """No plan yet: the first render makes one."""
        self._shape: tuple[object, ...] | None = None
        self._rows: list[Row] = []
        self._values: list[object] = []
        self._lines: list[str | None] = []
        # Tuples, not lists: a tuple of strings is not tracked by the garbage collector, so the
        # kept text adds few objects for CPython's collections to walk.
        self._plain: tuple[tuple[str, ...], ...] = ()
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
        self._plain = ()
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
        out: list[list[str]] = [[] for _ in NODE_FAMILIES]
        _node(out, lbl, node, state)
        for glbl, gpu in gpus:
            _gpu(out, glbl, gpu, xid_class)
        for plbl, port in ports:
            _port(out, plbl, port)
        plain = tuple(tuple(lines) for lines in out)  # the lines written each time, before the rows
        values, lines = self._values, self._lines
        changed = [False] * len(out)
        for k, (i, di, signal, scale, prefix) in enumerate(self._rows):
            value = dicts[di].get(signal)
            if value == values[k] and value is not None:
                line = lines[k]
            else:
                changed[i] = True
                values[k] = value
                line = lines[k] = (
                    None
                    if value is None or value.__class__ is str
                    else f"{prefix}{float(value) * scale!r}\n"
                )
            if line is not None:
                out[i].append(line)
        old_plain, old_pieces = self._plain, self._pieces
        pieces = tuple(
            old_pieces[i]
            if old_pieces and not changed[i] and plain[i] == old_plain[i]
            else _spelled("".join(lines)).encode()
            if lines
            else b""
            for i, lines in enumerate(out)
        )
        self._plain, self._pieces = plain, pieces
        return pieces


def _node(out: list[list[str]], lbl: str, node: NodeState, state: str) -> None:
    out[_UP].append(f"fleetwatch_node_up{{{lbl}}} {float(node.reachable)!r}\n")
    out[_CONNECTED].append(f"fleetwatch_node_connected{{{lbl}}} {float(node.connected)!r}\n")
    out[_SEEN].append(
        f"fleetwatch_node_last_seen_timestamp_seconds{{{lbl}}} {float(node.last_seen_unix)!r}\n"
    )
    add = out[_STATE].append
    for name in NODE_STATES:
        add(f'fleetwatch_node_state{{{lbl},state="{name}"}} {float(name == state)!r}\n')
    out[_INFO].append(
        f'fleetwatch_node_info{{{lbl},agent_version="{escape(node.agent_version)}",'
        f'driver_version="{escape(node.driver_version)}"}} 1.0\n'
    )
    add = out[_EVENTS].append
    for kind, count in sorted(node.events.items()):
        add(f'fleetwatch_node_events_total{{{lbl},kind="{escape(kind)}"}} {float(count)!r}\n')


def _gpu(
    out: list[list[str]],
    lbl: str,
    gpu: GpuState,
    xid_class: Callable[[int], str],
) -> None:
    out[_GPU_INFO].append(
        f'fleetwatch_gpu_info{{{lbl},uuid="{escape(gpu.uuid)}",'
        f'pci_bus_id="{escape(gpu.pci_bus_id)}",model="{escape(gpu.model)}"}} 1.0\n'
    )
    out[_PRESENT].append(f"fleetwatch_gpu_present{{{lbl}}} {float(gpu.present)!r}\n")
    out[_NVLINKS].append(f"fleetwatch_gpu_nvlinks{{{lbl}}} {float(gpu.nvlink_count)!r}\n")
    out[_NVLINKS_DOWN].append(f"fleetwatch_gpu_nvlinks_down{{{lbl}}} {float(gpu.nvlinks_down)!r}\n")
    if gpu.pcie_replay_count is not None:
        out[_REPLAYS].append(
            f"fleetwatch_gpu_pcie_replays_total{{{lbl}}} {float(gpu.pcie_replay_count)!r}\n"
        )
    add = out[_XIDS].append
    for xid, count in sorted(gpu.xid_counts.items()):
        add(
            f'fleetwatch_gpu_xid_errors_total{{{lbl},xid="{xid}",'
            f'class="{escape(xid_class(xid))}"}} {float(count)!r}\n'
        )
    reasons = gpu.signals.get("clock_event_reasons")
    if reasons is not None and reasons.__class__ is not str:
        bits = int(reasons)
        add = out[_THROTTLED].append
        for reason, mask in THROTTLE_REASONS:
            add(
                f'fleetwatch_gpu_clocks_throttled{{{lbl},reason="{reason}"}} '
                f"{float(bool(bits & mask))!r}\n"
            )
    _nvlink_errors(out[_NVLINK_ERRORS].append, lbl, gpu)


def _nvlink_errors(add: Callable[[str], None], lbl: str, gpu: GpuState) -> None:
    """The GPU's NVLink error counters, summed over its links."""
    links = gpu.link_signals.values()
    for kind, signal in NVLINK_ERRORS:
        values = [v for d in links if (v := d.get(signal)) is not None and v.__class__ is not str]
        if values:
            add(
                f'fleetwatch_gpu_nvlink_errors_total{{{lbl},type="{kind}"}} '
                f"{float(sum(values))!r}\n"  # type: ignore[arg-type]
            )


def _port(out: list[list[str]], lbl: str, port: PortState) -> None:
    out[_PORT_UP].append(f"fleetwatch_ib_port_up{{{lbl}}} {float(port.up)!r}\n")
    out[_PORT_STATE].append(
        f'fleetwatch_ib_port_state{{{lbl},state="{escape(port.state)}",'
        f'phys_state="{escape(port.phys_state)}"}} 1.0\n'
    )
