"""The packages depend one way, and no two modules of ours import each other round a loop.

``fleetwatch/`` (the ground) imports nothing of ours; ``rules/`` only the ground; ``agent/`` and
``collector/`` (the two programs) those two and never each other; ``cli/`` (the roof: the
command, the demo, the dev servers) may import everything (docs/architecture.md).

Imports under ``TYPE_CHECKING`` and inside functions count too: a loop there still means two
modules that cannot be understood (or moved) one without the other.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("agent", "collector", "fleetwatch", "rules", "cli", "dashboards")
# What each package may import of ours besides itself (the roof, ``cli``, anything).
MAY_IMPORT = {
    "fleetwatch": frozenset(),
    "rules": frozenset({"fleetwatch"}),
    "agent": frozenset({"fleetwatch", "rules"}),
    "collector": frozenset({"fleetwatch", "rules"}),
    "dashboards": frozenset({"fleetwatch", "collector"}),
    "cli": frozenset(PACKAGES),
}
MAX_MODULE_LINES = 800
# Each program's rooms in the order data flows through them: a room imports only the rooms
# before it, and the modules any room may read (errors, settings, counters). A program's
# ``testing`` module (fakes for tests) comes last.
ROOMS = {
    "agent": (
        "probes",
        "sources",
        "poll",
        "outbox",
        "jobs",
        "preflight",
        "link",
        "<top>",
        "sim",
        "testing",
    ),
    "collector": (
        "store",
        "model",
        "jobs",
        "ingest",
        "actions",
        "incidents",
        "preflight",
        "export",
        "api",
        "<top>",
        "testing",
    ),
}
SHARED_IN_ROOMS = {
    "agent": frozenset({"agent.exceptions", "agent.config", "agent.bmc_config"}),
    "collector": frozenset({"collector.exceptions", "collector.secret_files", "collector.stats"}),
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path, known: set[str]) -> set[str]:
    """The modules of ours ``path`` imports, at its top, under ``TYPE_CHECKING`` or in functions."""
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            targets.update(n for n in names if n in known)
        elif isinstance(node, ast.Import):
            targets.update(a.name for a in node.names if a.name in known)
    return targets


def import_graph() -> dict[str, set[str]]:
    paths = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")]
    known = {module_name(p) for p in paths}
    graph: dict[str, set[str]] = {}
    for path in paths:
        me = module_name(path)
        graph[me] = imported(path, known) - {me}
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

    def test_the_packages_depend_one_way(self):
        assert climbing(import_graph()) == []

    def test_each_program_s_rooms_import_only_the_rooms_before_them(self):
        assert out_of_order(import_graph()) == []

    def test_a_room_importing_a_later_one_is_named(self):
        graph = {
            "collector.model.liveness": {"collector.ingest.session", "collector.store.events"},
            "agent.probes.aer": {"agent.exceptions", "agent.probes.pci"},
        }
        assert out_of_order(graph) == ["collector.model.liveness -> collector.ingest.session"]

    def test_an_import_against_the_rule_is_named(self):
        graph = {"rules.loader": {"agent.poll.ib", "fleetwatch.model"}, "cli.main": {"agent.main"}}
        assert climbing(graph) == ["rules.loader -> agent.poll.ib"]

    def test_a_function_local_import_counts(self, tmp_path: Path):
        module = tmp_path / "m.py"
        module.write_text("def f():\n    from collector.model import fleet\n")
        assert imported(module, {"collector.model.fleet", "collector.model"}) == {
            "collector.model",
            "collector.model.fleet",
        }

    def test_every_name_is_imported_from_the_module_that_defines_it(self):
        """No module passes on another's names: a moved name leaves no old path behind."""
        importers = [
            p
            for folder in (*PACKAGES, "tests", "bench", "scripts")
            for p in (ROOT / folder).rglob("*.py")
        ]
        assert borrowed_imports(importers) == []

    def test_a_borrowed_import_is_named(self, tmp_path: Path):
        """The sampler imports PollResult from the findings; taking it from the sampler is wrong."""
        importer = tmp_path / "m.py"
        importer.write_text("from agent.poll.sampler import PollResult, Sampler\n")
        assert borrowed_imports([importer]) == [f"{importer}:1: PollResult from agent.poll.sampler"]

    def test_no_product_module_is_over_the_line_limit(self):
        long = {
            str(p.relative_to(ROOT)): n
            for pkg in PACKAGES
            for p in (ROOT / pkg).rglob("*.py")
            if "_pb2" not in p.name
            and (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
        }
        assert long == {}


def top_level_names(path: Path) -> set[str]:
    """The names ``path`` defines (functions, classes, assignments), at its top or under an if."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        for sub in ast.walk(node) if isinstance(node, ast.If) else [node]:
            if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(sub.name)
            elif isinstance(sub, (ast.Assign, ast.AnnAssign)):
                targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target]
                names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    return names


def borrowed_imports(importers: list[Path]) -> list[str]:
    """Each ``from ours import name`` where ``ours`` does not define ``name`` but imports it."""
    modules = {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    defined: dict[str, set[str]] = {}
    wrong: list[str] = []
    for path in importers:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.ImportFrom) and node.level == 0):
                continue
            source = node.module or ""
            if source not in modules:
                continue
            if source not in defined:
                defined[source] = top_level_names(modules[source])
            wrong.extend(
                f"{path}:{node.lineno}: {a.name} from {source}"
                for a in node.names
                if f"{source}.{a.name}" not in modules and a.name not in defined[source]
            )
    return wrong


def room(module: str) -> str:
    """The room (sub-package) of a program's module, or "<top>" for a module at its top."""
    parts = module.split(".")
    if len(parts) > 1 and ((ROOT / parts[0] / parts[1]).is_dir() or parts[1] == "testing"):
        return parts[1]
    return "<top>"


def out_of_order(graph: dict[str, set[str]]) -> list[str]:
    """Each import from a room of a program into a later room of it, as "a -> b"."""
    wrong: list[str] = []
    for module, targets in sorted(graph.items()):
        program = module.split(".")[0]
        if program not in ROOMS or module in SHARED_IN_ROOMS[program]:
            continue
        order = ROOMS[program]
        mine = order.index(room(module))
        wrong.extend(
            f"{module} -> {target}"
            for target in sorted(targets)
            if target.split(".")[0] == program
            and target not in SHARED_IN_ROOMS[program]
            and order.index(room(target)) > mine
        )
    return wrong


def climbing(graph: dict[str, set[str]]) -> list[str]:
    """Each import from one package into another that it may not import, as "a -> b"."""
    wrong: list[str] = []
    for module, targets in sorted(graph.items()):
        mine = module.split(".")[0]
        for target in sorted(targets):
            theirs = target.split(".")[0]
            if theirs != mine and theirs not in MAY_IMPORT[mine]:
                wrong.append(f"{module} -> {target}")
    return wrong
