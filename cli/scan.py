"""``fleetwatch scan FILE|-``: the agent's kernel-log parsers over a node's saved logs.

What on-call runs after the fact, on ``dmesg -T`` output, ``journalctl -k`` (any of the short
forms) or a syslog file: a table of the hardware faults found, or ``--json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    import argparse

    from agent.probes.log_scan import Finding

EXIT_CLEAN = 0
EXIT_FAULTS = 1
EXIT_UNREADABLE = 2
_DETAIL_WIDTH = 90

HELP = """\
Scan a saved kernel log for hardware faults, with the parsers the agent runs on /dev/kmsg:
NVIDIA Xid and SXid lines, PCIe AER reports and how their recovery ended, CPU machine checks,
filesystem errors and read-only remounts. FILE is the output of `dmesg`, `dmesg -T`,
`journalctl -k` (-o short, short-precise, short-iso), a syslog file, or - for standard input.
Each kind of fault on each component is one row, with how many lines showed it and when.
In a syslog file, a line is a kernel line when its program is "kernel": any user can write
such lines (`logger -t kernel`), so a syslog file shows what was logged, not what the kernel
said. A line no parser can read is counted and named on stderr; the scan goes on.
Control characters in the log are shown escaped (\\x1b), never sent to the terminal.

exit status: 0 no fault found, 1 faults found, 2 the file could not be read.
"""

# C0 and C1 control characters (and DEL) as escapes: a log line must not drive the terminal.
_ESCAPES: dict[int, str] = {
    c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0)) if c != ord("\t")
} | {ord("\t"): " "}


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``scan`` to the command's subcommands."""
    from argparse import RawDescriptionHelpFormatter  # noqa: PLC0415

    scan = sub.add_parser(
        "scan",
        help="find hardware faults in a saved dmesg/journal/syslog file (exit 1 when found)",
        description=HELP,
        formatter_class=RawDescriptionHelpFormatter,
    )
    scan.add_argument("file", help="the log file, or - for standard input")
    scan.add_argument("--json", action="store_true", help="print the findings as JSON")
    scan.add_argument("--xid-catalog", type=Path, help="the Xid catalog (default: built-in)")


def run(args: argparse.Namespace) -> int:
    """Run ``fleetwatch scan`` with the process's standard streams."""
    return scan(
        args.file,
        as_json=args.json,
        catalog_path=args.xid_catalog,
        stdin=sys.stdin,
        out=sys.stdout,
        err=sys.stderr,
    )


def scan(  # noqa: PLR0913 - the command's inputs and outputs
    file: str,
    *,
    as_json: bool,
    catalog_path: Path | None,
    stdin: TextIO,
    out: TextIO,
    err: TextIO,
) -> int:
    """Scan ``file`` (``-``: ``stdin``); print the faults; 0 none, 1 some, 2 unreadable."""
    from agent.probes.log_scan import LogScanner  # noqa: PLC0415
    from rules.xid_catalog import load_catalog  # noqa: PLC0415

    scanner = LogScanner(load_catalog(catalog_path))
    try:
        if file == "-":
            scanner.feed_all(stdin)
        else:
            with Path(file).open(encoding="utf-8", errors="replace") as lines:
                scanner.feed_all(lines)
    except OSError as exc:
        print(f"fleetwatch scan: cannot read {file}: {exc.strerror or exc}", file=err)
        return EXIT_UNREADABLE
    if scanner.first_unparsed is not None:
        number, why = scanner.first_unparsed
        print(
            f"fleetwatch scan: {file}: {scanner.unparsed:,} line(s) could not be parsed and were "
            f"skipped (first: line {number}: {why})".translate(_ESCAPES),
            file=err,
        )
    found = scanner.findings()
    if as_json:
        body = {
            "file": file,
            "lines": scanner.lines,
            "kernel_lines": scanner.kernel_lines,
            "unparsed_lines": scanner.unparsed,
            "findings": [f.as_dict() for f in found],
        }
        print(json.dumps(body, indent=2), file=out)
    else:
        _table(found, scanner.lines, out)
    return EXIT_FAULTS if found else EXIT_CLEAN


def _table(found: list[Finding], lines: int, out: TextIO) -> None:
    if not found:
        print(f"no hardware faults in {lines:,} lines", file=out)
        return
    hosts = any(f.host for f in found)
    header = ["FIRST", "LAST", "COUNT", *(["HOST"] if hosts else []), "KIND", "COMPONENT", "DETAIL"]
    rows = [header]
    for f in found:
        what = f"{f.kind} {f.number}" if f.number is not None else f.kind
        detail = f"{f.name}: {f.detail}" if f.name else f.detail
        if len(detail) > _DETAIL_WIDTH:
            detail = detail[: _DETAIL_WIDTH - 3] + "..."
        row = [f.first or "-", f.last or "-", str(f.count)]
        row += [f.host or "-"] if hosts else []
        row += [what, f.component, detail]
        rows.append([cell.translate(_ESCAPES) for cell in row])
    widths = [max(len(r[i]) for r in rows) for i in range(len(header) - 1)]
    for row in rows:
        cells = [cell.ljust(w) for cell, w in zip(row, widths, strict=False)]
        print("  ".join([*cells, row[-1]]).rstrip(), file=out)
    total = sum(f.count for f in found)
    kinds = len(found)
    print(f"{kinds} fault{'s' if kinds != 1 else ''} ({total} lines) in {lines:,} lines", file=out)
