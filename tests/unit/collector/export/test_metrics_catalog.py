import re
from pathlib import Path

from collector.export.catalog import NODE_STATES, by_name, catalog
from collector.export.catalog_doc import main, render

DOC = Path(__file__).parents[4] / "docs" / "metrics.md"
BASE_UNITS = {"", "seconds", "bytes", "celsius", "watts", "hertz", "ratio", "transfers_per_second"}


def test_the_committed_catalog_page_is_current():
    """docs/metrics.md is what the catalog renders: run
    `python -m collector.export.catalog_doc --write docs/metrics.md` after changing a metric."""
    assert DOC.read_text(encoding="utf-8") == render()


def test_every_metric_is_in_the_page_with_its_labels():
    page = render()
    for spec in catalog():
        row = next(line for line in page.splitlines() if line.startswith(f"| `{spec.name}` |"))
        for label in spec.labels:
            assert f"`{label}`" in row, (spec.name, label)


def test_names_follow_the_prometheus_conventions():
    names = [s.name for s in catalog()]
    assert len(names) == len(set(names))
    for spec in catalog():
        assert re.fullmatch(r"fleetwatch_[a-z0-9_]+", spec.name), spec.name
        assert spec.name.endswith("_total") == (spec.kind == "counter"), spec.name
        assert spec.unit in BASE_UNITS, spec.name
        stem = spec.name.removesuffix("_total")
        if spec.unit:
            assert stem.endswith(f"_{spec.unit}"), f"{spec.name} does not end in its unit"
        assert "hours" not in spec.name, spec.name
        assert "milli" not in spec.name, spec.name
        assert spec.help.endswith("."), spec.name
        assert not {"le", "quantile"} & set(spec.labels), spec.name


def test_the_node_state_help_names_every_state():
    """metrics.toml spells the states out in fleetwatch_node_state's help: they are NODE_STATES."""
    assert ", ".join(NODE_STATES) in by_name()["fleetwatch_node_state"].help


def test_the_writer_writes_the_page(tmp_path):
    out = tmp_path / "metrics.md"
    assert main(["--write", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == render()
