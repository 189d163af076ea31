"""One node's flood of Xid events costs the collector bounded memory and bounded series.

Every event is journaled (nothing is lost), yet the collector's memory must not grow with the
events a rule window holds: 4,000 Xids from one node once took the collector from 99 MiB to
2.4 GiB and never came down (each rule evaluation's memo key held the window's whole list), and
each distinct Xid was a new ``fleetwatch_gpu_xid_errors_total`` series.
"""

from __future__ import annotations

import asyncio
import gc
import re
import time
import urllib.request
from typing import TYPE_CHECKING

import grpc
import psutil
import pytest

from collector.main import CollectorService
from collector.model.state import MAX_XIDS_PER_GPU
from fleetwatch.clock import SystemClock
from fleetwatch.testing import made_up_hello, made_up_uuid, wait_until
from fleetwatch.wire import settings
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb

if TYPE_CHECKING:
    from collections.abc import Callable

    from collector.config import CollectorConfig

pytestmark = pytest.mark.integration

EVENTS = 1_200
DISTINCT_XIDS = 400
MOST_GROWTH_MB = 100  # what the flood may add to the collector's RSS (before: 300 MB by 1,000)


def metrics(service: CollectorService) -> str:
    url = f"http://127.0.0.1:{service.http_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as resp:
        return str(resp.read().decode())


async def test_an_xid_flood_from_one_node_is_journaled_in_bounded_memory(
    collector_config: Callable[..., CollectorConfig],
):
    service = CollectorService(collector_config(missed_heartbeats=10_000), SystemClock())
    await service.start()
    try:
        gc.collect()
        before = psutil.Process().memory_info().rss
        async with grpc.aio.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
            call: grpc.aio.StreamStreamCall[bytes, bytes] = channel.stream_stream(
                settings.STREAM_METHOD
            )()
            hello = made_up_hello("flood-1", gpus=2)
            await call.write(pb.AgentMessage(hello=hello).SerializeToString())
            await call.read()  # Welcome

            async def read_acks() -> None:
                while await call.read() is not grpc.aio.EOF:
                    pass

            acks = asyncio.ensure_future(read_acks())
            now = int(time.time() * 1000)
            for seq in range(1, EVENTS + 1):
                xid = seq % DISTINCT_XIDS + 1
                event = pb.Event(
                    seq=seq,
                    time_unix_ms=now + seq,
                    kind=pb.EVENT_KIND_XID,
                    target=pb.Target(
                        kind=pb.TARGET_KIND_GPU, gpu_uuid=made_up_uuid("flood-1", seq % 2)
                    ),
                    xid=xid,
                    detail=f"NVRM: Xid (PCI:0000:18:00): {xid}, pid=1, name=x, flood {seq}",
                )
                await call.write(pb.AgentMessage(event=event).SerializeToString())
            await wait_until(
                lambda: service.reader.count() >= EVENTS, timeout=120, what="every event journaled"
            )
            await call.done_writing()
            acks.cancel()
        gc.collect()
        grown_mb = (psutil.Process().memory_info().rss - before) / 1e6
        assert grown_mb < MOST_GROWTH_MB, f"{grown_mb:.0f} MB for {EVENTS} events"
        text = await asyncio.to_thread(metrics, service)
        for gpu in ("0", "1"):
            series = re.findall(
                rf'fleetwatch_gpu_xid_errors_total{{node="flood-1",gpu="{gpu}",xid="([^"]+)"', text
            )
            assert len(series) == MAX_XIDS_PER_GPU + 1, series  # the rest fold into "other"
            assert "other" in series
        counted = re.findall(r'fleetwatch_gpu_xid_errors_total{node="flood-1".*} (\S+)', text)
        assert sum(float(c) for c in counted) == EVENTS  # folded, never dropped
    finally:
        await service.stop(grace=None)
