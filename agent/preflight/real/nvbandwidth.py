"""GPU-to-GPU and host<->device bandwidth with NVIDIA's ``nvbandwidth``.

The tool (github.com/NVIDIA/nvbandwidth) runs named testcases and prints, for each, a line
``Running <testcase>.``, then one matrix per result, each under a title that ends in
``bandwidth (GB/s)``: a header of column indices, then one row per source (``N/A`` where a
pair was not measured, such as a GPU with itself), then a blank line; ``SUM <testcase> <value>``
closes the testcase in recent versions. A testcase it cannot run prints ``Waived: ...``.
The bidirectional device-to-device testcase prints three matrices in recent versions (Read1,
Read2 and their Total); versions before that printed one matrix, the measured direction while
the other ran, so there the total is the sum of the two directions.

Indices are those of the devices the tool sees; we set ``CUDA_VISIBLE_DEVICES`` to the GPUs
asked for, so index ``k`` is ``gpus[k]``.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from itertools import combinations, permutations
from typing import TYPE_CHECKING, Final

from agent.preflight.real.process import ToolRun, find_tool, run_tool
from fleetwatch.preflight.vocabulary import Check, Measurement

if TYPE_CHECKING:
    from collections.abc import Sequence

TOOL: Final = "nvbandwidth"
D2D_READ: Final = "device_to_device_memcpy_read_ce"
D2D_BIDIR: Final = "device_to_device_bidirectional_memcpy_read_ce"
H2D: Final = "host_to_device_memcpy_ce"
D2H: Final = "device_to_host_memcpy_ce"
UNIT: Final = "GB/s"
_RUNNING: Final = re.compile(r"^Running (\S+?)\.?\s*$")
_SUM: Final = re.compile(r"^SUM (\S+) ([0-9.]+)\s*$")
_STATUS: Final = re.compile(r"^(Waived|ERROR|Error)\s*:?\s*(.*)$")


@dataclass(slots=True)
class Matrix:
    """One printed matrix: its title, column indices and rows (None where ``N/A``)."""

    title: str
    columns: list[int]
    rows: dict[int, list[float | None]] = field(default_factory=dict)

    def value(self, row: int, column: int) -> float | None:
        """The value at (row, column), None when not printed or ``N/A``."""
        values = self.rows.get(row)
        if values is None or column not in self.columns:
            return None
        return values[self.columns.index(column)]


@dataclass(slots=True)
class Testcase:
    """What nvbandwidth printed for one testcase."""

    name: str
    matrices: list[Matrix] = field(default_factory=list)
    status: str = ""  # "Waived: ..." or an error line
    total: float | None = None  # the SUM line

    def matrix(self, word: str = "") -> Matrix | None:
        """The first matrix whose title holds ``word`` (any matrix when empty)."""
        for matrix in self.matrices:
            if word.lower() in matrix.title.lower():
                return matrix
        return None


def _number(token: str) -> float | None:
    if token.upper() == "N/A":
        return None
    try:
        value = float(token)
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def parse(text: str) -> dict[str, Testcase]:
    """Every testcase in nvbandwidth's plain-text output, by name."""
    cases: dict[str, Testcase] = {}
    current: Testcase | None = None
    matrix: Matrix | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            matrix = None
            continue
        if running := _RUNNING.match(line):
            current = cases.setdefault(running.group(1), Testcase(running.group(1)))
            matrix = None
        elif total := _SUM.match(line):
            case = cases.setdefault(total.group(1), Testcase(total.group(1)))
            case.total = float(total.group(2))
        elif current is None:
            continue
        elif status := _STATUS.match(line):
            current.status = f"{status.group(1)}: {status.group(2)}".strip()
        elif "bandwidth" in line.lower() and "(GB/s)" in line:
            matrix = Matrix(line, [])
            current.matrices.append(matrix)
        elif matrix is not None:
            _matrix_line(matrix, line.split())
    return cases


def _matrix_line(matrix: Matrix, tokens: list[str]) -> None:
    if not matrix.columns:
        if tokens and all(t.isdigit() for t in tokens):
            matrix.columns = [int(t) for t in tokens]
        return
    if not tokens or not tokens[0].isdigit() or len(tokens) != len(matrix.columns) + 1:
        return  # not a row of this matrix (a warning line in between)
    matrix.rows[int(tokens[0])] = [_number(t) for t in tokens[1:]]


def _env(gpus: Sequence[int]) -> dict[str, str]:
    env = dict(os.environ)
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
    return env


def _failed(checks: list[tuple[Check, str]], why: str, evidence: str = "") -> list[Measurement]:
    return [Measurement(c, comp, None, UNIT, error=why, evidence=evidence) for c, comp in checks]


def _pair(i: int, j: int) -> str:
    return f"gpu:{i}-gpu:{j}"


class NvbandwidthPair:
    """``p2p_bw`` (device-to-device read, copy engine) and ``p2p_bidir_bw`` with nvbandwidth."""

    def __init__(self, tool: str, extra_args: Sequence[str] = ()) -> None:
        """``tool``: the nvbandwidth binary; ``extra_args`` e.g. ``("--bufferSize", "...")``."""
        self.tool = tool
        self.extra_args = tuple(extra_args)

    def measure(self, gpus: Sequence[int], timeout_s: float) -> list[Measurement]:
        """One run of both testcases over ``gpus``."""
        ordered = [(Check.P2P_BW, _pair(a, b)) for a, b in permutations(gpus, 2)]
        pairs = [(Check.P2P_BIDIR_BW, _pair(a, b)) for a, b in combinations(sorted(gpus), 2)]
        if len(gpus) < 2:  # noqa: PLR2004 - a pair
            return []
        run = run_tool(
            [self.tool, "-t", D2D_READ, D2D_BIDIR, *self.extra_args], timeout_s, env=_env(gpus)
        )
        if not run.ok:
            return _failed(ordered + pairs, run.why_not(), run.evidence())
        cases = parse(run.stdout)
        return _read_pairs(cases.get(D2D_READ), gpus, run) + _bidir_pairs(
            cases.get(D2D_BIDIR), gpus, run
        )


def _missing(case: Testcase | None, name: str) -> str:
    if case is None:
        return f"nvbandwidth printed no {name} results"
    if case.status:
        return f"nvbandwidth {name}: {case.status}"
    return f"nvbandwidth printed no matrix for {name}" if not case.matrices else ""


def _read_pairs(case: Testcase | None, gpus: Sequence[int], run: ToolRun) -> list[Measurement]:
    why = _missing(case, D2D_READ)
    matrix = case.matrix() if case is not None else None
    out: list[Measurement] = []
    for a, b in permutations(range(len(gpus)), 2):
        component = _pair(gpus[a], gpus[b])
        value = matrix.value(a, b) if matrix is not None else None
        error = why or (
            ""
            if value is not None
            else f"nvbandwidth printed no value for GPU {gpus[a]} -> {gpus[b]}"
        )
        out.append(
            Measurement(
                Check.P2P_BW,
                component,
                value if not error else None,
                UNIT,
                error=error,
                evidence="" if not error else run.evidence(),
            )
        )
    return out


def _bidir_pairs(case: Testcase | None, gpus: Sequence[int], run: ToolRun) -> list[Measurement]:
    why = _missing(case, D2D_BIDIR)
    total = case.matrix("total") if case is not None else None
    single = case.matrix() if case is not None else None
    out: list[Measurement] = []
    for a, b in combinations(range(len(gpus)), 2):
        low, high = sorted((gpus[a], gpus[b]))
        component = _pair(low, high)
        value: float | None = None
        if total is not None:
            both = [v for v in (total.value(a, b), total.value(b, a)) if v is not None]
            value = min(both) if both else None
        elif single is not None:
            there, back = single.value(a, b), single.value(b, a)
            value = there + back if there is not None and back is not None else None
        error = why or (
            "" if value is not None else f"nvbandwidth printed no value for GPUs {low} <-> {high}"
        )
        out.append(
            Measurement(
                Check.P2P_BIDIR_BW,
                component,
                value if not error else None,
                UNIT,
                error=error,
                evidence="" if not error else run.evidence(),
            )
        )
    return out


class NvbandwidthHost:
    """``h2d_bw`` and ``d2h_bw`` (copy engine, pageable-free pinned host memory) per GPU."""

    def __init__(self, tool: str, extra_args: Sequence[str] = ()) -> None:
        """``tool``: the nvbandwidth binary."""
        self.tool = tool
        self.extra_args = tuple(extra_args)

    def measure(self, gpus: Sequence[int], timeout_s: float) -> list[Measurement]:
        """One run of both testcases over ``gpus``."""
        wanted = [(c, f"gpu:{g}") for c in (Check.H2D_BW, Check.D2H_BW) for g in gpus]
        if not gpus:
            return []
        run = run_tool([self.tool, "-t", H2D, D2H, *self.extra_args], timeout_s, env=_env(gpus))
        if not run.ok:
            return _failed(wanted, run.why_not(), run.evidence())
        cases = parse(run.stdout)
        out: list[Measurement] = []
        for check, name in ((Check.H2D_BW, H2D), (Check.D2H_BW, D2H)):
            case = cases.get(name)
            why = _missing(case, name)
            matrix = case.matrix() if case is not None else None
            for index, gpu in enumerate(gpus):
                value = matrix.value(0, index) if matrix is not None else None
                error = why or (
                    "" if value is not None else f"nvbandwidth printed no value for GPU {gpu}"
                )
                out.append(
                    Measurement(
                        check,
                        f"gpu:{gpu}",
                        value if not error else None,
                        UNIT,
                        error=error,
                        evidence="" if not error else run.evidence(),
                    )
                )
        return out


def find(search_path: str | None = None) -> str | None:
    """The path of nvbandwidth, or None when it is not installed."""
    return find_tool(TOOL, search_path)
