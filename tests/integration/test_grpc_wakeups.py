"""gRPC's completions reach a busy event loop in bursts, not one per turn.

grpcio's asyncio stack wakes the loop with a byte per completion and its reader takes one byte
a turn; once 278 bytes pile up its poller thread blocks, and completions then come one per turn
of the loop. A collector restart (thousands of streams at once) stalled the nodes already back
for ten seconds that way. Real gRPC streams on loopback, the loop kept busy 2 ms a turn, each
run in a process of its own (``grpc_burst.py`` says why).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def burst(*flags: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-m", "tests.integration.grpc_burst", *flags],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    answer: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


def test_a_burst_of_completions_reaches_the_loop_in_a_few_turns():
    out = burst("--drained")
    assert out["found"], "gRPC's wakeup reader was not found"
    assert out["found_again"]  # a second call finds the reader already wrapped
    assert out["echoed"] == out["streams"]
    assert isinstance(out["drained"], int)
    assert out["drained"] > 0  # the surplus bytes were read
    assert isinstance(out["turns"], int)
    assert out["turns"] < 100, f"{out['turns']} turns for {out['streams']} echoes"


def test_without_the_drain_the_burst_takes_a_turn_a_completion():
    """What the drain is for: the same burst, gRPC's reader as it comes (this test fails, and
    the drain can go, once grpcio reads every byte it has written)."""
    out = burst()
    assert out["echoed"] == out["streams"]
    assert isinstance(out["turns"], int)
    assert isinstance(out["streams"], int)
    assert out["turns"] >= out["streams"], f"{out['turns']} turns for {out['streams']} echoes"
