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
    from fleetwatch.model import SampleValue

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


def render_node(node: NodeState, state: str, xid_class: Callable[[int], str]) -> tuple[bytes, ...]:
    """Every series of ``node`` (in ``state``), one piece per family of :data:`NODE_FAMILIES`."""
    out: list[list[str]] = [[] for _ in NODE_FAMILIES]
    lbl = f'node="{escape(node.name)}"'
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
    _agent(out, lbl, node.signals)
    for gpu in sorted(node.gpus.values(), key=lambda g: g.index):
        _gpu(out, f'{lbl},gpu="{gpu.index}"', gpu, xid_class)
    for port in node.ports.values():
        _port(out, f'{lbl},device="{escape(port.device)}",port="{port.port}"', port)
    return tuple(_spelled("".join(lines)).encode() if lines else b"" for lines in out)


def _agent(out: list[list[str]], lbl: str, signals: dict[str, SampleValue]) -> None:
    get = signals.get
    for i, metric, signal in _AGENT_ROWS:
        value = get(signal)
        if value is not None and value.__class__ is not str:
            out[i].append(f"{metric}{{{lbl}}} {float(value)!r}\n")
    add = out[_SOURCE_ERRORS].append
    for source in AGENT_SOURCES:
        value = get(f"agent_source_errors_{source}")
        if value is not None and value.__class__ is not str:
            add(
                f'fleetwatch_agent_source_errors_total{{{lbl},source="{source}"}} '
                f"{float(value)!r}\n"
            )
    add = out[_REFUSED].append
    for reason in REFUSAL_REASONS:
        value = get(REFUSED_SIGNAL_PREFIX + reason)
        if value is not None and value.__class__ is not str:
            add(
                f'fleetwatch_agent_job_reports_refused_total{{{lbl},reason="{reason}"}} '
                f"{float(value)!r}\n"
            )


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
    get = gpu.signals.get
    for i, metric, signal, scale in _GPU_GAUGE_ROWS:
        value = get(signal)
        if value is not None and value.__class__ is not str:
            out[i].append(f"{metric}{{{lbl}}} {float(value) * scale!r}\n")
    for i, line, signal in _GPU_LABELLED_ROWS:
        value = get(signal)
        if value is not None and value.__class__ is not str:
            out[i].append(f"{line.format(lbl)}{float(value)!r}\n")
    reasons = get("clock_event_reasons")
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
    """The GPU's NVLink error counters, summed over its links (one pass over the links)."""
    totals: list[float | None] = [None] * len(_NVLINK_SIGNALS)
    for values in gpu.link_signals.values():
        for k, signal in enumerate(_NVLINK_SIGNALS):
            value = values.get(signal)
            if value is not None and value.__class__ is not str:
                total = totals[k]
                totals[k] = float(value) if total is None else total + float(value)
    for (kind, _), total in zip(NVLINK_ERRORS, totals, strict=True):
        if total is not None:
            add(f'fleetwatch_gpu_nvlink_errors_total{{{lbl},type="{kind}"}} {float(total)!r}\n')


def _port(out: list[list[str]], lbl: str, port: PortState) -> None:
    out[_PORT_UP].append(f"fleetwatch_ib_port_up{{{lbl}}} {float(port.up)!r}\n")
    out[_PORT_STATE].append(
        f'fleetwatch_ib_port_state{{{lbl},state="{escape(port.state)}",'
        f'phys_state="{escape(port.phys_state)}"}} 1.0\n'
    )
    get = port.signals.get
    for i, metric, signal in _PORT_ROWS:
        value = get(signal)
        if value is not None and value.__class__ is not str:
            out[i].append(f"{metric}{{{lbl}}} {float(value)!r}\n")
    add = out[_PORT_ERRORS].append
    for line, signal in _PORT_ERROR_ROWS:
        value = get(signal)
        if value is not None and value.__class__ is not str:
            add(f"{line.format(lbl)}{float(value)!r}\n")
    add = out[_PORT_HW].append
    for line, signal in _PORT_HW_ROWS:
        value = get(signal)
        if value is not None and value.__class__ is not str:
            add(f"{line.format(lbl)}{float(value)!r}\n")
