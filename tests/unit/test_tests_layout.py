"""The unit tests mirror the packages, and no test file imports from another test file."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "tests" / "unit"


def test_each_unit_test_folder_mirrors_a_package_folder():
    folders = {p.parent.relative_to(UNIT) for p in UNIT.rglob("test_*.py")} - {Path()}
    assert sorted(str(f) for f in folders if not (ROOT / f).is_dir()) == []


def test_no_test_file_imports_from_another_test_file():
    borrowed = []
    for path in (ROOT / "tests").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom) or not node.module:
                continue
            if node.module.split(".")[-1].startswith("test_"):
                borrowed.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.module}")
    assert borrowed == []
