"""What every fleetwatch dashboard shares: the datasource variable, panel helpers, annotations.

Every query goes to the Prometheus datasource the viewer picks in the ``ds`` variable. Panels are
built by the helpers here so that each kind looks and behaves the same on every dashboard
(legends shown as tables with their last value, tooltips listing every series, rates over
``$__rate_interval``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, TypeVar

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

if TYPE_CHECKING:
    from collections.abc import Sequence

    from grafana_foundation_sdk.cog.builder import Builder

DS: Final = cm.DataSourceRef(type_val="prometheus", uid="${ds}")
TAG: Final = "fleetwatch"
# Node states of fleetwatch_node_state, in the order a reader scans them, with their colours.
NODE_STATES: Final = (
    ("healthy", "green"),
    ("degraded", "yellow"),
    ("draining", "orange"),
    ("drained", "blue"),
    ("unreachable", "red"),
)
FULL: Final = 24
HALF: Final = 12
THIRD: Final = 8
QUARTER: Final = 6
HEIGHT: Final = 8


def q(expr: str, legend: str = "") -> prometheus.Dataquery:
    """A range query, drawn over the dashboard's time range, with a legend template."""
    target = prometheus.Dataquery().expr(expr).datasource(DS).range()
    return target.legend_format(legend) if legend else target


def instant(expr: str, legend: str = "") -> prometheus.Dataquery:
    """An instant query at the end of the range (tables make it one row per series)."""
    target = prometheus.Dataquery().expr(expr).datasource(DS).instant()
    return target.legend_format(legend) if legend else target


_P = TypeVar(
    "_P",
    timeseries.Panel,
    stat.Panel,
    table.Panel,
    heatmap.Panel,
    statetimeline.Panel,
    bargauge.Panel,
)


def _targets(panel: _P, targets: Sequence[prometheus.Dataquery]) -> _P:
    for index, target in enumerate(targets):
        panel = panel.with_target(target.ref_id(chr(ord("A") + index)))
    return panel


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


def increase(series: str, window: str) -> str:
    """``increase(series[window])`` that also counts an event counter's first events.

    Counters of events (Xids, failures, actions) often get a series only when their first event
    comes, already at 1, and ``increase()`` cannot see that step. So a series that did not exist
    ``window`` ago counts in full (the collector's counters start at 0 with the collector).
    """
    return f"({series} unless {series} offset {window}) or increase({series}[{window}])"


def fixed_colours(panel: _P, colours: Sequence[tuple[str, str]]) -> _P:
    """Give the series named (by their legend) a fixed colour each: ``[("healthy", "green")]``."""
    for name, colour in colours:
        fixed = {"mode": "fixed", "fixedColor": colour}
        panel = panel.override_by_name(name, [dm.DynamicConfigValue(id_val="color", value=fixed)])
    return panel


def thresholds(*steps: tuple[float | None, str]) -> dashboard.ThresholdsConfig:
    """Absolute thresholds; the first step's value is None (from minus infinity)."""
    return (
        dashboard.ThresholdsConfig()
        .mode(dm.ThresholdsMode.ABSOLUTE)
        .steps([dm.Threshold(value=value, color=color) for value, color in steps])
    )


def value_text(mapping: dict[str, tuple[str, str]]) -> list[dm.ValueMapping]:
    """Show values as words: ``{"1": ("open", "red")}``."""
    options = {
        value: dm.ValueMappingResult(text=text, color=color, index=index)
        for index, (value, (text, color)) in enumerate(mapping.items())
    }
    return [dm.ValueMap(options=options)]


def timeseries_panel(  # noqa: PLR0913 - a panel has that many knobs
    title: str,
    description: str,
    targets: Sequence[prometheus.Dataquery],
    *,
    unit: str = "short",
    width: int = HALF,
    stack: bool = False,
    bars: bool = False,
    minimum: float | None = 0,
) -> timeseries.Panel:
    """Lines (or bars) over time, with a table legend showing each series' last and max value."""
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DS)
        .unit(unit)
        .span(width)
        .height(HEIGHT)
        .legend(_legend())
        .tooltip(_tooltip())
        .fill_opacity(10)
        .line_width(1)
    )
    if minimum is not None:
        panel = panel.min(minimum)
    if stack:
        stacking = common.StackingConfig().mode(cm.StackingMode.NORMAL)
        panel = panel.stacking(stacking).fill_opacity(60)
    if bars:
        panel = panel.draw_style(cm.GraphDrawStyle.BARS).fill_opacity(80)
    return _targets(panel, targets)


def stat_panel(  # noqa: PLR0913 - a panel has that many knobs
    title: str,
    description: str,
    targets: Sequence[prometheus.Dataquery],
    *,
    unit: str = "short",
    width: int = QUARTER,
    steps: dashboard.ThresholdsConfig | None = None,
    mappings: list[dm.ValueMapping] | None = None,
    no_value: str = "",
    text_mode: cm.BigValueTextMode = cm.BigValueTextMode.AUTO,
) -> stat.Panel:
    """One big number per series (its last value), coloured by thresholds."""
    panel = (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(DS)
        .unit(unit)
        .span(width)
        .height(4)
        .reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]).values(values=False))
        .graph_mode(cm.BigValueGraphMode.NONE)  # instant queries: no sparkline to draw
        .color_mode(cm.BigValueColorMode.VALUE)
        .text_mode(text_mode)
        .thresholds(steps or thresholds((None, "green")))
    )
    if mappings:
        panel = panel.mappings(mappings)
    if no_value:
        panel = panel.no_value(no_value)
    return _targets(panel, targets)


def table_panel(  # noqa: PLR0913 - a panel has that many knobs
    title: str,
    description: str,
    targets: Sequence[prometheus.Dataquery],
    *,
    hide: Sequence[str] = ("Time", "__name__"),
    rename: dict[str, str] | None = None,
    unit: str = "short",
    width: int = HALF,
    no_value: str = "",
) -> table.Panel:
    """Rows of label values (instant queries); several queries are merged on their labels."""
    panel = (
        table.Panel()
        .title(title)
        .description(description)
        .datasource(DS)
        .unit(unit)
        .span(width)
        .height(HEIGHT)
        .filterable(filterable=True)
    )
    if len(targets) > 1:
        panel = panel.with_transformation(dm.DataTransformerConfig(id_val="merge", options={}))
    organize = {
        "excludeByName": dict.fromkeys(hide, True),
        "renameByName": rename or {},
    }
    panel = panel.with_transformation(dm.DataTransformerConfig(id_val="organize", options=organize))
    if no_value:
        panel = panel.no_value(no_value)
    return _targets(panel, [target.format(pm.PromQueryFormat.TABLE) for target in targets])


def heatmap_panel(
    title: str,
    description: str,
    target: prometheus.Dataquery,
    *,
    unit: str = "short",
    width: int = HALF,
) -> heatmap.Panel:
    """One row per series (e.g. per node), one cell per time step, colour by value.

    The query's series are the rows as they come (``calculate`` off): a per-node rate gives a
    row per node, so a node whose errors climb stands out at a glance.
    """
    panel = (
        heatmap.Panel()
        .title(title)
        .description(description)
        .datasource(DS)
        .span(width)
        .height(HEIGHT)
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
        .cell_values(heatmap.CellValues().unit(unit))
        .y_axis(heatmap.YAxisConfig().axis_placement(cm.AxisPlacement.LEFT))
        .show_legend()
        .tooltip(
            heatmap.HeatmapTooltip()
            .mode(cm.TooltipDisplayMode.SINGLE)
            .y_histogram(y_histogram=False)
        )
    )
    return _targets(panel, [target])


def state_panel(  # noqa: PLR0913 - a panel has that many knobs
    title: str,
    description: str,
    targets: Sequence[prometheus.Dataquery],
    *,
    mappings: list[dm.ValueMapping] | None = None,
    steps: dashboard.ThresholdsConfig | None = None,
    width: int = HALF,
) -> statetimeline.Panel:
    """A band per series whose colour says its state over time (up/down, present/lost)."""
    panel = (
        statetimeline.Panel()
        .title(title)
        .description(description)
        .datasource(DS)
        .span(width)
        .height(HEIGHT)
        .legend(_legend(calcs=()).display_mode(cm.LegendDisplayMode.LIST))
        .tooltip(_tooltip())
        .merge_values(merge_values=True)
        .show_value(cm.VisibilityMode.NEVER)
        .row_height(0.8)
        .fill_opacity(80)
        .color_scheme(dashboard.FieldColor().mode(dm.FieldColorModeId.THRESHOLDS))
        .thresholds(steps or thresholds((None, "green"), (1, "red")))
    )
    if mappings:
        panel = panel.mappings(mappings)
    return _targets(panel, targets)


def bar_panel(
    title: str,
    description: str,
    targets: Sequence[prometheus.Dataquery],
    *,
    unit: str = "short",
    width: int = HALF,
) -> bargauge.Panel:
    """Horizontal bars, one per series, for totals over the range (failures by category)."""
    panel = (
        bargauge.Panel()
        .title(title)
        .description(description)
        .datasource(DS)
        .unit(unit)
        .span(width)
        .height(HEIGHT)
        .orientation(cm.VizOrientation.HORIZONTAL)
        .display_mode(cm.BarGaugeDisplayMode.BASIC)
        .reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]).values(values=False))
        .min(0)
        .thresholds(thresholds((None, "blue")))
        .legend(_legend(calcs=()).show_legend(show_legend=False))
    )
    return _targets(panel, targets)


def incidents_annotation(
    name: str, selector: str = "", where: str = ""
) -> dashboard.AnnotationQuery:
    """Firing fleetwatch incidents as regions, titled by rule, tagged by severity.

    ``selector`` narrows the series (``{node="$node"}``), ``where`` is a set operation that keeps
    some of them (`` and on (node) ...``).
    """
    return (
        dashboard.AnnotationQuery()
        .name(name)
        .datasource(DS)
        .enable(enable=True)
        .icon_color("red")
        .expr(f"fleetwatch_incident_firing{selector}{where}")
        .title_format("{{rule}} ({{severity}})")
        .text_format("{{target}}")
        .tag_keys("rule,severity,node")
    )


def actions_annotation(name: str, selector: str = "", where: str = "") -> dashboard.AnnotationQuery:
    """Each action fleetwatch took, at the time it ended (the series' value is that time).

    ``selector`` and ``where`` as for :func:`incidents_annotation`.
    """
    return (
        dashboard.AnnotationQuery()
        .name(name)
        .datasource(DS)
        .enable(enable=True)
        .icon_color("blue")
        .expr(f"(fleetwatch_action_last_timestamp_seconds{selector}{where}) * 1000")
        .use_value_for_time(use_value_for_time=True)
        .title_format("{{action}}: {{outcome}}")
        .text_format("{{node}}")
        .tag_keys("action,outcome,node")
    )


def query_variable(name: str, label: str, query: str) -> dashboard.QueryVariable:
    """A variable whose values are a label's values (``label_values(metric, label)``)."""
    return (
        dashboard.QueryVariable(name)
        .label(label)
        .datasource(DS)
        .query(query)
        .definition(query)
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dm.VariableSort.ALPHABETICAL_ASC)
    )


def new_dashboard(  # noqa: PLR0913 - a dashboard has that many knobs
    title: str,
    uid: str,
    description: str,
    *,
    tags: Sequence[str] = (),
    time_from: str = "now-6h",
    refresh: str = "30s",
) -> dashboard.Dashboard:
    """A dashboard with the ``ds`` datasource variable and links to its fleetwatch siblings."""
    return (
        dashboard.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags([TAG, *tags])
        .time(time_from, "now")
        .refresh(refresh)
        .timezone("browser")
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
        .with_variable(dashboard.DatasourceVariable("ds").label("Prometheus").type("prometheus"))
        .link(
            dashboard.DashboardLink("fleetwatch")
            .type(dm.DashboardLinkType.DASHBOARDS)
            .tags([TAG])
            .as_dropdown(as_dropdown=True)
            .include_vars(include_vars=False)
            .keep_time(keep_time=True)
        )
    )


def finish(builder: Builder[dm.Dashboard]) -> dm.Dashboard:
    """Build the dashboard and number its panels 1, 2, 3 ... in order (unique, as Grafana wants)."""
    built = builder.build()
    for index, panel in enumerate(built.panels or [], start=1):
        panel.id_val = index
    return built
