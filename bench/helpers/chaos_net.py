"""A TCP relay between each agent and the collector that can cut a node off, for ``bench/chaos.py``.

Each node's agent dials its own port on this relay, which forwards the bytes to the collector. A
partition of a node closes its connections and then swallows new ones: they are accepted and
answered with silence, as a network that drops packets is, so the agent has to notice by its own
timeouts. Healing closes the swallowed connections, and the agent's next dial goes through.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import defaultdict
from typing import TYPE_CHECKING, Final, TypeVar

if TYPE_CHECKING:
    from collections.abc import Coroutine

CHUNK: Final = 64 * 1024
T = TypeVar("T")


class PartitionRelay:
    """Per-node relays to ``127.0.0.1:upstream_port``, on an event loop of their own (a thread)."""

    def __init__(self, upstream_port: int) -> None:
        """Start the relay's thread; add nodes with :meth:`add`."""
        self._upstream = upstream_port
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="relay", daemon=True)
        self._thread.start()
        self._servers: list[asyncio.Server] = []
        self._cut: set[str] = set()
        self._open: defaultdict[str, set[asyncio.StreamWriter]] = defaultdict(set)
        self.connections = 0
        self.swallowed = 0

    def _run(self, coro: Coroutine[object, object, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=30)

    def add(self, node: str) -> int:
        """Listen for ``node``'s agent on a free loopback port; return the port."""

        async def listen() -> int:
            server = await asyncio.start_server(
                lambda r, w: self._serve(node, r, w), "127.0.0.1", 0
            )
            self._servers.append(server)
            return int(server.sockets[0].getsockname()[1])

        return self._run(listen())

    def partition(self, nodes: set[str]) -> None:
        """Cut ``nodes`` off: drop their connections, swallow new ones."""

        def cut() -> None:
            self._cut |= nodes
            for node in nodes:
                self._close_all(node)

        self._loop.call_soon_threadsafe(cut)

    def heal(self, nodes: set[str]) -> None:
        """Let ``nodes`` through again (their swallowed connections are closed)."""

        def heal() -> None:
            self._cut -= nodes
            for node in nodes:
                self._close_all(node)

        self._loop.call_soon_threadsafe(heal)

    def _close_all(self, node: str) -> None:
        for writer in list(self._open[node]):
            writer.close()
        self._open[node].clear()

    async def _serve(
        self, node: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self._open[node].add(writer)
        try:
            if node in self._cut:
                self.swallowed += 1
                while await reader.read(CHUNK):  # read and drop until closed
                    pass
                return
            try:
                up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._upstream)
            except OSError:  # the collector is down: the agent sees its connection close
                return
            self.connections += 1
            self._open[node].add(up_writer)
            await asyncio.gather(
                self._pipe(reader, up_writer), self._pipe(up_reader, writer), return_exceptions=True
            )
            up_writer.close()
            self._open[node].discard(up_writer)
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            self._open[node].discard(writer)
            writer.close()

    @staticmethod
    async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(CHUNK):
                dst.write(data)
                await dst.drain()
        finally:
            dst.close()  # one side ended: end the other, as a TCP connection through a NAT would

    def stop(self) -> None:
        """Close everything and stop the thread."""

        async def close() -> None:
            for server in self._servers:
                server.close()
            for node in list(self._open):
                self._close_all(node)

        with contextlib.suppress(Exception):
            self._run(close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
