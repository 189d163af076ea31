"""One rank of a pre-flight measurement with torch, started by the runners in ``torch_runners``.

Run as ``python -m agent.preflight.real.torch_worker MODE ...``; the last line it prints is
``FLEETWATCH_PREFLIGHT {json}``: the result, or ``{"error": "..."}`` (then the exit status is 3).
Modes:

* ``pairs``: CUDA peer copies between every pair of ``--gpus`` (one way, then both ways at
  once on two streams), in GB/s;
* ``host``: pinned host memory to each GPU and back, in GB/s;
* ``allreduce``: one rank of an all-reduce of ``--size`` bytes across ``--world`` ranks
  (nccl on GPUs, gloo on CPUs), timed after a warm-up; the slowest rank's time gives the
  algorithm and bus bandwidth (:mod:`fleetwatch.preflight.busbw`); the sum is checked;
* ``ladder``: one rank of a small data-parallel training job (an MLP under
  DistributedDataParallel); samples per second for the whole group.

torch is imported here only, in the worker's own process: the agent never loads it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
import warnings
from itertools import combinations, permutations
from typing import Any, Final

from agent.preflight.real.torch_runners import RESULT_PREFIX

EXIT_CANNOT: Final = 3
FEATURES: Final = 64
HIDDEN: Final = 256
WARMUP_STEPS: Final = 2


class CannotRunError(Exception):
    """The measurement cannot run here (no CUDA device, too few GPUs)."""


def _torch() -> Any:  # noqa: ANN401 - torch is imported lazily, typed where it is used
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    try:
        import torch  # noqa: PLC0415 - only the worker loads torch
    except ImportError as exc:
        msg = f"torch is not installed for {sys.executable} ({exc})"
        raise CannotRunError(msg) from exc
    return torch


def _cuda(torch: Any, count: int) -> None:  # noqa: ANN401
    if not torch.cuda.is_available():
        msg = "no CUDA device"
        raise CannotRunError(msg)
    if torch.cuda.device_count() < count:
        msg = f"{count} GPUs asked for, CUDA sees {torch.cuda.device_count()}"
        raise CannotRunError(msg)


def _copy_rate(torch: Any, copies: list[tuple[Any, Any]], devices: list[int], iters: int) -> float:  # noqa: ANN401
    """GB/s of all ``copies`` (dst, src) run ``iters`` times, each on a stream of its own."""
    streams = [torch.cuda.Stream(device=devices[i % len(devices)]) for i in range(len(copies))]
    for device in devices:
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(iters):
        for (dst, src), stream in zip(copies, streams, strict=True):
            with torch.cuda.stream(stream):
                dst.copy_(src, non_blocking=True)
    for device in devices:
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    moved = sum(dst.numel() * dst.element_size() for dst, _ in copies) * iters
    return float(moved / seconds / 1e9)


def pairs(gpus: list[int], size: int, iters: int) -> dict[str, Any]:
    """One-way and both-ways peer copy bandwidth for every pair."""
    torch = _torch()
    _cuda(torch, max(gpus) + 1 if gpus else 1)
    buffers = {
        g: (
            torch.empty(size, dtype=torch.uint8, device=f"cuda:{g}"),
            torch.empty(size, dtype=torch.uint8, device=f"cuda:{g}"),
        )
        for g in gpus
    }
    one_way = []
    for a, b in permutations(gpus, 2):
        _copy_rate(torch, [(buffers[b][0], buffers[a][0])], [a, b], 1)  # warm the path
        one_way.append([a, b, _copy_rate(torch, [(buffers[b][0], buffers[a][0])], [a, b], iters)])
    both = []
    for a, b in combinations(gpus, 2):
        copies = [(buffers[b][0], buffers[a][0]), (buffers[a][1], buffers[b][1])]
        both.append([a, b, _copy_rate(torch, copies, [a, b], iters)])
    return {"p2p": one_way, "bidir": both}


def host(gpus: list[int], size: int, iters: int) -> dict[str, Any]:
    """Pinned host to device and back, per GPU."""
    torch = _torch()
    _cuda(torch, max(gpus) + 1 if gpus else 1)
    pinned = torch.empty(size, dtype=torch.uint8, pin_memory=True)
    h2d, d2h = [], []
    for g in gpus:
        device = torch.empty(size, dtype=torch.uint8, device=f"cuda:{g}")
        _copy_rate(torch, [(device, pinned)], [g], 1)
        h2d.append([g, _copy_rate(torch, [(device, pinned)], [g], iters)])
        d2h.append([g, _copy_rate(torch, [(pinned, device)], [g], iters)])
    return {"h2d": h2d, "d2h": d2h}


def _join(args: argparse.Namespace) -> tuple[Any, Any, Any, str]:
    torch = _torch()
    import torch.distributed as dist  # noqa: PLC0415

    backend = args.backend
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        _cuda(torch, args.local_rank + 1)
        torch.cuda.set_device(args.local_rank)
        device = torch.device(f"cuda:{args.local_rank}")
    else:
        torch.set_num_threads(1)  # ranks share the node's cores
        device = torch.device("cpu")
    dist.init_process_group(
        backend,
        init_method=f"tcp://{args.master}:{args.port}",
        rank=args.rank,
        world_size=args.world,
        timeout=dt.timedelta(seconds=args.timeout),
    )
    return torch, dist, device, backend


def _sync(torch: Any, device: Any) -> None:  # noqa: ANN401
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _slowest(torch: Any, dist: Any, device: Any, seconds: float) -> float:  # noqa: ANN401
    value = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return float(value.item())


def allreduce(args: argparse.Namespace) -> dict[str, Any]:
    """One rank's part of the timed all-reduce."""
    from fleetwatch.preflight.busbw import algbw_gbs, busbw_gbs  # noqa: PLC0415

    torch, dist, device, backend = _join(args)
    try:
        count = max(args.size // 4, 1)
        data = torch.ones(count, dtype=torch.float32, device=device)
        for _ in range(args.warmup):
            dist.all_reduce(data)
        _sync(torch, device)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(args.iters):
            dist.all_reduce(data)
        _sync(torch, device)
        per_op = _slowest(torch, dist, device, time.perf_counter() - start) / args.iters
        check = torch.full((1024,), float(args.rank + 1), dtype=torch.float32, device=device)
        dist.all_reduce(check)
        expected = args.world * (args.world + 1) / 2
        if not bool(torch.all(check == expected).item()):
            return {"error": f"all-reduce sums are wrong on rank {args.rank} (a corrupt path)"}
        size = count * 4
        return {
            "backend": backend,
            "ranks": args.world,
            "size_bytes": size,
            "seconds_per_op": per_op,
            "algbw_gbs": algbw_gbs(size, per_op),
            "busbw_gbs": busbw_gbs(size, per_op, args.world),
        }
    finally:
        dist.destroy_process_group()


def ladder(args: argparse.Namespace) -> dict[str, Any]:
    """One rank's part of the ladder rung: ``--steps`` timed steps after a short warm-up."""
    torch, dist, device, backend = _join(args)
    try:
        from torch import nn  # noqa: PLC0415
        from torch.nn.parallel import DistributedDataParallel  # noqa: PLC0415

        torch.manual_seed(0)
        model = nn.Sequential(
            nn.Linear(FEATURES, HIDDEN),
            nn.ReLU(),
            nn.Linear(HIDDEN, HIDDEN),
            nn.ReLU(),
            nn.Linear(HIDDEN, FEATURES),
        ).to(device)
        ddp = DistributedDataParallel(
            model, device_ids=[args.local_rank] if device.type == "cuda" else None
        )
        optimiser = torch.optim.SGD(ddp.parameters(), lr=0.01)
        generator = torch.Generator(device="cpu").manual_seed(args.rank)
        inputs = torch.randn(args.batch, FEATURES, generator=generator).to(device)
        targets = torch.randn(args.batch, FEATURES, generator=generator).to(device)

        def step() -> None:
            optimiser.zero_grad()
            loss = nn.functional.mse_loss(ddp(inputs), targets)
            loss.backward()  # type: ignore[no-untyped-call]
            optimiser.step()

        for _ in range(WARMUP_STEPS):
            step()
        _sync(torch, device)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(args.steps):
            step()
        _sync(torch, device)
        seconds = _slowest(torch, dist, device, time.perf_counter() - start)
        samples = args.world * args.batch * args.steps
        return {
            "backend": backend,
            "ranks": args.world,
            "samples": samples,
            "seconds": seconds,
            "samples_per_s": samples / seconds,
        }
    finally:
        dist.destroy_process_group()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Read the command line."""
    parser = argparse.ArgumentParser(prog="torch_worker", description=__doc__.splitlines()[0])
    modes = parser.add_subparsers(dest="mode", required=True)
    for name in ("pairs", "host"):
        copies = modes.add_parser(name)
        copies.add_argument("--gpus", required=True, help="comma-separated CUDA indices")
        copies.add_argument("--size", type=int, default=64 << 20)
        copies.add_argument("--iters", type=int, default=16)
    for name in ("allreduce", "ladder"):
        rank = modes.add_parser(name)
        rank.add_argument("--rank", type=int, required=True)
        rank.add_argument("--world", type=int, required=True)
        rank.add_argument("--local-rank", type=int, required=True)
        rank.add_argument("--master", required=True)
        rank.add_argument("--port", type=int, required=True)
        rank.add_argument("--backend", choices=("auto", "nccl", "gloo"), default="auto")
        rank.add_argument("--timeout", type=float, default=60.0)
        rank.add_argument("--size", type=int, default=64 << 20)
        rank.add_argument("--iters", type=int, default=20)
        rank.add_argument("--warmup", type=int, default=5)
        rank.add_argument("--steps", type=int, default=20)
        rank.add_argument("--batch", type=int, default=32)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run one mode and print its result line."""
    args = parse_args(argv)
    try:
        if args.mode in {"pairs", "host"}:
            gpus = [int(g) for g in args.gpus.split(",") if g]
            result = (pairs if args.mode == "pairs" else host)(gpus, args.size, args.iters)
        else:
            result = (allreduce if args.mode == "allreduce" else ladder)(args)
    except CannotRunError as exc:
        result = {"error": str(exc)}
    except Exception as exc:  # noqa: BLE001 - a rank's failure is its result, said in one line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        result = {"error": f"{type(exc).__name__}: {first}"[:300]}
    sys.stdout.write(RESULT_PREFIX + json.dumps(result) + "\n")
    sys.stdout.flush()
    return EXIT_CANNOT if "error" in result else 0


def leave(code: int) -> None:
    """End the rank with ``code`` once its result line is out, skipping the interpreter's teardown.

    Past the result there is nothing left to do, and the teardown is where torch's own threads
    can still kill the process: a gloo process group still held by DistributedDataParallel's
    reducer is destroyed during finalisation and aborts with "terminate called without an
    active exception" (SIGABRT), which made a finished rank look failed under CI's load.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    leave(main())
