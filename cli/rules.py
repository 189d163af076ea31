"""``fleetwatch rules check`` and ``fleetwatch rules test``: rule files checked before they ship."""

from __future__ import annotations

from typing import TYPE_CHECKING, TextIO

from rules.exceptions import RulesError

if TYPE_CHECKING:
    from pathlib import Path


def check(paths: list[Path], out: TextIO, err: TextIO) -> int:
    """Load rule files as the collector would; 0 when clean, 1 listing every problem."""
    from rules.loader import load_rules  # noqa: PLC0415 - CEL loads only for these commands

    try:
        rules = load_rules(paths)
    except RulesError as exc:
        print(exc, file=err)
        return 1
    where = ", ".join(map(str, paths)) or "built-in rules"
    count = len(rules.rules)
    print(f"{where}: {count} rule{'' if count == 1 else 's'}, no problems", file=out)
    return 0


def test(paths: list[Path], out: TextIO, err: TextIO) -> int:
    """Run rule test files; 0 when every test passes, 1 otherwise (failures say why)."""
    from collector.incidents.rule_tests import run_file  # noqa: PLC0415

    failed = total = 0
    for path in paths:
        try:
            results = run_file(path)
        except RulesError as exc:
            print(exc, file=err)
            return 1
        if not results:
            print(f"{path}: no tests", file=err)
            return 1
        for result in results:
            total += 1
            if result.failures:
                failed += 1
                print(f"FAIL {path}: {result.name}", file=out)
                for failure in result.failures:
                    print(f"     {failure}", file=out)
            else:
                print(f"ok   {path}: {result.name}", file=out)
    print(f"{total - failed} passed, {failed} failed", file=out)
    return 1 if failed else 0
