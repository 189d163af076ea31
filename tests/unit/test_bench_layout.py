"""No benchmark imports another: what they share is in ``bench/helpers/`` (bench/README.md).

A module that runs as a script (``python bench/NAME.py``) and imports ``bench.*`` puts the
repository root on ``sys.path`` first, with one line; a module that is only imported leaves
``sys.path`` alone.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
ROOT_LINE = re.compile(
    r"^sys\.path\.insert\(0, str\(Path\(__file__\)\.resolve\(\)\.parents\[(\d)\]\)\)", re.MULTILINE
)


def bench_modules() -> dict[str, Path]:
    """Every module under ``bench/`` by its dotted name."""
    out = {}
    for path in BENCH.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def scripts() -> set[str]:
    """The benchmarks: the scripts at the top of ``bench/``."""
    return {f"bench.{p.stem}" for p in BENCH.glob("*.py") if p.stem != "__init__"}


def bench_imports(path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` for each import of a module of ``bench/``, or of a bare name of one."""
    bare = {p.stem for p in BENCH.glob("*.py")} | {p.name for p in BENCH.iterdir() if p.is_dir()}
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found.extend(
            (node.lineno, n) for n in names if n.split(".")[0] == "bench" or n.split(".")[0] in bare
        )
    return found


def runs_as_script(path: Path) -> bool:
    return 'if __name__ == "__main__":' in path.read_text(encoding="utf-8")


class TestBenchLayout:
    def test_no_benchmark_imports_another(self):
        """Neither a benchmark nor a part of one imports a script at the top of bench/."""
        wrong = [
            f"{path.relative_to(ROOT)}:{line}: {name}"
            for path in bench_modules().values()
            for line, name in bench_imports(path)
            if name in scripts() or f"bench.{name}" in scripts()
        ]
        assert wrong == []

    def test_bench_modules_import_each_other_as_bench(self):
        """Every import of bench's modules names one that exists, through the package."""
        modules = bench_modules()
        wrong = [
            f"{path.relative_to(ROOT)}:{line}: {name}"
            for path in modules.values()
            for line, name in bench_imports(path)
            if name not in modules
        ]
        assert wrong == []

    def test_a_script_that_imports_bench_puts_the_root_on_sys_path(self):
        """The one line names the repository root; only modules run as scripts have it."""
        wrong = []
        for name, path in sorted(bench_modules().items()):
            text = path.read_text(encoding="utf-8")
            depths = [int(d) for d in ROOT_LINE.findall(text)]
            if runs_as_script(path) and bench_imports(path):
                if [path.parents[d] for d in depths] != [ROOT]:
                    wrong.append(f"{name}: no one line putting the repository root on sys.path")
            elif depths:
                wrong.append(f"{name}: changes sys.path but imports no bench module as a script")
        assert wrong == []

    def test_a_benchmark_importing_another_is_named(self, tmp_path: Path):
        """The check reads real imports: a part that borrows from a benchmark is found."""
        module = tmp_path / "m.py"
        module.write_text("from fault_to_action import FAULTS\nfrom bench.helpers import cpu\n")
        assert bench_imports(module) == [(1, "fault_to_action"), (2, "bench.helpers")]
