"""What every fleetwatch dashboard shares: its frame, the words of its queries, annotations.

Every query goes to the Prometheus datasource the viewer picks in the ``ds`` variable; rates are
over ``$__rate_interval``. Panels are data (:mod:`dashboards.panels`) that :func:`new_dashboard`
lays out and numbers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, Protocol

from grafana_foundation_sdk.builders import dashboard
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm

if TYPE_CHECKING:
    from collections.abc import Sequence

DS: Final = cm.DataSourceRef(type_val="prometheus", uid="${ds}")
# The data source deploy/grafana/provisioning/datasources/fleetwatch.yaml provisions, which the
# ``ds`` variable selects by default: Grafana's default Prometheus may be another one, whose
# panels would all say "No data". A Grafana without it selects another Prometheus, as before.
PROVISIONED_DS_UID: Final = "fleetwatch-prometheus"
PROVISIONED_DS_NAME: Final = "fleetwatch Prometheus"
TAG: Final = "fleetwatch"
# Node states of fleetwatch_node_state, in the order a reader scans them, with their colours.
NODE_STATES: Final = (
    ("healthy", "green"),
    ("degraded", "yellow"),
    ("draining", "orange"),
    ("drained", "blue"),
    ("unreachable", "red"),
)
# Panel widths (of Grafana's 24 columns) and the usual height.
FULL: Final = 24
HALF: Final = 12
THIRD: Final = 8
QUARTER: Final = 6
HEIGHT: Final = 8
# Windows: ``f"rate(m{RATE})"`` per second, ``increase(m, WINDOW)`` per rate interval,
# ``increase(m, RANGE)`` over the dashboard's range.
RATE: Final = "[$__rate_interval]"
WINDOW: Final = "$__rate_interval"
RANGE: Final = "$__range"
# Table columns that tell a reader nothing: the sample's time, the metric, the scrape's labels.
SCRAPE: Final = ("Time", "__name__", "job", "instance")


def increase(series: str, window: str) -> str:
    """``increase(series[window])`` that also counts an event counter's first events.

    Counters of events (Xids, failures, actions) often get a series only when their first event
    comes, already at 1, and ``increase()`` cannot see that step. So a series that did not exist
    ``window`` ago counts in full (the collector's counters start at 0 with the collector).

    Args:
        series: The counter, with its label matchers.
        window: How far back to count (``WINDOW``, ``RANGE``).

    Returns:
        The PromQL expression.
    """
    return f"({series} unless {series} offset {window}) or increase({series}[{window}])"


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


# Colours of stats and states by value: BLUE, only informative; green, then ORANGE or RED FROM
# ONE, a count that should stay 0; RED BELOW ONE, then green, a flag that should be 1 (up).
BLUE: Final = thresholds((None, "blue"))
ORANGE_FROM_ONE: Final = thresholds((None, "green"), (1, "orange"))
RED_FROM_ONE: Final = thresholds((None, "green"), (1, "red"))
RED_BELOW_ONE: Final = thresholds((None, "red"), (1, "green"))
# The drain circuit breaker's states.
OPEN_CLOSED: Final = value_text({"0": ("closed", "green"), "1": ("open", "red")})


class Item(Protocol):
    """A row title or a panel: what a dashboard's layout lists."""

    def add_to(self, builder: dashboard.Dashboard) -> dashboard.Dashboard:
        """The dashboard with this item appended."""
        ...


def _annotation(name: str, colour: str, expr: str) -> dashboard.AnnotationQuery:
    return (
        dashboard.AnnotationQuery()
        .name(name)
        .datasource(DS)
        .enable(enable=True)
        .icon_color(colour)
        .expr(expr)
    )


def incidents_annotation(
    name: str, selector: str = "", where: str = ""
) -> dashboard.AnnotationQuery:
    """Firing fleetwatch incidents as regions, titled by rule, tagged by severity.

    Args:
        name: The annotation's name in the dashboard's toggles.
        selector: Narrows the series (``{node="$node"}``).
        where: A set operation that keeps some of them (`` and on (node) ...``).

    Returns:
        The annotation's builder.
    """
    return (
        _annotation(name, "red", f"fleetwatch_incident_firing{selector}{where}")
        .title_format("{{rule}} ({{severity}})")
        .text_format("{{target}}")
        .tag_keys("rule,severity,node")
    )


def actions_annotation(name: str, selector: str = "", where: str = "") -> dashboard.AnnotationQuery:
    """Each action fleetwatch took, at the time it ended (the series' value is that time).

    Args:
        name: The annotation's name in the dashboard's toggles.
        selector: As for :func:`incidents_annotation`.
        where: As for :func:`incidents_annotation`.

    Returns:
        The annotation's builder.
    """
    expr = f"(fleetwatch_action_last_timestamp_seconds{selector}{where}) * 1000"
    return (
        _annotation(name, "blue", expr)
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
    panels: Sequence[Item],
    *,
    tags: Sequence[str] = (),
    time_from: str = "now-6h",
    refresh: str = "30s",
    variables: Sequence[dashboard.QueryVariable] = (),
    annotations: Sequence[dashboard.AnnotationQuery] = (),
) -> dm.Dashboard:
    """A built dashboard: its panels, numbered 1, 2, 3 ... (unique, as Grafana wants).

    Every dashboard has the ``ds`` datasource variable (before ``variables``), defaulting to the
    provisioned data source, and a drop-down of links to its fleetwatch siblings.

    Args:
        title: The dashboard's title.
        uid: Its uid, also the name of its JSON file.
        description: What it is for.
        panels: Row titles and panels, in order; panels go left to right, wrapped at 24 columns.
        tags: Tags besides ``fleetwatch``.
        time_from: The start of its default time range.
        refresh: Its auto-refresh interval.
        variables: Template variables after ``ds``.
        annotations: Annotations, in the order of their toggles.

    Returns:
        The dashboard's model.
    """
    builder = (
        dashboard.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags([TAG, *tags])
        .time(time_from, "now")
        .refresh(refresh)
        .timezone("browser")
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
        .with_variable(
            dashboard.DatasourceVariable("ds")
            .label("Prometheus")
            .type("prometheus")
            .current(dm.VariableOption(text=PROVISIONED_DS_NAME, value=PROVISIONED_DS_UID))
        )
        .link(
            dashboard.DashboardLink("fleetwatch")
            .type(dm.DashboardLinkType.DASHBOARDS)
            .tags([TAG])
            .as_dropdown(as_dropdown=True)
            .include_vars(include_vars=False)
            .keep_time(keep_time=True)
        )
    )
    for variable in variables:
        builder = builder.with_variable(variable)
    for annotation in annotations:
        builder = builder.annotation(annotation)
    for item in panels:
        builder = item.add_to(builder)
    built = builder.build()
    for index, panel in enumerate(built.panels or [], start=1):
        panel.id_val = index
    return built
