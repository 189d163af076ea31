"""The Redfish BMC source against a real Redfish service: sushy-tools' ``sushy-static`` emulator.

The emulator serves a mockup tree (``<path>/index.json``) over HTTPS with a certificate from the
tests' CA, reading each file at each request; the test edits the served documents as a BMC's
sensors would change them (a fan stops, supplies fail, an SEL entry is logged) and checks what
the agent's poller reports.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from agent.poll.bmc import BmcPoller
from agent.sim.bmc import SimBmc, write_mockup
from agent.sources.bmc import BmcError
from agent.sources.bmc_redfish import HttpsTransport, RedfishBmc
from fleetwatch.model import EventKind, Target
from fleetwatch.testing import free_port
from tests.tls_pki import make_pki

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

SUSHY_STATIC = Path(sys.executable).parent / "sushy-static"
NODE = Target.node()

pytestmark = pytest.mark.skipif(
    not SUSHY_STATIC.exists(), reason="sushy-tools is not installed (pip install -e '.[dev]')"
)


class Emulator:
    """A running sushy-static serving ``mockup`` on 127.0.0.1:``port`` over HTTPS."""

    def __init__(self, mockup: Path, port: int, ca: Path) -> None:
        self.mockup, self.port, self.ca = mockup, port, ca

    def edit(self, path: str, change: Callable[[dict[str, Any]], None]) -> None:
        """Change the served document at ``path`` (under /redfish/v1)."""
        file = self.mockup / path.strip("/") / "index.json"
        doc = json.loads(file.read_text())
        change(doc)
        file.write_text(json.dumps(doc))

    def poller(self, **tls: Any) -> BmcPoller:
        transport = HttpsTransport(
            "127.0.0.1",
            self.port,
            "admin",
            "s3cret",
            timeout_s=5.0,
            **(tls or {"ca_file": self.ca}),
        )
        return BmcPoller(RedfishBmc(transport, f"127.0.0.1:{self.port}"), timeout_s=10.0)


def _wait_listening(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            msg = f"sushy-static exited with {proc.returncode}"
            raise RuntimeError(msg)
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    msg = "sushy-static did not listen within 30 s"
    raise RuntimeError(msg)


@pytest.fixture
def emulator(tmp_path: Path) -> Iterator[Emulator]:
    pki = make_pki(tmp_path / "pki")
    keys = pki.collector("127.0.0.1,localhost")  # a server certificate for the loopback address
    mockup = tmp_path / "mockup"
    write_mockup(SimBmc(), mockup)
    port = free_port()
    proc = subprocess.Popen(
        [
            str(SUSHY_STATIC),
            "--interface",
            "127.0.0.1",
            "--port",
            str(port),
            "--mockup-files",
            str(mockup),
            "--ssl-certificate",
            str(keys["tls_cert"]),
            "--ssl-key",
            str(keys["tls_key"]),
        ],
        stdout=subprocess.DEVNULL,  # it prints every request's headers
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_listening(port, proc)
        yield Emulator(mockup, port, pki.ca_cert)
    finally:
        proc.terminate()
        proc.wait(10)


def kinds(events: list[Any]) -> list[tuple[EventKind, str]]:
    return [(e.kind, e.target.device) for e in events]


async def test_sensors_the_bmc_changes_become_samples_and_events(emulator: Emulator):
    poller = emulator.poller()
    first = await poller.poll(1)
    assert first.events == []
    assert first.samples[NODE, "bmc_up"] == 1
    assert first.samples[NODE, "bmc_fans"] == 10
    assert first.samples[NODE, "bmc_psus_working"] == 6
    assert first.samples[NODE, "bmc_inlet_temperature_celsius"] == pytest.approx(24)

    def stop_fan(doc: dict[str, Any]) -> None:
        doc["Fans"][3].update(Reading=0, Status={"State": "Enabled", "Health": "Critical"})

    def fail_two_supplies(doc: dict[str, Any]) -> None:
        for psu in doc["PowerSupplies"][1:3]:
            psu["Status"] = {"State": "Enabled", "Health": "Critical"}
        doc["Redundancy"][0]["Status"] = {"State": "Enabled", "Health": "Critical"}

    def log_entry(doc: dict[str, Any]) -> None:
        doc["Members"].append(
            {"Id": "1", "Severity": "Critical", "SensorType": "Battery", "Message": "CMOS low"}
        )

    emulator.edit("Chassis/1/Thermal", stop_fan)
    emulator.edit("Chassis/1/Power", fail_two_supplies)
    emulator.edit("Managers/BMC/LogServices/SEL/Entries", log_entry)
    second = await poller.poll(2)
    assert sorted(kinds(second.events)) == sorted(
        [
            (EventKind.FAN_FAILED, "Fan_3"),
            (EventKind.PSU_FAILED, "PSU1"),
            (EventKind.PSU_FAILED, "PSU2"),
            (EventKind.PSU_REDUNDANCY_LOST, ""),
            (EventKind.BMC_SEL_CRITICAL, "Battery"),
        ]
    )
    assert second.samples[NODE, "bmc_fans_failed"] == 1
    assert second.samples[NODE, "bmc_psus_failed"] == 2
    assert second.samples[NODE, "bmc_psu_redundancy_lost"] == 1
    assert (await poller.poll(3)).events == []  # nothing changed: nothing new


async def test_tls_verifies_the_bmc_certificate_unless_told_not_to(emulator: Emulator):
    untrusted = emulator.poller(ca_file=None)  # the system's CAs did not sign it
    result = await untrusted.poll(1)
    assert result.samples[NODE, "bmc_up"] == 0
    assert untrusted.errors == 1
    with pytest.raises(BmcError, match="CERTIFICATE_VERIFY_FAILED"):
        HttpsTransport("127.0.0.1", emulator.port, "a", "b").get("/redfish/v1/")
    insecure = emulator.poller(insecure=True)
    assert (await insecure.poll(1)).samples[NODE, "bmc_up"] == 1


async def test_a_bmc_that_accepts_and_never_answers_costs_one_deadline(tmp_path: Path):
    """A BMC whose web server hangs: the read gives up at the deadline, the poll goes on."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        silent.settimeout(0.1)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                held.append(silent.accept()[0])  # never answers the TLS handshake

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        port = silent.getsockname()[1]
        transport = HttpsTransport("127.0.0.1", port, "a", "b", timeout_s=30.0)
        poller = BmcPoller(RedfishBmc(transport, "hung"), timeout_s=0.5)
        result = await poller.poll(1)
        # Hung, not failed: the read gave up at its deadline while the socket still waited (a
        # read that waited out the socket's 30 s would have failed instead).
        assert result.samples[NODE, "bmc_up"] == 0
        assert result.samples[NODE, "agent_bmc_hung"] == 1
    finally:
        stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        silent.close()
