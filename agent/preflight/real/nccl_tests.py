"""Single-node all-reduce bus bandwidth with nccl-tests' ``all_reduce_perf``.

``all_reduce_perf -b S -e S -g G`` runs G ranks in one process (NVIDIA/nccl-tests). It prints
``#`` comment lines (its options, the devices), a two-line column header (shown cut here)::

    #  size  count  type  redop  root  time  algbw  busbw #wrong  time  algbw  busbw #wrong
    #   (B) (elements)                 (us) (GB/s) (GB/s)         (us) (GB/s) (GB/s)

then one row per size: out-of-place time, algbw, busbw and wrong-value count, then the same
in place (``#wrong`` is ``N/A`` when checking is off; versions before 2.10 have no ``root``
column, so columns are found by name), and it ends with ``# Out of bounds values : 0 OK`` and
``# Avg bus bandwidth    : <GB/s>``. We keep the out-of-place bus bandwidth of the largest
size, and fail the run when any value was wrong.

Across nodes nccl-tests needs MPI to start its ranks; the agents do not run MPI, so a
multi-node group uses the torch.distributed NCCL collective instead (``TorchCollective``).
"""

from __future__ import annotations

import math
import os
import re
from typing import TYPE_CHECKING, Final

from agent.preflight.real.process import find_tool, run_tool
from fleetwatch.preflight.vocabulary import Check, Measurement

if TYPE_CHECKING:
    from collections.abc import Mapping

    from agent.preflight.runners import Collective, Group

TOOL: Final = "all_reduce_perf"
UNIT: Final = "GB/s"
WARMUP: Final = 5
ITERS: Final = 20
_AVG: Final = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(\S+)")
_OOB: Final = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)\s*(\w+)")


def parse(text: str) -> tuple[float | None, str, float | None]:
    """(busbw GB/s of the largest size, why not, the ``Avg bus bandwidth`` line's value)."""
    table = _Table()
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("#"):
            table.comment(line)
        elif (why := table.row(line)) is not None:
            return None, why, table.average
    return table.result()


class _Table:
    def __init__(self) -> None:
        self.columns: list[str] = []
        self.best: tuple[int, float] | None = None
        self.average: float | None = None
        self.wrong = 0
        self.failed = ""

    def comment(self, line: str) -> None:
        body = line.lstrip("#").split()
        if "size" in body and "busbw" in body and not self.columns:
            self.columns = body
        if avg := _AVG.match(line):
            self.average = _float(avg.group(1))
        if (oob := _OOB.match(line)) and oob.group(2).upper() != "OK":
            self.failed = f"all_reduce_perf: {oob.group(1)} values out of bounds"

    def row(self, line: str) -> str | None:
        """None when fine (or not a row); otherwise why the row cannot be read."""
        fields = line.split()
        if not self.columns or not fields or not fields[0].isdigit():
            return None
        if len(fields) != len(self.columns):
            return None  # a log line (NCCL INFO ...) that starts with a number
        row = _row(self.columns, fields)
        if row is None:
            return f"all_reduce_perf printed a row it could not read: {line[:120]!r}"
        size, busbw, bad = row
        self.wrong += bad
        if self.best is None or size >= self.best[0]:
            self.best = (size, busbw)
        return None

    def result(self) -> tuple[float | None, str, float | None]:
        if not self.columns:
            return None, "all_reduce_perf printed no results table", self.average
        if self.best is None:
            return None, "all_reduce_perf's results table is empty", self.average
        if self.wrong:
            why = f"all_reduce_perf: {self.wrong} wrong values (a GPU or link corrupts data)"
            return None, why, self.average
        if self.failed:
            return None, self.failed, self.average
        return self.best[1], "", self.average


def _float(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if value >= 0 and value != float("inf") else None


def _row(columns: list[str], fields: list[str]) -> tuple[int, float, int] | None:
    busbw = _float(fields[columns.index("busbw")])
    if busbw is None:
        return None
    # "#wrong" counts wrong values ("N/A" when not checked), out of place and in place; older
    # versions print "error", the largest deviation found, where anything above 0 is wrong
    bad = 0
    for index, name in enumerate(columns):
        if name in {"#wrong", "error"} and (wrong := _float(fields[index])) is not None:
            bad += math.ceil(wrong) if name == "#wrong" else int(wrong > 0)
    return int(fields[0]), busbw, bad


class AllReducePerf:
    """The :class:`~agent.preflight.runners.Collective` for one-node groups, over nccl-tests.

    A multi-node group goes to ``multi_node`` (the torch.distributed runner).
    """

    def __init__(
        self, tool: str, multi_node: Collective, env: Mapping[str, str] | None = None
    ) -> None:
        """``tool``: the binary; ``env``: added to the tool's environment (NCCL_* settings)."""
        self.tool = tool
        self.multi_node = multi_node
        self.env = dict(env or {})

    def argv(self, group: Group) -> list[str]:
        """The command line: one size, the group's GPUs, checking on."""
        size = str(group.size_bytes)
        return [
            self.tool,
            *("-b", size, "-e", size, "-f", "2"),
            *("-g", str(group.gpus_per_node)),
            *("-w", str(WARMUP), "-n", str(ITERS), "-c", "1"),
        ]

    def all_reduce(self, group: Group) -> Measurement:
        """``allreduce_node`` from all_reduce_perf; a multi-node group runs torch's."""
        if len(group.nodes) > 1:
            return self.multi_node.all_reduce(group)
        run = run_tool(self.argv(group), group.timeout_s, env={**os.environ, **self.env})
        if not run.ok:
            return Measurement(
                Check.ALLREDUCE_NODE,
                "node",
                None,
                UNIT,
                error=run.why_not(),
                evidence=run.evidence(),
            )
        value, why, average = parse(run.stdout)
        evidence = run.evidence()
        if average is not None:
            evidence = f"avg busbw {average:g} GB/s; " + evidence
        return Measurement(Check.ALLREDUCE_NODE, "node", value, UNIT, error=why, evidence=evidence)


def find(search_path: str | None = None) -> str | None:
    """all_reduce_perf's path, or None when nccl-tests is not installed."""
    return find_tool(TOOL, search_path)
