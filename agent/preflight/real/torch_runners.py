"""Runners over torch, for what no dedicated tool is installed for, and for the ladder.

Each starts :mod:`agent.preflight.real.torch_worker` processes (one per GPU of this node for a
collective or a ladder rung; their ranks are ``node_rank * gpus_per_node + local``) and reads the
result line the first one prints. A worker that crashes, hangs past the group's time or prints
nothing usable gives a measurement with ``value`` None and the reason: never a figure.
"""

from __future__ import annotations

import json
import math
import os
import sys
from itertools import combinations, permutations
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from agent.preflight.real.process import ToolRun, run_tool, run_tools
from fleetwatch.preflight.vocabulary import Check, Measurement

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from agent.preflight.runners import Group

MODULE: Final = "agent.preflight.real.torch_worker"
RESULT_PREFIX: Final = "FLEETWATCH_PREFLIGHT "  # the worker's result line starts with this
GB_S: Final = "GB/s"
GRACE_S: Final = 15.0  # the processes' own bound: the group's time plus starting Python and torch
_ROOT: Final = str(Path(__file__).resolve().parents[3])  # where the ``agent`` package lives


def read_result(run: ToolRun) -> tuple[dict[str, Any] | None, str]:
    """(the worker's result, "") or (None, why there is none)."""
    for line in reversed(run.stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            try:
                result = json.loads(line[len(RESULT_PREFIX) :])
            except json.JSONDecodeError:
                return None, "the torch worker printed a result that is not JSON"
            if not isinstance(result, dict):
                return None, "the torch worker printed a result that is not an object"
            if "error" in result:
                return None, str(result["error"])
            return result, ""
    return None, run.why_not() or "the torch worker printed no result"


def _number(result: Mapping[str, Any], key: str) -> float | None:
    value = result.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


class _Torch:
    def __init__(
        self,
        python: str = sys.executable,
        backend: str = "auto",
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.python = python
        self.backend = backend
        self.env = dict(env or {})

    def environment(self) -> dict[str, str]:
        env = {**os.environ, **self.env}
        paths = [_ROOT, *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        return env

    def launch(self, mode: str, group: Group, extra: Sequence[str]) -> tuple[ToolRun, ...]:
        world = len(group.nodes) * group.gpus_per_node
        argvs = [
            [
                self.python,
                "-m",
                MODULE,
                mode,
                *("--rank", str(group.node_rank * group.gpus_per_node + local)),
                *("--world", str(world), "--local-rank", str(local)),
                *("--master", group.master_addr, "--port", str(group.master_port)),
                *("--backend", self.backend, "--timeout", f"{group.timeout_s:g}"),
                *extra,
            ]
            for local in range(group.gpus_per_node)
        ]
        return tuple(run_tools(argvs, group.timeout_s + GRACE_S, self.environment()))

    def result(self, runs: Sequence[ToolRun]) -> tuple[dict[str, Any] | None, str, str]:
        """The first rank's result, or the first failure among the ranks; and the evidence."""
        first, why = read_result(runs[0])
        for index, run in enumerate(runs):
            if run.ok:
                continue
            _, rank_why = read_result(run)
            # a rank that printed a result and then failed (killed at its deadline while the
            # process group was torn down, a non-zero exit) says so rather than nothing
            why = rank_why or run.why_not() or "failed after its result"
            return None, f"local rank {index}: {why}", run.evidence()
        return first, why, runs[0].evidence()


class TorchCollective(_Torch):
    """All-reduce bus bandwidth with torch.distributed (nccl on GPUs, gloo on CPUs).

    The collective for multi-node groups, and for one node when ``all_reduce_perf`` is missing.
    """

    iters = 20
    warmup = 5

    def all_reduce(self, group: Group) -> Measurement:
        """``allreduce_node`` (one node) or ``allreduce_multi``: busbw as nccl-tests computes it."""
        single = len(group.nodes) == 1
        check = Check.ALLREDUCE_NODE if single else Check.ALLREDUCE_MULTI
        component = "node" if single else f"nodes:{len(group.nodes)}"
        if group.gpus_per_node * len(group.nodes) < 2:  # noqa: PLR2004 - a collective needs two
            why = "an all-reduce needs at least two ranks (bus bandwidth of one rank is 0)"
            return Measurement(check, component, None, GB_S, error=why)
        extra = ("--size", str(group.size_bytes), "--iters", str(self.iters))
        runs = self.launch("allreduce", group, (*extra, "--warmup", str(self.warmup)))
        result, why, evidence = self.result(runs)
        value = _number(result, "busbw_gbs") if result is not None else None
        if result is not None:
            if value is None:
                why = "the torch worker's result has no bus bandwidth"
            evidence = (
                f"{result.get('backend')} {result.get('ranks')} ranks "
                f"{result.get('size_bytes')} B: {_number(result, 'seconds_per_op') or 0:.6f} s/op, "
                f"algbw {_number(result, 'algbw_gbs') or 0:.4g} GB/s"
            )
        return Measurement(check, component, value, GB_S, error=why, evidence=evidence)


class TorchLadder(_Torch):
    """One rung of the scaling ladder: a small model's training steps across the group."""

    batch = 32

    def run(self, group: Group, steps: int) -> Measurement:
        """``ladder_throughput`` in samples per second for the whole group."""
        component = f"nodes:{len(group.nodes)}"
        extra = ("--steps", str(steps), "--batch", str(self.batch))
        result, why, evidence = self.result(self.launch("ladder", group, extra))
        value = _number(result, "samples_per_s") if result is not None else None
        if result is not None:
            if value is None:
                why = "the torch worker's result has no throughput"
            evidence = (
                f"{result.get('backend')} {result.get('ranks')} ranks: "
                f"{result.get('samples')} samples in {_number(result, 'seconds') or 0:.3f} s"
            )
        return Measurement(
            Check.LADDER_THROUGHPUT, component, value, "samples/s", error=why, evidence=evidence
        )


class TorchCopies(_Torch):
    """Peer and host copies through CUDA with torch, when ``nvbandwidth`` is not installed.

    Serves as both :class:`~agent.preflight.runners.PairBandwidth` (``measure_pairs``) and
    :class:`~agent.preflight.runners.HostBandwidth` (``measure_host``); :func:`pair_runner` and
    :func:`host_runner` give the two faces.
    """

    size = 64 << 20
    iters = 16

    def _copies(
        self, mode: str, gpus: Sequence[int], timeout_s: float
    ) -> tuple[dict[str, Any] | None, str, str]:
        argv = [
            self.python,
            "-m",
            MODULE,
            mode,
            "--gpus",
            ",".join(str(g) for g in gpus),
            "--size",
            str(self.size),
            "--iters",
            str(self.iters),
        ]
        run = run_tool(argv, timeout_s, self.environment())
        result, why = read_result(run)
        return result, why, run.evidence()

    def measure_pairs(self, gpus: Sequence[int], timeout_s: float) -> list[Measurement]:
        """``p2p_bw`` for every ordered pair and ``p2p_bidir_bw`` for every pair."""
        if len(gpus) < 2:  # noqa: PLR2004 - a pair
            return []
        result, why, evidence = self._copies("pairs", gpus, timeout_s)
        one_way = _indexed(result, "p2p") if result else {}
        both = _indexed(result, "bidir") if result else {}
        out = [
            _m(Check.P2P_BW, f"gpu:{a}-gpu:{b}", one_way.get((a, b)), why, evidence)
            for a, b in permutations(gpus, 2)
        ]
        out.extend(
            _m(Check.P2P_BIDIR_BW, f"gpu:{a}-gpu:{b}", both.get((a, b)), why, evidence)
            for a, b in combinations(sorted(gpus), 2)
        )
        return out

    def measure_host(self, gpus: Sequence[int], timeout_s: float) -> list[Measurement]:
        """``h2d_bw`` and ``d2h_bw`` for each GPU."""
        if not gpus:
            return []
        result, why, evidence = self._copies("host", gpus, timeout_s)
        out: list[Measurement] = []
        for check, key in ((Check.H2D_BW, "h2d"), (Check.D2H_BW, "d2h")):
            values = _per_gpu(result, key) if result else {}
            out.extend(_m(check, f"gpu:{g}", values.get(g), why, evidence) for g in gpus)
        return out


def _indexed(result: Mapping[str, Any], key: str) -> dict[tuple[int, int], float]:
    out: dict[tuple[int, int], float] = {}
    for item in result.get(key, []):
        if isinstance(item, list) and len(item) == 3:  # noqa: PLR2004 - [a, b, GB/s]
            value = _number({"v": item[2]}, "v")
            if value is not None:
                out[(int(item[0]), int(item[1]))] = value
    return out


def _per_gpu(result: Mapping[str, Any], key: str) -> dict[int, float]:
    out: dict[int, float] = {}
    for item in result.get(key, []):
        if isinstance(item, list) and len(item) == 2:  # noqa: PLR2004 - [gpu, GB/s]
            value = _number({"v": item[1]}, "v")
            if value is not None:
                out[int(item[0])] = value
    return out


def _m(check: Check, component: str, value: float | None, why: str, evidence: str) -> Measurement:
    error = why or ("" if value is not None else "the torch worker measured no value for it")
    return Measurement(
        check,
        component,
        value if not error else None,
        GB_S,
        error=error,
        evidence=evidence if error else "",
    )


class _PairFace:
    def __init__(self, copies: TorchCopies) -> None:
        self.copies = copies

    def measure(self, gpus: Sequence[int], timeout_s: float) -> list[Measurement]:
        return self.copies.measure_pairs(gpus, timeout_s)


class _HostFace:
    def __init__(self, copies: TorchCopies) -> None:
        self.copies = copies

    def measure(self, gpus: Sequence[int], timeout_s: float) -> list[Measurement]:
        return self.copies.measure_host(gpus, timeout_s)


def pair_runner(copies: TorchCopies) -> _PairFace:
    """``copies`` as a PairBandwidth runner."""
    return _PairFace(copies)


def host_runner(copies: TorchCopies) -> _HostFace:
    """``copies`` as a HostBandwidth runner."""
    return _HostFace(copies)
