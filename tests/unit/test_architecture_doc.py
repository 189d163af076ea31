"""docs/architecture.md names every product module, in the section of its room, and README agrees.

A module is named when its path from the repository root appears in the page, or when its file
name appears in a section whose heading names its folder (``### agent/poll/``).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "architecture.md"
PACKAGES = ("fleetwatch", "rules", "agent", "collector", "cli")
MEASURED = re.compile(r"\b(?:median|medians|p50|p95|p99)\b", re.IGNORECASE)
FIGURE = re.compile(r"\d[\d.,]*\s?(?:µs|us|ms|s|MB|x)\b")


def product_modules() -> list[Path]:
    return sorted(
        p.relative_to(ROOT)
        for pkg in PACKAGES
        for p in (ROOT / pkg).rglob("*.py")
        if "_pb2" not in p.name and p.name != "__init__.py"
    )


def sections(text: str) -> list[tuple[str, str]]:
    """(heading, body) of each section of a Markdown page."""
    parts = re.split(r"^(#{1,4} .*)$", text, flags=re.MULTILINE)
    return [(parts[i], parts[i + 1]) for i in range(1, len(parts) - 1, 2)]


def unnamed(text: str, modules: list[Path]) -> list[str]:
    by_folder: dict[str, str] = {}
    for heading, body in sections(text):
        for folder in re.findall(r"`([\w/]+/)`", heading):
            by_folder[folder] = by_folder.get(folder, "") + body
    missing = []
    for module in modules:
        path = module.as_posix()
        folder = module.parent.as_posix() + "/"
        if f"`{path}`" in text or f"`{module.name}`" in by_folder.get(folder, ""):
            continue
        missing.append(path)
    return missing


def test_the_page_names_every_product_module_in_its_room():
    assert unnamed(PAGE.read_text(encoding="utf-8"), product_modules()) == []


def test_a_module_named_only_outside_its_room_is_missing():
    text = "## `agent/poll/`\n\n`sampler.py` polls.\n\n## `agent/link/`\n\n`ib.py` is not here.\n"
    modules = [Path("agent/poll/sampler.py"), Path("agent/poll/ib.py")]
    assert unnamed(text, modules) == ["agent/poll/ib.py"]


def test_the_page_states_the_dependency_rule():
    text = PAGE.read_text(encoding="utf-8")
    assert "imports nothing of ours" in text
    assert "tests/unit/test_import_layout.py" in text


def test_benchmark_figures_live_in_performance_md_only():
    """The page links to performance.md for what things cost; it quotes no measured figure."""
    text = PAGE.read_text(encoding="utf-8")
    paragraphs = text.split("\n\n")
    quoted = [p[:80] for p in paragraphs if "bench/" in p and FIGURE.search(p)]
    assert (MEASURED.findall(text), quoted) == ([], [])
    assert "performance.md" in text


def test_the_readme_layout_table_names_every_package():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    layout = readme[readme.index("## Layout") :]
    for package in (*PACKAGES, "dashboards", "deploy", "bench", "docs", "tests"):
        assert f"`{package}/`" in layout, package
