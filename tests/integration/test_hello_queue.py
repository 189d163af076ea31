"""A restart storm: thousands of Hellos arrive while the collector's event loop is busy.

gRPC keeps the calls its server has not taken up yet in a queue, and by default cancels those
beyond 3,000 at once: after a restart each of those agents saw CANCELLED within a second and
backed off, longer each time, and that was the restart's long tail. The collector's queue holds
a fleet (``fleetwatch.wire.settings.MAX_PENDING_STREAMS``): every Hello waits its turn.
"""

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from collector.main import CollectorService

pytestmark = pytest.mark.integration

HELLOS = 3_300  # past gRPC's default of 3,000 waiting calls
ROOT = Path(__file__).resolve().parents[2]


def connected_to(port: int) -> bool:
    """Whether a TCP connection to ``port`` on this host is established (the kernel's tables:
    gRPC may connect to 127.0.0.1 from an IPv6 socket)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            _, _, remote, state, *_ = line.split()
            if state == "01" and int(remote.rsplit(":", 1)[1], 16) == port:  # 01: ESTABLISHED
                return True
    return False


async def test_a_storm_of_hellos_waits_its_turn_and_none_is_cancelled(
    collector: CollectorService,
):
    """The Hellos come from a process of their own (tests/integration/hello_storm.py)."""
    sender = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.integration.hello_storm",
            str(collector.grpc_port),
            str(HELLOS),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        # The collector's loop (this one) is busy, as with a restart's first Reports: no stream
        # is taken up meanwhile, and every Hello that arrives waits in gRPC's queue. Blocking the
        # loop is the point; it lasts 5 s from the sender's connection, so that the storm lands
        # in it however long the sender took to start.
        deadline = time.monotonic() + 30
        while not connected_to(collector.grpc_port) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(5.0)
        deadline = time.monotonic() + 120
        while sender.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        assert sender.poll() is not None, "the Hellos did not finish in 120 s"
        out, err = sender.communicate()
        assert sender.returncode == 0, err.decode()[-2000:]
    finally:
        if sender.poll() is None:
            sender.kill()
            sender.communicate()
    outcomes = json.loads(out.decode().strip().splitlines()[-1])
    assert outcomes == {"welcome": HELLOS}
