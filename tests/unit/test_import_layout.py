"""No two modules of ours import each other, directly or round a loop (docs/decisions.md).

Imports under ``TYPE_CHECKING`` and inside functions count too: a loop there still means two
modules that cannot be understood (or moved) one without the other.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("agent", "collector", "fleetwatch", "rules", "dashboards")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    paths = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")]
    known = {module_name(p) for p in paths}
    graph: dict[str, set[str]] = {}
    for path in paths:
        me = module_name(path)
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                targets.update(n for n in names if n in known)
            elif isinstance(node, ast.Import):
                targets.update(a.name for a in node.names if a.name in known)
        targets.discard(me)
        graph[me] = targets
    return graph


def loops(graph: dict[str, set[str]]) -> list[list[str]]:
    """Modules that reach themselves again, grouped: each module's reach, then mutual reach."""
    reach: dict[str, set[str]] = {}
    for start, first in graph.items():
        seen: set[str] = set()
        todo = list(first)
        while todo:
            node = todo.pop()
            if node not in seen:
                seen.add(node)
                todo.extend(graph.get(node, ()))
        reach[start] = seen
    groups: list[list[str]] = []
    placed: set[str] = set()
    for module in sorted(graph):
        if module in placed or module not in reach[module]:
            continue
        group = sorted(m for m in reach[module] if module in reach[m])
        placed.update(group)
        groups.append(group)
    return groups


class TestImportLayout:
    def test_the_graph_sees_real_imports(self):
        """The check reads imports at all: the composition root imports the journal."""
        graph = import_graph()
        assert "collector.store.journal" in graph["collector.main"]
        assert "agent.sim.nvml_lib" in graph["agent.sim.hardware"]

    def test_a_loop_is_found(self):
        """Two modules importing each other, or three round a loop, are named."""
        graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
        assert loops(graph) == [["a", "b", "c"]]

    def test_no_module_of_ours_imports_itself_round_a_loop(self):
        assert loops(import_graph()) == []
