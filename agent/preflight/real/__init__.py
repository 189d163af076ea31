"""The real pre-flight runners: the tools a GPU node has, torch where it has none.

==============  ==========================================  ==================================
interface       tool when installed                         otherwise
==============  ==========================================  ==================================
PairBandwidth   ``nvbandwidth`` (D2D read CE, bidir. CE)     CUDA peer copies through torch
HostBandwidth   ``nvbandwidth`` (H2D and D2H CE)             pinned-memory copies through torch
Collective      ``all_reduce_perf`` (one node)               torch.distributed (nccl / gloo)
IbBandwidth     ``ib_write_bw`` (perftest)                   could not run: not installed
LadderStep      torch.distributed DDP of a small MLP         (always torch)
==============  ==========================================  ==================================

Which tool runs is decided at each call (a tool installed later is used); every tool runs as an
argument list with a timeout, in a session of its own that is killed whole on timeout
(:mod:`agent.preflight.real.process`).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from agent.preflight.real import nccl_tests, nvbandwidth, perftest
from agent.preflight.real.torch_runners import (
    TorchCollective,
    TorchCopies,
    TorchLadder,
    host_runner,
    pair_runner,
)
from agent.preflight.runners import PreflightRunners

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from agent.preflight.runners import Group, Rail
    from fleetwatch.preflight.vocabulary import Measurement


class _Pairs:
    def __init__(self, search_path: str | None, copies: TorchCopies) -> None:
        self.search_path = search_path
        self.fallback = pair_runner(copies)

    def measure(self, gpus: Sequence[int], timeout_s: float) -> list[Measurement]:
        tool = nvbandwidth.find(self.search_path)
        if tool is None:
            return self.fallback.measure(gpus, timeout_s)
        return nvbandwidth.NvbandwidthPair(tool).measure(gpus, timeout_s)


class _Host:
    def __init__(self, search_path: str | None, copies: TorchCopies) -> None:
        self.search_path = search_path
        self.fallback = host_runner(copies)

    def measure(self, gpus: Sequence[int], timeout_s: float) -> list[Measurement]:
        tool = nvbandwidth.find(self.search_path)
        if tool is None:
            return self.fallback.measure(gpus, timeout_s)
        return nvbandwidth.NvbandwidthHost(tool).measure(gpus, timeout_s)


class _Collective:
    def __init__(
        self, search_path: str | None, torch: TorchCollective, env: Mapping[str, str]
    ) -> None:
        self.search_path = search_path
        self.torch = torch
        self.env = env

    def all_reduce(self, group: Group) -> Measurement:
        tool = nccl_tests.find(self.search_path)
        if tool is None:
            return self.torch.all_reduce(group)
        return nccl_tests.AllReducePerf(tool, self.torch, self.env).all_reduce(group)


class _Ib:
    def __init__(self, search_path: str | None, cuda_device: int | None) -> None:
        self.search_path = search_path
        self.cuda_device = cuda_device

    def _runner(self) -> perftest.IbWriteBw:
        return perftest.IbWriteBw(perftest.find(self.search_path), cuda_device=self.cuda_device)

    def serve(self, rail: Rail, tcp_port: int, timeout_s: float) -> Measurement:
        return self._runner().serve(rail, tcp_port, timeout_s)

    def connect(self, rail: Rail, server_addr: str, tcp_port: int, timeout_s: float) -> Measurement:
        return self._runner().connect(rail, server_addr, tcp_port, timeout_s)


def real_runners(
    *,
    search_path: str | None = None,
    python: str = sys.executable,
    backend: str = "auto",
    env: Mapping[str, str] | None = None,
    ib_cuda_device: int | None = 0,
) -> PreflightRunners:
    """The runners a real node uses.

    Args:
        search_path: where to look for the tools (default: ``PATH``).
        python: the interpreter that runs the torch workers (one that has torch).
        backend: torch.distributed backend: ``auto`` (nccl with CUDA, else gloo), ``nccl``,
            ``gloo``. Every node of a group must end up with the same one.
        env: added to the environment of the collectives (``NCCL_IB_HCA``, ``NCCL_ALGO``...).
        ib_cuda_device: GPUDirect RDMA from this GPU when ib_write_bw supports ``--use_cuda``
            (None: host memory).
    """
    extra = dict(env or {})
    copies = TorchCopies(python, backend, extra)
    collective = TorchCollective(python, backend, extra)
    return PreflightRunners(
        pair=_Pairs(search_path, copies),
        host=_Host(search_path, copies),
        collective=_Collective(search_path, collective, extra),
        ib=_Ib(search_path, ib_cuda_device),
        ladder=TorchLadder(python, backend, extra),
    )
