"""``fleetwatch rules check`` and ``fleetwatch rules test``: rule files checked before they ship.

With ``-o json`` each prints one JSON object (``{"ok": ..., ...}``) on standard output instead
of its lines, for CI jobs to read; the exit status is the same.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, TextIO

from rules.exceptions import RulesError

if TYPE_CHECKING:
    from pathlib import Path


def check(paths: list[Path], out: TextIO, err: TextIO, *, output: str = "table") -> int:
    """Load rule files as the collector would; 0 when clean, 1 listing every problem."""
    from rules.loader import load_rules  # noqa: PLC0415 - CEL loads only for these commands

    files = [str(p) for p in paths] or ["built-in rules"]
    try:
        rules = load_rules(paths)
    except RulesError as exc:
        if output == "json":
            print(
                json.dumps({"ok": False, "files": files, "problems": str(exc).splitlines()}),
                file=out,
            )
        else:
            print(exc, file=err)
        return 1
    count = len(rules.rules)
    if output == "json":
        names = [r.name for r in rules.rules]
        print(json.dumps({"ok": True, "files": files, "rules": names}), file=out)
        return 0
    print(f"{', '.join(files)}: {count} rule{'' if count == 1 else 's'}, no problems", file=out)
    return 0


def test(paths: list[Path], out: TextIO, err: TextIO, *, output: str = "table") -> int:  # noqa: PT028 - not a pytest test
    """Run rule test files; 0 when every test passes, 1 otherwise (failures say why)."""
    from collector.incidents.rule_tests import run_file  # noqa: PLC0415

    done: list[dict[str, object]] = []
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
            done.append({"file": str(path), "name": result.name, "failures": list(result.failures)})
            if output == "json":
                continue
            if result.failures:
                print(f"FAIL {path}: {result.name}", file=out)
                for failure in result.failures:
                    print(f"     {failure}", file=out)
            else:
                print(f"ok   {path}: {result.name}", file=out)
    failed = sum(1 for d in done if d["failures"])
    if output == "json":
        summary = {"ok": not failed, "passed": len(done) - failed, "failed": failed, "tests": done}
        print(json.dumps(summary), file=out)
    else:
        print(f"{len(done) - failed} passed, {failed} failed", file=out)
    return 1 if failed else 0


def evaluate(
    api: str,
    path: Path | None,
    out: TextIO,
    token: str | None,
    *,
    output: str = "table",
) -> int:
    """What the rules in ``path`` (None: the running ones) would do on the fleet now.

    The collector evaluates them once on every target and answers what would fire and what
    each action would meet (run, skipped, deferred by a limit, dry run); it changes nothing.
    Exit 0, or 1 when a rule could not be evaluated.
    """
    from cli.api import call, named_gpus  # noqa: PLC0415
    from cli.output import cut, gpu_names, print_json, table  # noqa: PLC0415

    body: dict[str, str] = {}
    if path is not None:
        try:
            body["rules"] = path.read_text("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            msg = f"cannot read {path}: {getattr(exc, 'strerror', exc)}"
            raise ValueError(msg) from exc
    answer = call(api, "POST", "/api/v1/rules/eval", body, token=token, timeout_s=30.0)
    if output == "json":
        print_json(answer, out)
        return 1 if answer.get("errors") else 0
    holds = answer.get("holds", [])
    where = str(path) if path is not None else "the running rules"
    print(
        f"{where}: {answer.get('rules')} rules on {answer.get('targets')} targets, "
        f"{len(holds)} holding now ({answer.get('took_s', 0):.3f} s); nothing was changed",
        file=out,
    )
    if holds:
        named_gpus(api, holds, "evidence")
        rows = [["RULE", "TARGET", "STATE", "ACTIONS", "EVIDENCE"]]
        for h in sorted(holds, key=lambda h: (h["rule"], h["target"])):
            acts = "; ".join(f"{a['action']}: {a['outcome']}" for a in h["actions"]) or "-"
            shown = gpu_names(str(h["evidence"]), h["_gpus"], output)
            rows.append([h["rule"], h["target"], h["state"], acts, cut(shown, output)])
        table(rows, out)
        held_back = [
            (h["rule"], h["target"], a)
            for h in sorted(holds, key=lambda h: (h["rule"], h["target"]))
            for a in h["actions"]
            if a["outcome"] != "would run"
        ]
        if held_back:
            print("\nheld back:", file=out)
            for rule, target, a in held_back:
                why = f"{a['outcome']}: {a['why'] or '-'}"
                print(f"  {rule}: {a['action']} on {target}: {why}", file=out)
    for window in answer.get("unkept_windows", []):
        print(f"note: the running rules keep no window of {window}: read as empty", file=out)
    for rule, error in sorted(answer.get("errors", {}).items()):
        print(f"error: {rule}: {error}", file=out)
    return 1 if answer.get("errors") else 0
