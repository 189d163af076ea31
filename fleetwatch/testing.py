"""Fakes shipped for tests and simulations (the structlog ``testing`` idea)."""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import socket
import time
from typing import TYPE_CHECKING

from fleetwatch import PROTOCOL_VERSION
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable


class FakeClock:
    """A clock that only moves when told to; ``sleep`` advances it instead of waiting."""

    __slots__ = ("_mono", "_wall")

    def __init__(self, start_unix: float = 1_767_225_600.0) -> None:
        """Start at ``start_unix`` (default 2026-01-01T00:00:00Z) with monotonic time 0."""
        self._wall = start_unix
        self._mono = 0.0

    def now(self) -> float:
        """Return the fake wall time."""
        return self._wall

    def monotonic(self) -> float:
        """Return the fake monotonic time."""
        return self._mono

    def advance(self, seconds: float) -> None:
        """Move both clocks forward by ``seconds``."""
        if seconds < 0:
            msg = f"cannot move a clock backwards by {seconds} s"
            raise ValueError(msg)
        self._wall += seconds
        self._mono += seconds

    async def sleep(self, seconds: float) -> None:
        """Advance by ``seconds`` and yield to the event loop once."""
        self.advance(max(seconds, 0.0))
        await asyncio.sleep(0)


async def wait_until(
    predicate: Callable[[], bool | Awaitable[bool]],
    timeout: float = 15.0,  # noqa: ASYNC109 - a deadline on a condition, not on one call
    what: str = "",
) -> None:
    """Poll ``predicate`` on the running loop until it holds; raise AssertionError on timeout.

    ``predicate`` may be a coroutine function (a journal query, say): each answer is awaited.
    """
    deadline = time.monotonic() + timeout
    while not await _holds(predicate):
        if time.monotonic() > deadline:
            msg = f"timed out after {timeout} s waiting for {what or predicate}"
            raise AssertionError(msg)
        await asyncio.sleep(0.05)


async def _holds(predicate: Callable[[], bool | Awaitable[bool]]) -> bool:
    answer = predicate()
    return bool(await answer) if inspect.isawaitable(answer) else bool(answer)


async def wait_for_more(
    count: Callable[[], int],
    more: int,
    timeout: float = 15.0,  # noqa: ASYNC109 - a deadline on a condition, not on one call
    what: str = "",
) -> None:
    """Wait until ``count()`` has grown by ``more`` from its value now.

    For checks that something does *not* happen: wait for a number of turns of what would do
    it (rule ticks, polls, scrapes), never for a time, which a slow machine can outrun.
    """
    start = count()
    await wait_until(
        lambda: count() >= start + more, timeout, what or f"{more} more of {count} from {start}"
    )


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago (for child-process servers)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def made_up_uuid(node: str, index: int) -> str:
    """A stable, well-formed GPU UUID for GPU ``index`` of a made-up ``node``."""
    digest = hashlib.sha256(f"{node}/{index}".encode()).hexdigest()
    return f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


def made_up_hello(  # noqa: PLR0913 - the shape of a made-up node
    node: str,
    *,
    gpus: int = 8,
    nvlinks: int = 18,
    ib_ports: int = 8,
    model: str = "NVIDIA H100 80GB HBM3",
    boot_id: str = "made-up",
) -> pb.Hello:
    """The Hello of a made-up node (rule tests, benchmarks), named as an agent would name it."""
    return pb.Hello(
        node=node,
        boot_id=boot_id,
        protocol_version=PROTOCOL_VERSION,
        gpus=[
            pb.Gpu(
                index=i,
                uuid=made_up_uuid(node, i),
                pci_bus_id=f"0000:{0x18 + i:02x}:00.0",
                model=model,
                nvlink_count=nvlinks,
            )
            for i in range(gpus)
        ],
        ib_ports=[
            pb.IbPort(device=f"mlx5_{i}", port=1, rate="400 Gb/sec (4X NDR)")
            for i in range(ib_ports)
        ],
    )
