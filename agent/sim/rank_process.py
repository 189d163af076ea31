"""One simulated training rank in a process of its own: ``python -m agent.sim.rank_process``.

A simulated job (:mod:`agent.sim.training`) with ``processes=True`` starts one of these per rank,
so that the agent watches a real process per rank, as on a real node: its own pid and start
time (``/proc/<pid>/stat``), a state that changes when it is stopped, sleeps or exits, and its
own connection to the job socket. The job keeps the simulated time and tells the process what
to do, one JSON object per line on stdin:

- ``{"op": "step", "report": {...}}``: the step's all-reduce completed; send the step report
  (:func:`fleetwatch.jobclient.report_step`'s keyword arguments);
- ``{"op": "enter", "collective": "all_reduce", "seq": N}``: enter collective ``N`` of the
  default process group and wait in it (the peers never arrive);
- ``{"op": "sleep"}``: sleep, for real, before the next collective (it never enters it);
- ``{"op": "raise", "error": "..."}``: die of an uncaught exception (the farewell says error);
- ``{"op": "end"}``: end normally (the farewell says ok).

A stopped rank is the job's to make (SIGSTOP). While it lives, the process serves a simulated
Flight Recorder in torch's JSON format over the real channel to the agent
(:func:`fleetwatch.jobclient.serve_flight_recorder`): the default group's last collectives,
their sequence numbers and states. Nothing here simulates hardware; only the training loop.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Final

from fleetwatch.jobclient import report_step, serve_flight_recorder

KEPT: Final = 8  # collectives the recorder keeps (torch keeps its buffer size; 8 suffice here)
SLEEP_S: Final = 3600.0
COLLECTIVES: Final = frozenset({"all_reduce", "broadcast", "all_gather", "reduce_scatter"})


class Recorder:
    """The default group's last collectives: (sequence number, op, state), oldest first."""

    def __init__(self) -> None:
        """Nothing recorded yet."""
        self._lock = threading.Lock()
        self._entries: list[tuple[int, str, str]] = []

    def record(self, seq: int, op: str, state: str) -> None:
        """Collective ``seq`` is now in ``state`` (a new entry, or the last one moved on)."""
        with self._lock:
            if self._entries and self._entries[-1][0] == seq and self._entries[-1][1] == op:
                self._entries[-1] = (seq, op, state)
            else:
                self._entries = [*self._entries[-(KEPT - 1) :], (seq, op, state)]

    def dump(self) -> dict[str, object]:
        """The recorder in torch's JSON format (``pg_status`` and ``entries``)."""
        with self._lock:
            entries = list(self._entries)
        completed = [seq for seq, _, state in entries if state == "completed"]
        started = [seq for seq, _, state in entries if state in {"started", "completed"}]
        return {
            "version": "2.10",
            "pg_status": {
                "0": {
                    "last_enqueued_collective": entries[-1][0] if entries else -1,
                    "last_started_collective": max(started, default=-1),
                    "last_completed_collective": max(completed, default=-1),
                }
            },
            "entries": [
                {
                    "collective_seq_id": seq,
                    "pg_id": 0,
                    "process_group": ["0", "default_pg"],
                    "profiling_name": f"nccl:{op}",
                    "state": state,
                }
                for seq, op, state in entries
            ],
        }


def serve(socket_path: str, job: str, rank: int, lines: object = sys.stdin) -> int:
    """Follow the job's instructions until told to end (or stdin closes); the exit status."""
    recorder = Recorder()
    serving = False
    for line in lines:  # type: ignore[attr-defined]
        msg = json.loads(line)
        op = msg.get("op")
        if op == "step":
            report = msg["report"]
            step = int(report["step"])
            recorder.record(step + 1, "all_reduce", "completed")
            checkpoint = report.get("checkpoint")
            report_step(
                job,
                rank,
                step,
                float(report["step_time"]),
                float(report["tokens"]),
                compute_time=report.get("compute_time"),
                checkpoint=(float(checkpoint[0]), float(checkpoint[1])) if checkpoint else None,
                gpu=report.get("gpu"),
                world_size=report.get("world_size"),
                params=report.get("params"),
                socket_path=socket_path,
            )
            if not serving:
                serving = serve_flight_recorder(socket_path, dump=recorder.dump)
        elif op == "enter":
            collective = str(msg.get("collective", "all_reduce"))
            if collective not in COLLECTIVES:
                collective = "all_reduce"
            recorder.record(int(msg["seq"]), collective, "started")
        elif op == "sleep":
            while True:
                time.sleep(SLEEP_S)
        elif op == "raise":
            raise RuntimeError(str(msg.get("error", "the rank failed")))
        elif op == "end":
            break
    return 0


def main(argv: list[str] | None = None) -> int:
    """``rank_process SOCKET JOB RANK``: serve the job's instructions from stdin."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3:  # noqa: PLR2004 - the three arguments
        sys.stderr.write("usage: python -m agent.sim.rank_process SOCKET JOB RANK\n")
        return 2
    return serve(args[0], args[1], int(args[2]))


if __name__ == "__main__":
    sys.exit(main())
