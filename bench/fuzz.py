"""Fuzz the parsers and loaders that take outside input, with the property tests' fuzz profile.

Targets (one property module each, in ``tests/property/``): the protobuf ingest (``wire``), the
kernel log (``kmsg``), the sysfs readers (``sysfs``), the job socket's datagrams
(``job_socket``), the config loaders (``config``), rule files (``rules``), the Xid catalog
(``xid_catalog``), scenario files (``scenario``), what an HTTP client sends the API (headers,
silence ids, bodies: ``api_input``), the BMC's answers (Redfish bodies and documents through the
reader and the poller: ``bmc_redfish``; ``ipmitool`` listings: ``bmc_ipmi``) and a node's
pre-flight results (the wire screen, then the fit to its plan: ``preflight_results``). Each
property says: a valid result or the documented error with a short message that names what was
wrong, nothing else, bounded storage.

Run from the repository root: ``.venv/bin/python bench/fuzz.py [--seconds S] [--examples N]``.
Rounds of ``N`` examples per property, round after round with fresh random seeds, until ``S``
seconds have passed. A property that fails is a crash: its falsifying input is printed, it is
counted and left out of later rounds. ``inputs_tried`` counts every call of a property's body
(shrinking included), as the properties count them. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import logging
import os
import sys
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
MODULES = (
    "test_wire",
    "test_kmsg",
    "test_sysfs",
    "test_job_socket",
    "test_config",
    "test_rules",
    "test_scenario",
    "test_api_input",
    "test_bmc_answers",
    "test_preflight_results",
)


def properties(module: ModuleType) -> list[tuple[str, Callable[[], None]]]:
    """Every hypothesis test of ``module`` (methods of its Test classes too), ready to call."""
    found: list[tuple[str, Callable[[], None]]] = []
    for name, obj in vars(module).items():
        if inspect.isclass(obj) and name.startswith("Test"):
            instance = obj()
            for method in sorted(vars(obj)):
                bound = getattr(instance, method)
                if method.startswith("test_") and hasattr(bound, "hypothesis"):
                    found.append((f"{module.__name__}::{name}::{method}", bound))
        elif name.startswith("test_") and hasattr(obj, "hypothesis"):
            found.append((f"{module.__name__}::{name}", obj))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=120.0, help="how long to fuzz")
    parser.add_argument("--examples", type=int, default=500, help="examples per property a round")
    args = parser.parse_args()

    os.environ["HYPOTHESIS_PROFILE"] = "fuzz"
    sys.path.insert(0, str(ROOT))
    import structlog
    from hypothesis import settings

    # The readers log what they skip; thousands of inputs a second would bury the report.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))

    importlib.import_module("tests.property.conftest")  # registers and loads the fuzz profile
    hostile = importlib.import_module("tests.property.hostile")
    settings.register_profile(
        "fuzz-round", settings.get_profile("fuzz"), max_examples=args.examples
    )
    settings.load_profile("fuzz-round")

    todo = [p for m in MODULES for p in properties(importlib.import_module(f"tests.property.{m}"))]
    crashes: Counter[str] = Counter()
    found: list[dict[str, str]] = []
    start = time.monotonic()
    rounds = 0
    while todo and time.monotonic() - start < args.seconds:
        rounds += 1
        for name, test in list(todo):
            if time.monotonic() - start >= args.seconds:
                break
            try:
                test()
            except Exception as exc:  # noqa: BLE001 - a crash is what we are looking for
                target = hostile.LAST[0]
                crashes[target] += 1
                found.append({"target": target, "property": name, "error": repr(exc)[:300]})
                traceback.print_exc()
                todo.remove((name, test))
        done = sum(hostile.TRIED.values())
        print(f"round {rounds}: {done} inputs, {sum(crashes.values())} crashes", flush=True)
    elapsed = time.monotonic() - start
    targets = [
        {"target": t, "inputs_tried": n, "crashes": crashes[t]}
        for t, n in sorted(hostile.TRIED.items())
    ]
    for entry in found:
        print(f"CRASH {entry['target']}: {entry['property']}: {entry['error']}")
    print(
        json.dumps(
            {
                "inputs_tried": sum(hostile.TRIED.values()),
                "crashes": sum(crashes.values()),
                "seconds": round(elapsed, 1),
                "rounds": rounds,
                "targets": targets,
                "crash_details": found,
            }
        )
    )


if __name__ == "__main__":
    main()
