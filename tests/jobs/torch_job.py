"""A real data-parallel ``torch.distributed`` training job on the CPU, for straggler tests.

Run one process per rank (gloo backend, rendezvous on 127.0.0.1)::

    python tests/jobs/torch_job.py --rank R --world-size 4 --master-port P --job JOB \\
        --steps N --socket PATH [--slow-rank K --slow-factor F] [--checkpoint-every C] \\
        [--sleep-rank R --sleep-at-step S [--sleep-s T]] [--broadcast-rank B] [--gloo-timeout-s G]

Every rank trains the same tiny MLP (about 100k parameters, same seed) on its own random batch
of 32 sequences x 16 tokens, all-reduces the gradients by hand and steps SGD. Each step is
reported with :func:`fleetwatch.jobclient.report_step` to the Unix datagram socket ``--socket``:
``compute_time`` is forward + backward only, ``step_time`` the whole step, all-reduce included.
The rank ``--slow-rank`` stretches its compute phase to about ``--slow-factor`` times its real
compute time, so that it is the job's straggler while every rank's step time stays the same.
The rank ``--sleep-rank`` sleeps ``--sleep-s`` seconds (an hour by default) before the all-reduce
of step ``--sleep-at-step``, while the others wait in it: the job hangs, and that rank's stack is
the one that stands out (in ``train``, not in ``all_reduce``). The others give up after
``--gloo-timeout-s``. The rank ``--broadcast-rank`` calls a ``broadcast`` before that step's
all-reduce instead, while the others all-reduce: the job hangs out of step, which the ranks' Flight
Recorders show (run the ranks with ``TORCH_FR_BUFFER_SIZE`` set).

``compute_time`` is the rank's own work, the CPU time of its forward + backward (what a GPU's busy
time is on a real node), not the wall time: with more ranks than cores, the wall time measures how
the scheduler shared the cores out (a rank left waiting for a core looks as slow as the straggler,
or the straggler as fast as the others), which a loaded machine changes from run to run. The slowed
rank's extra time, a sleep, is wall time and counts in full.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from fleetwatch.jobclient import report_step

SEQUENCES = 32
TOKENS_PER_SEQUENCE = 16
FEATURES = 64
HIDDEN = 256
MICROBATCHES = 2  # forward + backward passes per step: sets how long a step computes
TIMEOUT_S = 60.0  # a dead peer fails the job instead of hanging it


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Read the command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--master-port", type=int, required=True)
    parser.add_argument("--job", required=True, help="job name in the reports")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--socket", required=True, help="the agent's job socket to report to")
    parser.add_argument("--slow-rank", type=int, default=None, help="rank that computes slower")
    parser.add_argument("--slow-factor", type=float, default=1.0, help="its compute time factor")
    parser.add_argument("--checkpoint-every", type=int, default=0, help="steps; 0: never")
    parser.add_argument("--sleep-rank", type=int, default=None, help="rank that sleeps once")
    parser.add_argument("--sleep-at-step", type=int, default=0, help="before this step's reduce")
    parser.add_argument("--sleep-s", type=float, default=3600.0, help="how long it sleeps")
    parser.add_argument(
        "--broadcast-rank", type=int, default=None, help="rank that broadcasts instead, once"
    )
    parser.add_argument(
        "--gloo-timeout-s", type=float, default=TIMEOUT_S, help="how long a collective waits"
    )
    args = parser.parse_args(argv)
    if not 0 <= args.rank < args.world_size:
        parser.error("--rank must be in [0, --world-size)")
    if args.slow_factor < 1:
        parser.error("--slow-factor must be at least 1")
    return args


def build_model() -> nn.Module:
    """The same small MLP on every rank (fixed seed): 64 -> 256 -> 256 -> 64, 98,880 params."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(FEATURES, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, FEATURES),
    )


def all_reduce_gradients(model: nn.Module, world_size: int) -> None:
    """Average the gradients over the ranks through one flattened buffer (what DDP does)."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= world_size
    offset = 0
    for grad in grads:
        grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
        offset += grad.numel()


def save_checkpoint(model: nn.Module, path: Path) -> tuple[float, float]:
    """Write the model's state to ``path``; return its (start, end) in Unix seconds."""
    start = time.time()
    torch.save(model.state_dict(), path)
    return start, time.time()


def train(args: argparse.Namespace, checkpoint_dir: Path) -> None:
    """Run the job's steps, reporting each one."""
    model = build_model()
    params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.MSELoss()
    data = torch.Generator().manual_seed(1000 + args.rank)  # each rank its own batches
    tokens = SEQUENCES * TOKENS_PER_SEQUENCE
    slow = args.slow_factor if args.rank == args.slow_rank else 1.0
    for step in range(1, args.steps + 1):
        started = time.perf_counter()
        busy = time.thread_time()  # torch computes on this thread (one thread, on the CPU)
        optimizer.zero_grad(set_to_none=True)
        for _ in range(MICROBATCHES):
            inputs = torch.randn(tokens, FEATURES, generator=data)
            targets = torch.randn(tokens, FEATURES, generator=data)
            loss = loss_fn(model(inputs), targets) / MICROBATCHES
            loss.backward()
        compute_time = time.thread_time() - busy
        if slow > 1:  # a slower device: the same work takes `slow` times as long
            slept = time.perf_counter()
            time.sleep(compute_time * (slow - 1))
            compute_time += time.perf_counter() - slept
        if args.rank == args.sleep_rank and step == args.sleep_at_step:
            time.sleep(args.sleep_s)  # the others wait for it in the all-reduce: a hang
        if args.rank == args.broadcast_rank and step == args.sleep_at_step:
            dist.broadcast(torch.zeros(1), src=0)  # out of step: the others all-reduce (a hang)
        all_reduce_gradients(model, args.world_size)
        optimizer.step()
        step_time = time.perf_counter() - started
        checkpoint = None
        if args.checkpoint_every > 0 and step % args.checkpoint_every == 0:
            checkpoint = save_checkpoint(model, checkpoint_dir / f"rank{args.rank}.pt")
        report_step(
            args.job,
            args.rank,
            step,
            step_time,
            tokens,
            compute_time=compute_time,
            checkpoint=checkpoint,
            gpu=0,
            world_size=args.world_size,
            params=params,
            socket_path=args.socket,
        )


def main(argv: list[str] | None = None) -> int:
    """Join the process group, train, leave; 0 when every step ran."""
    args = parse_args(argv)
    torch.set_num_threads(1)  # CI has 2 cores for all the ranks
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # a loopback job: keep gloo on loopback
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{args.master_port}",
        rank=args.rank,
        world_size=args.world_size,
        timeout=dt.timedelta(seconds=args.gloo_timeout_s),
    )
    try:
        with tempfile.TemporaryDirectory(prefix="torch-job-") as checkpoint_dir:
            train(args, Path(checkpoint_dir))
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
