"""One simulated node and its real agent, in a process of its own, for ``bench/chaos.py``.

The process is what a node's ``fleetwatch agent`` would be: the real agent code with its outbox
spooled under ``DIR/state`` and its kernel log cursor beside it, streaming over gRPC. Only the
hardware is simulated: NVML and sysfs by :class:`agent.sim.hardware.SimNode`, the kernel log by
the file ``DIR/kmsg`` (:class:`agent.sim.kmsg_file.KmsgFile`), which the chaos process writes and
which outlives this process as the kernel's ring buffer outlives a crashed agent. The chaos
process kills this one with SIGKILL and starts it again on the same directory: same boot, so the
agent must pick up its spool and cursor and neither lose nor repeat an event.

Run: ``python bench/helpers/chaos_node.py --node NAME --dir DIR --collector HOST:PORT``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from pathlib import Path

from agent.config import AgentConfig
from agent.main import Hardware, build_agent
from agent.sim.hardware import SimNode
from agent.sim.kmsg_file import KmsgFile
from agent.sources.kmsg_cursor import KmsgCursor
from fleetwatch.clock import SystemClock
from fleetwatch.logs import configure_logging


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--node", required=True)
    parser.add_argument("--dir", required=True, type=Path)
    parser.add_argument("--collector", required=True)
    parser.add_argument("--poll-interval", type=float, default=0.5)
    parser.add_argument("--heartbeat-interval", type=float, default=1.0)
    parser.add_argument("--backoff-max", type=float, default=1.0)
    parser.add_argument("--log-level", default="warning")
    return parser.parse_args(argv)


async def tick(node: SimNode, clock: SystemClock, every_s: float) -> None:
    """Move the simulated counters on, as time passes on a real node."""
    last = clock.monotonic()
    while True:
        await clock.sleep(every_s)
        now = clock.monotonic()
        node.tick(now - last)
        last = now


async def serve(args: argparse.Namespace) -> None:
    clock = SystemClock()
    node = SimNode(args.node, args.dir / "sys", clock)
    state = args.dir / "state"
    cursor = KmsgCursor(state / "kmsg-cursor.json", node.boot_id)
    hardware = Hardware(
        nvml=node.nvml,
        sysfs_root=node.sysfs.root,
        # like the real reader: from the start of the buffer when a cursor says where to go on
        kmsg=KmsgFile(args.dir / "kmsg", from_start=cursor.path.exists()),
        udev=None,
        boot_id=node.boot_id,
        kmsg_cursor=cursor,
    )
    cfg = AgentConfig(
        collector=args.collector,
        node=args.node,
        poll_interval=args.poll_interval,
        heartbeat_interval=args.heartbeat_interval,
        backoff_initial=0.1,
        backoff_max=args.backoff_max,
        counter_interval=max(args.poll_interval, 1.0),
        nvml_events=False,  # the kernel log is the one Xid source here (see bench/chaos.py)
        state_dir=state,
        job_socket=None,
        gpu_reset=False,
    )
    agent = build_agent(cfg, hardware, clock)
    ticker = asyncio.create_task(tick(node, clock, args.poll_interval), name="sim-ticker")
    try:
        await agent.run()
    finally:
        ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ticker


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    configure_logging(args.log_level)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
