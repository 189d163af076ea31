"""InfiniBand write bandwidth per rail with perftest's ``ib_write_bw`` (Debian: ``perftest``).

One node serves (``ib_write_bw -d HCA -i PORT -p TCP ...``), the other connects to it (the same
and the server's address). Both print a banner, the queue pairs' addresses, then a results
table between dashed lines (linux-rdma/perftest)::

     #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]
     1048576    23045            0.00               386.52              0.046081

With ``--report_gbits`` the bandwidths are in Gb/s (otherwise MiB/s: ``BW average[MiB/sec]``,
``MB/sec`` in older builds, both 2**20 bytes); with ``-D`` (a duration) the peak column is not
measured and shows 0, so the average is the number we keep. A warning such as the CPU frequency
one may sit between the header and the row. ``--use_cuda=<gpu>`` (GPUDirect RDMA) exists only in
builds with CUDA; Debian's has none, and then host memory is used and the evidence says so.
"""

from __future__ import annotations

import math
import re
import time
from typing import TYPE_CHECKING, Final

from agent.preflight.real.process import ToolRun, find_tool, run_tool
from fleetwatch.preflight.vocabulary import Check, Measurement

if TYPE_CHECKING:
    from agent.preflight.runners import Rail

TOOL: Final = "ib_write_bw"
UNIT: Final = "Gb/s"
DEFAULT_SIZE: Final = 1 << 20  # bytes a message: past the size where NDR reaches line rate
DEFAULT_DURATION_S: Final = 5
DEFAULT_QPS: Final = 4  # queue pairs: one alone may not fill an NDR port
RETRY_S: Final = 0.5  # the client retries while the server is not listening yet
_HEADER: Final = re.compile(r"#bytes.*BW average\[(\w+)/sec\]", re.IGNORECASE)
_MIB_TO_GBIT: Final = 8 * (1 << 20) / 1e9


def parse(text: str) -> tuple[float | None, str]:
    """(average bandwidth in Gb/s, "") or (None, why nothing usable was printed)."""
    lines = text.splitlines()
    for index, line in enumerate(lines):
        header = _HEADER.search(line)
        if header is None:
            continue
        unit = header.group(1).lower()
        factor = 1.0 if unit.startswith("gb") else _MIB_TO_GBIT if unit.startswith("m") else None
        if factor is None:
            return None, f"ib_write_bw reported in an unknown unit {header.group(1)}/sec"
        average, why = _rows(lines[index + 1 :])
        if average is None:
            return None, why or "ib_write_bw's results table is empty"
        return average * factor, ""
    return None, "ib_write_bw printed no results table"


def _rows(lines: list[str]) -> tuple[float | None, str]:
    """The average column of the table's last row (the rows end at a dashed line)."""
    average: float | None = None
    for row in lines:
        fields = row.split()
        if not fields or row.lstrip().startswith("-"):
            if average is not None:
                break
            continue
        if not fields[0].isdigit() or len(fields) < 4:  # noqa: PLR2004 - bytes, iters, peak, avg
            continue  # a warning line inside the table
        try:
            value = float(fields[3])
        except ValueError:
            return None, f"ib_write_bw printed a row it could not be read from: {row.strip()!r}"
        if not math.isfinite(value) or value < 0:
            return None, f"ib_write_bw printed an impossible bandwidth {fields[3]!r}"
        average = value
    return average, ""


def supports_cuda(tool: str) -> bool:
    """Whether this build of the tool takes ``--use_cuda`` (GPUDirect RDMA)."""
    run = run_tool([tool, "--help"], 10.0)
    return "--use_cuda" in run.stdout + run.stderr


class IbWriteBw:
    """The :class:`~agent.preflight.runners.IbBandwidth` runner over perftest's ``ib_write_bw``.

    The component it names is ``rail:<hca>/<port>`` (server) or ``rail:<hca>/<port>:<server
    address>`` (client); the executor, which knows the node names, gives the final one.
    """

    def __init__(
        self,
        tool: str | None,
        *,
        size: int = DEFAULT_SIZE,
        duration_s: int = DEFAULT_DURATION_S,
        qps: int = DEFAULT_QPS,
        cuda_device: int | None = None,
    ) -> None:
        """``tool``: the binary (None: not installed); ``cuda_device``: GPUDirect from this GPU."""
        self.tool = tool
        self.size = size
        self.duration_s = duration_s
        self.qps = qps
        self.cuda_device = cuda_device
        self._cuda: bool | None = None

    def argv(self, rail: Rail, tcp_port: int, server_addr: str | None = None) -> list[str]:
        """The command line for one side of the test."""
        argv = [
            self.tool or TOOL,
            "-d",
            rail.device,
            "-i",
            str(rail.port),
            "-p",
            str(tcp_port),
            "-s",
            str(self.size),
            "-D",
            str(self.duration_s),
            "-q",
            str(self.qps),
            "-F",
            "--report_gbits",
        ]
        if self.cuda_device is not None and self._gpudirect():
            argv.append(f"--use_cuda={self.cuda_device}")
        if server_addr is not None:
            argv.append(server_addr)
        return argv

    def _gpudirect(self) -> bool:
        if self._cuda is None:
            self._cuda = self.tool is not None and supports_cuda(self.tool)
        return self._cuda

    def serve(self, rail: Rail, tcp_port: int, timeout_s: float) -> Measurement:
        """Serve one test on ``rail``; the server measures too."""
        return self._run(rail, tcp_port, None, timeout_s, f"rail:{rail.device}/{rail.port}")

    def connect(self, rail: Rail, server_addr: str, tcp_port: int, timeout_s: float) -> Measurement:
        """Connect to the server; retried while it is not listening yet, within ``timeout_s``."""
        component = f"rail:{rail.device}/{rail.port}:{server_addr}"
        return self._run(rail, tcp_port, server_addr, timeout_s, component)

    def _run(
        self, rail: Rail, tcp_port: int, server: str | None, timeout_s: float, component: str
    ) -> Measurement:
        if self.tool is None:
            why = f"{TOOL} is not installed (Debian package perftest)"
            return Measurement(Check.IB_WRITE_BW, component, None, UNIT, error=why)
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            run = run_tool(self.argv(rail, tcp_port, server), max(left, 0.1))
            refused = server is not None and _not_listening(run)
            if not refused or deadline - time.monotonic() < RETRY_S * 2:
                break
            time.sleep(RETRY_S)
        return self._measurement(run, component)

    def _measurement(self, run: ToolRun, component: str) -> Measurement:
        note = ""
        if self.cuda_device is not None and not self._gpudirect():
            note = "GPUDirect: this ib_write_bw has no --use_cuda; host memory was used. "
        if not run.ok:
            return Measurement(
                Check.IB_WRITE_BW,
                component,
                None,
                UNIT,
                error=run.why_not(),
                evidence=note + run.evidence(),
            )
        value, why = parse(run.stdout)
        return Measurement(
            Check.IB_WRITE_BW, component, value, UNIT, error=why, evidence=note + run.evidence()
        )


def _not_listening(run: ToolRun) -> bool:
    text = (run.stdout + run.stderr).lower()
    return not run.ok and "couldn't connect" in text


def find(search_path: str | None = None) -> str | None:
    """ib_write_bw's path, or None when perftest is not installed."""
    return find_tool(TOOL, search_path)
