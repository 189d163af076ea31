"""Write every dashboard's JSON for Grafana: ``python -m dashboards.build [--out DIR]``.

``make dashboards`` runs this into ``dashboards/json/``, which is committed; a test regenerates
the files and fails when they differ, so a dashboard edited without regenerating is caught.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Final

from grafana_foundation_sdk.cog.encoder import JSONEncoder

from dashboards import fleet_overview, job_health, node_detail, preflight, reliability

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from grafana_foundation_sdk.models.dashboard import Dashboard

OUT: Final = Path(__file__).parent / "json"
DASHBOARDS: Final[tuple[Callable[[], Dashboard], ...]] = (
    fleet_overview.build,
    node_detail.build,
    job_health.build,
    reliability.build,
    preflight.build,
)


def render(dashboard: Dashboard) -> str:
    """The dashboard as Grafana JSON: keys sorted, indented, one trailing newline."""
    return json.dumps(dashboard, cls=JSONEncoder, sort_keys=True, indent=2) + "\n"


def write_all(out: Path) -> list[Path]:
    """Write ``<uid>.json`` for every dashboard into ``out``; return the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for build in DASHBOARDS:
        dashboard = build()
        path = out / f"{dashboard.uid}.json"
        path.write_text(render(dashboard), encoding="utf-8")
        written.append(path)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    """Regenerate the dashboards' JSON."""
    parser = argparse.ArgumentParser(prog="python -m dashboards.build", description=__doc__)
    parser.add_argument("--out", type=Path, default=OUT, help=f"folder (default: {OUT})")
    args = parser.parse_args(argv)
    for path in write_all(args.out):
        print(path)  # noqa: T201 - says what it wrote
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
