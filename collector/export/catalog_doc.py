"""Write ``docs/metrics.md`` from the metrics catalog.

``python -m collector.export.catalog_doc`` prints the page; ``--write PATH`` writes it there. A test
checks the committed page matches, so a metric added to the catalog without regenerating fails.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Final

from collector.export.catalog import NODE_STATES, SERIES_PER_NODE_BUDGET, catalog
from collector.export.fleet import PORT_ERRORS, PORT_HW_COUNTERS, THROTTLE_REASONS

if TYPE_CHECKING:
    from collections.abc import Sequence

INTRO: Final = f"""\
# Metrics

Generated from `collector/export/metrics.toml` by `python -m collector.export.catalog_doc --write
docs/metrics.md`; do not edit by hand. Every series below comes from the collector's `/metrics`
(agents export nothing themselves). Names follow the Prometheus conventions: the `fleetwatch_`
prefix, base units (seconds, bytes, watts, hertz, ratios from 0 to 1), `_total` on counters.
`promtool check metrics` is clean on a scrape (a test runs it).

Counters the agent reads from hardware (PCIe replays, ECC, AER, IB) carry the hardware's value, so
they reset when the hardware does; `rate()` and `increase()` handle that. Counts of journaled
events (`fleetwatch_node_events_total`, `fleetwatch_gpu_xid_errors_total`,
`fleetwatch_node_failures_total`, `fleetwatch_actions_total`) start at zero when the collector
starts.

## Cardinality budget

At most **{SERIES_PER_NODE_BUDGET} series per node** of 8 GPUs, 18 NVLinks per GPU and 8 IB ports,
including the per-rank series of a training job on its GPUs; a test scrapes a simulated node of
that shape and holds it to the budget (docs/performance.md has the measured figure). Per-NVLink
detail (state, replay, recovery and CRC errors of each link) stays in the JSON API
(`/api/v1/nodes/<node>`): the GPU series sum it. So do the IB packet counters split by unicast
and multicast, the `_data` word counters (the byte counters are derived from them) and the
per-second rates the agent works out for rules (Prometheus computes its own with `rate()`).
The reliability figures are the fleet's (histograms of time to repair and between incidents,
30-day gauges); per node only a remediation count and a lemon flag, and only for the nodes
remediated in the last 7 days and the lemons: the rest is in `/api/v1/reliability`.

## Node states

`fleetwatch_node_state{{state}}` is 1 for the first that holds: `unreachable` (the collector gave up
on the node), `drained` (fleetwatch drained it and has not resumed or released it), `draining`
(a drain request is running now), `degraded` (a firing incident on the node or one of its GPUs
or ports, a lost GPU, an NVLink or an IB port down), else `healthy`. The JSON API
(`/api/v1/nodes`) and the demo's final table show the same word. States:
{", ".join(f"`{s}`" for s in NODE_STATES)}.

## Label values

- `fleetwatch_gpu_clocks_throttled{{reason}}`: {", ".join(f"`{r}`" for r, _ in THROTTLE_REASONS)}.
- `fleetwatch_ib_port_errors_total{{type}}` and the IBA counter (sysfs `counters/`) each reads:
{{port_errors}}
- `fleetwatch_ib_port_hw_events_total{{counter}}` (mlx5 `hw_counters/`, where present):
{{hw_counters}}
- `fleetwatch_node_failures_total{{category}}`: `gpu_lost`, `pcie` (the PCI device went away),
  `node` (unreachable), or a fatal Xid's catalog class (`memory`, `nvlink`, `bus`, ...).
- `fleetwatch_incident_firing{{target}}`: the incident's target key (`node-02/gpu/5`,
  `node-03/ib/mlx5_2/1`, `job/<id>`, `fleet`); `node` is empty for fleet and job incidents.

## Why `training_job`, not `job`

Prometheus gives every scraped series a `job` label (the scrape job's name). A training job's id
is therefore `training_job`, so the collector's series never clash with it and the scrape
configuration needs no `honor_labels`.
"""


HEADER: Final = "| metric | type | unit | labels | meaning |\n|---|---|---|---|---|"


def _port_errors() -> str:
    return "\n".join(
        f"  - `{kind}`: `{signal.removeprefix('ib_')}`" for kind, signal in PORT_ERRORS
    )


def render() -> str:
    """The whole page."""
    hw = "\n".join(f"  - `{name}`" for name in PORT_HW_COUNTERS)
    out = [INTRO.replace("{port_errors}", _port_errors()).replace("{hw_counters}", hw)]
    group = ""
    for spec in catalog():
        if spec.group != group:
            group = spec.group
            out.append(f"\n## {group}\n\n{HEADER}")
        labels = ", ".join(f"`{label}`" for label in spec.labels) or "-"
        help_text = spec.help.replace("|", "\\|")
        out.append(f"| `{spec.name}` | {spec.kind} | {spec.unit or '-'} | {labels} | {help_text} |")
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Print the page, or write it to ``--write PATH``."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write", type=Path, help="write the page here instead of printing it")
    args = parser.parse_args(argv)
    if args.write is None:
        sys.stdout.write(render())
    else:
        args.write.write_text(render(), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
