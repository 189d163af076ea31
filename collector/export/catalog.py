"""Every series the collector's ``/metrics`` exposes: name, type, unit, labels and meaning.

The specs are a table in ``metrics.toml`` next to this module (one row per metric, one group per
section of ``docs/metrics.md``), read once, on first use, by :func:`catalog`. The exporters build
their metric families from these specs (:meth:`MetricSpec.family`), so the catalog cannot drift
from what a scrape yields, and ``docs/metrics.md`` is generated from it (``fleetwatch metrics
catalog``; a test checks the committed page is current).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Final, Literal

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

Kind = Literal["gauge", "counter", "histogram"]
_KINDS: Final[dict[str, Kind]] = {"gauge": "gauge", "counter": "counter", "histogram": "histogram"}

NODE_STATES: Final = ("healthy", "degraded", "draining", "drained", "unreachable")
# Every reason an HTTP API request can be refused for (fleetwatch_api_requests_refused_total);
# each is exposed, at 0 until it happens.
API_REFUSAL_REASONS: Final = (
    # a change without the right token, or from where none may come (401, 403)
    "missing_token",
    "bad_token",
    "no_token_configured",
    "not_loopback",
    # what a web page could make a browser send (collector.api.browsers): 403, 403, 415
    "bad_host",
    "cross_origin",
    "not_json",
    # a request that cannot be read (400, 411, 413, and the server's own 4xx)
    "bad_request",
    # connections (collector.api.connections): too slow to send their request, closed for a
    # newcomer while still sending it, or refused at the cap (503)
    "read_timeout",
    "evicted",
    "too_many_connections",
    # the event loop did not take a change or a drain read up in time (503)
    "loop_busy",
)
# Series one node of 8 GPUs (18 NVLinks each) and 8 IB ports may cost, job ranks included.
SERIES_PER_NODE_BUDGET: Final = 700


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One metric family: ``name`` as exposed (counters end in ``_total``)."""

    name: str
    kind: Kind
    unit: str
    labels: tuple[str, ...]
    help: str
    group: str

    def family(self) -> GaugeMetricFamily | CounterMetricFamily:
        """An empty family of this gauge or counter, to add samples to."""
        if self.kind == "histogram":
            msg = f"{self.name} is a histogram: build it with histogram_family()"
            raise TypeError(msg)
        if self.kind == "counter":
            return CounterMetricFamily(self.name, self.help, labels=list(self.labels))
        return GaugeMetricFamily(self.name, self.help, labels=list(self.labels))

    def histogram_family(self) -> HistogramMetricFamily:
        """An empty family of this histogram (its series: _bucket with le, _sum, _count)."""
        if self.kind != "histogram":
            msg = f"{self.name} is a {self.kind}, not a histogram"
            raise TypeError(msg)
        return HistogramMetricFamily(self.name, self.help, labels=list(self.labels))


def _spec(group: str, row: object) -> MetricSpec:
    """One row of ``metrics.toml``: ``[name, type, unit, labels, help]``, labels space-separated."""
    match row:
        case [str(name), str(kind), str(unit), str(labels), str(help_text)] if kind in _KINDS:
            return MetricSpec(name, _KINDS[kind], unit, tuple(labels.split()), help_text, group)
    msg = (
        "metrics.toml: not a [name, gauge|counter|histogram, unit, labels, help] row in "
        f"{group!r}: {row!r}"
    )
    raise ValueError(msg)


@cache
def catalog() -> tuple[MetricSpec, ...]:
    """Every metric, in the order of ``metrics.toml`` (a scrape's and the page's)."""
    text = resources.files("collector.export").joinpath("metrics.toml").read_text("utf-8")
    return tuple(
        _spec(group["title"], row)
        for group in tomllib.loads(text)["group"]
        for row in group["metrics"]
    )


@cache
def by_name() -> Mapping[str, MetricSpec]:
    """Every metric's spec, by name."""
    return {s.name: s for s in catalog()}


def spec(name: str) -> MetricSpec:
    """The spec of ``name`` (a KeyError names a metric the catalog lacks)."""
    return by_name()[name]


def families(names: Iterable[str]) -> dict[str, GaugeMetricFamily | CounterMetricFamily]:
    """Fresh, empty families of ``names``, by name."""
    return {name: spec(name).family() for name in names}
