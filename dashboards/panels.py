"""Panels as data: each kind of panel is a small frozen dataclass that builds itself.

A dashboard's ``PANELS`` is a table of :class:`Row` titles, each followed by its panels, such
as ``Timeseries("Power", "Board power draw.", [(f"fleetwatch_gpu_power_watts{N}", "GPU {{gpu}}")],
unit="watt")``. Every kind looks and behaves the same on every dashboard: legends are tables with
their last value, tooltips list every series, and the kind decides how its queries run (stats,
tables and bars read the value at the end of the range, the others draw the range).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import KW_ONLY, dataclass
from typing import TYPE_CHECKING, ClassVar, Generic, TypeAlias, TypeVar

from grafana_foundation_sdk.builders import (
    bargauge,
    common,
    dashboard,
    heatmap,
    prometheus,
    stat,
    statetimeline,
    table,
    timeseries,
)
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import heatmap as hm
from grafana_foundation_sdk.models import prometheus as pm

from dashboards.common import DS, HALF, HEIGHT, QUARTER, thresholds

if TYPE_CHECKING:
    from collections.abc import Sequence

# A panel's query: a PromQL expression, or an (expression, legend template) pair.
Query: TypeAlias = str | tuple[str, str]

_P = TypeVar(
    "_P",
    timeseries.Panel,
    stat.Panel,
    table.Panel,
    heatmap.Panel,
    statetimeline.Panel,
    bargauge.Panel,
)


def _legend(calcs: Sequence[str] = ("lastNotNull", "max")) -> common.VizLegendOptions:
    # 0.0.21 builds legends hidden by default: every panel says what it wants.
    return (
        common.VizLegendOptions()
        .show_legend(show_legend=True)
        .display_mode(cm.LegendDisplayMode.TABLE)
        .placement(cm.LegendPlacement.BOTTOM)
        .calcs(list(calcs))
    )


def _tooltip() -> common.VizTooltipOptions:
    return (
        common.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI).sort(cm.SortOrder.DESCENDING)
    )


def _last_value() -> common.ReduceDataOptions:
    return common.ReduceDataOptions().calcs(["lastNotNull"]).values(values=False)


@dataclass(frozen=True)
class Panel(ABC, Generic[_P]):
    """What every kind of panel has: a title, a description, queries, a size, fixed colours.

    Attributes:
        title: The panel's title.
        description: What the panel shows (Grafana's "i" next to the title).
        queries: Its queries, lettered A, B, C ... in order.
        width: Grid columns of 24 (``FULL``, ``HALF``, ``THIRD``, ``QUARTER``).
        height: Grid rows.
        colours: A fixed colour for the series of each legend: ``[("healthy", "green")]``.
    """

    title: str
    description: str
    queries: Sequence[Query]
    _: KW_ONLY
    width: int = HALF
    height: int = HEIGHT
    colours: Sequence[tuple[str, str]] = ()

    # Whether the kind reads one value at the end of the range rather than the whole range.
    instant: ClassVar[bool] = False

    def build(self) -> _P:
        """The panel's builder, ready for a dashboard."""
        panel = (
            self._style()
            .title(self.title)
            .description(self.description)
            .datasource(DS)
            .span(self.width)
            .height(self.height)
        )
        for index, query in enumerate(self.queries):
            panel = panel.with_target(self._target(query).ref_id(chr(ord("A") + index)))
        for name, colour in self.colours:
            fixed = {"mode": "fixed", "fixedColor": colour}
            panel = panel.override_by_name(
                name, [dm.DynamicConfigValue(id_val="color", value=fixed)]
            )
        return panel

    def add_to(self, builder: dashboard.Dashboard) -> dashboard.Dashboard:
        """The dashboard with this panel appended (left to right, wrapped at 24 columns)."""
        return builder.with_panel(self.build())

    @abstractmethod
    def _style(self) -> _P:
        """A builder of the kind with the kind's own options set."""

    def _target(self, query: Query) -> prometheus.Dataquery:
        expr, legend = (query, "") if isinstance(query, str) else query
        target = prometheus.Dataquery().expr(expr).datasource(DS)
        target = target.instant() if self.instant else target.range()
        return target.legend_format(legend) if legend else target


@dataclass(frozen=True, kw_only=True)
class Timeseries(Panel[timeseries.Panel]):
    """Lines (or bars) over time, with a table legend showing each series' last and max value.

    Attributes:
        unit: Grafana's unit of the values.
        stack: Stack the series on each other.
        bars: Draw bars rather than lines (counts per interval).
    """

    unit: str = "short"
    stack: bool = False
    bars: bool = False

    def _style(self) -> timeseries.Panel:
        panel = (
            timeseries.Panel()
            .unit(self.unit)
            .legend(_legend())
            .tooltip(_tooltip())
            .fill_opacity(80 if self.bars else 60 if self.stack else 10)
            .line_width(1)
            .min(0)
        )
        if self.stack:
            panel = panel.stacking(common.StackingConfig().mode(cm.StackingMode.NORMAL))
        if self.bars:
            panel = panel.draw_style(cm.GraphDrawStyle.BARS)
        return panel


@dataclass(frozen=True, kw_only=True)
class Stat(Panel[stat.Panel]):
    """One big number per series (its last value), coloured by thresholds.

    Attributes:
        unit: Grafana's unit of the values.
        steps: The colours by value (default: all green).
        mappings: Words for values (``value_text``).
        no_value: What to show when the query returns nothing.
        text_mode: Show the value, the series' name, or both.
    """

    instant: ClassVar[bool] = True

    width: int = QUARTER
    height: int = 4
    unit: str = "short"
    steps: dashboard.ThresholdsConfig | None = None
    mappings: list[dm.ValueMapping] | None = None
    no_value: str = ""
    text_mode: cm.BigValueTextMode = cm.BigValueTextMode.AUTO

    def _style(self) -> stat.Panel:
        panel = (
            stat.Panel()
            .unit(self.unit)
            .reduce_options(_last_value())
            .graph_mode(cm.BigValueGraphMode.NONE)  # instant queries: no sparkline to draw
            .color_mode(cm.BigValueColorMode.VALUE)
            .text_mode(self.text_mode)
            .thresholds(self.steps or thresholds((None, "green")))
        )
        if self.mappings:
            panel = panel.mappings(self.mappings)
        if self.no_value:
            panel = panel.no_value(self.no_value)
        return panel


@dataclass(frozen=True, kw_only=True)
class Table(Panel[table.Panel]):
    """Rows of label values (instant queries); several queries are merged on their labels.

    Attributes:
        hide: Columns not shown.
        rename: Columns shown under another name: ``{"Value": "failures"}``.
        unit: Grafana's unit of the values.
        no_value: What to show when the query returns nothing.
    """

    instant: ClassVar[bool] = True

    hide: Sequence[str] = ("Time", "__name__")
    rename: dict[str, str] | None = None
    unit: str = "short"
    no_value: str = ""

    def _style(self) -> table.Panel:
        panel = table.Panel().unit(self.unit).filterable(filterable=True)
        if len(self.queries) > 1:
            panel = panel.with_transformation(dm.DataTransformerConfig(id_val="merge", options={}))
        organize = {
            "excludeByName": dict.fromkeys(self.hide, True),
            "renameByName": self.rename or {},
        }
        panel = panel.with_transformation(
            dm.DataTransformerConfig(id_val="organize", options=organize)
        )
        return panel.no_value(self.no_value) if self.no_value else panel

    def _target(self, query: Query) -> prometheus.Dataquery:
        return super()._target(query).format(pm.PromQueryFormat.TABLE)


@dataclass(frozen=True, kw_only=True)
class Heatmap(Panel[heatmap.Panel]):
    """One row per series (e.g. per node), one cell per time step, colour by value.

    The query's series are the rows as they come (``calculate`` off): a per-node rate gives a
    row per node, so a node whose errors climb stands out at a glance.

    Attributes:
        unit: Grafana's unit of the cells' values.
    """

    unit: str = "short"

    def _style(self) -> heatmap.Panel:
        return (
            heatmap.Panel()
            .calculate(calculate=False)
            .color(
                heatmap.HeatmapColorOptions()
                .mode(hm.HeatmapColorMode.SCHEME)
                .scheme("Oranges")
                .fill("dark-orange")
                .scale(hm.HeatmapColorScale.EXPONENTIAL)
                .exponent(0.5)
                .steps(64)
            )
            .cell_values(heatmap.CellValues().unit(self.unit))
            .y_axis(heatmap.YAxisConfig().axis_placement(cm.AxisPlacement.LEFT))
            .show_legend()
            .tooltip(
                heatmap.HeatmapTooltip()
                .mode(cm.TooltipDisplayMode.SINGLE)
                .y_histogram(y_histogram=False)
            )
        )


@dataclass(frozen=True, kw_only=True)
class State(Panel[statetimeline.Panel]):
    """A band per series whose colour says its state over time (up/down, present/lost).

    Attributes:
        mappings: Words for values (``value_text``).
        steps: The colours by value (default: green at 0, red from 1).
    """

    mappings: list[dm.ValueMapping] | None = None
    steps: dashboard.ThresholdsConfig | None = None

    def _style(self) -> statetimeline.Panel:
        panel = (
            statetimeline.Panel()
            .legend(_legend(calcs=()).display_mode(cm.LegendDisplayMode.LIST))
            .tooltip(_tooltip())
            .merge_values(merge_values=True)
            .show_value(cm.VisibilityMode.NEVER)
            .row_height(0.8)
            .fill_opacity(80)
            .color_scheme(dashboard.FieldColor().mode(dm.FieldColorModeId.THRESHOLDS))
            .thresholds(self.steps or thresholds((None, "green"), (1, "red")))
        )
        return panel.mappings(self.mappings) if self.mappings else panel


@dataclass(frozen=True, kw_only=True)
class Bars(Panel[bargauge.Panel]):
    """Horizontal bars, one per series, for totals over the range (failures by category).

    Attributes:
        unit: Grafana's unit of the values.
    """

    instant: ClassVar[bool] = True

    unit: str = "short"

    def _style(self) -> bargauge.Panel:
        return (
            bargauge.Panel()
            .unit(self.unit)
            .orientation(cm.VizOrientation.HORIZONTAL)
            .display_mode(cm.BarGaugeDisplayMode.BASIC)
            .reduce_options(_last_value())
            .min(0)
            .thresholds(thresholds((None, "blue")))
            .legend(_legend(calcs=()).show_legend(show_legend=False))
        )


@dataclass(frozen=True)
class Row:
    """A row's title bar: the panels after it, up to the next row, are in the row.

    Attributes:
        title: The row's title.
    """

    title: str

    def add_to(self, builder: dashboard.Dashboard) -> dashboard.Dashboard:
        """The dashboard with this row appended."""
        return builder.with_row(dashboard.Row(self.title))
