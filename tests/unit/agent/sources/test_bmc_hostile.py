"""A BMC's answer, however hostile, is a counted read failure of the BMC, never the agent's end.

The documents go through the Redfish reader's own decoding (``decode_answer``, what the HTTPS
transport does with each body) and the real poller; only the socket is left out.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

from agent.poll.bmc import BmcPoller
from agent.sim.bmc import SimBmc, SimRedfishService
from agent.sources.bmc import BmcError
from agent.sources.bmc_redfish import RedfishBmc, decode_answer, parse_sel_entry
from agent.sources.sel_cursor import SelCursor
from fleetwatch.model import Target

if TYPE_CHECKING:
    from pathlib import Path

NODE = Target.node()


class BytesService:
    """The simulated BMC's documents as the bytes of an answer, with some replaced."""

    def __init__(self, replaced: dict[str, bytes]) -> None:
        self.sim = SimRedfishService(SimBmc())
        self.replaced = replaced
        self.paths: list[str] = []

    def get(self, path: str) -> dict[str, object]:
        self.paths.append(path)
        body = self.replaced.get(path)
        if body is None:
            body = json.dumps(self.sim.get(path)).encode()
        return decode_answer(path, 200, body)


def power_path() -> str:
    service = BytesService({})
    RedfishBmc(service, "b").read()
    (path,) = [p for p in service.paths if p.endswith("/Power")]
    return path


async def poll_with(path: str, body: bytes) -> tuple[BmcPoller, dict[tuple[Target, str], object]]:
    poller = BmcPoller(RedfishBmc(BytesService({path: body}), "hostile-bmc"))
    result = await poller.poll(1)
    return poller, dict(result.samples)


@pytest.mark.parametrize(
    "body",
    [
        b'{"Redundancy": [{"MinNumNeeded": Infinity}]}',
        b'{"Redundancy": [{"MinNumNeeded": NaN}]}',
        b'{"PowerSupplies": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b'{"PowerSupplies": [], "x": ' + b"9" * 5_000 + b"}",
    ],
    ids=["infinity", "nan", "100000-deep", "5000-digits"],
)
async def test_an_unreadable_answer_is_a_failed_read(body: bytes):
    poller, samples = await poll_with(power_path(), body)
    assert samples[NODE, "bmc_up"] == 0
    assert samples[NODE, "agent_source_errors_bmc"] == 1
    assert poller.errors == 1


async def test_a_number_no_float_holds_is_no_reading():
    """An integer past a float's range in a number field: that field is unread, not a crash."""
    body = b'{"Redundancy": [{"MinNumNeeded": 1' + b"0" * 400 + b'}], "PowerSupplies": []}'
    _, samples = await poll_with(power_path(), body)
    assert samples[NODE, "bmc_up"] == 1


def test_a_sel_id_of_thousands_of_digits_is_no_entry():
    assert parse_sel_entry({"Id": "0x" + "f" * 4000, "Severity": "Critical"}) is None
    assert parse_sel_entry({"Id": "9" * 5000, "Severity": "Critical"}) is None
    entry = parse_sel_entry({"Id": "0x1f", "Severity": "Critical"})
    assert entry is not None
    assert entry.key == 0x1F


class Exploding:
    """A BMC source whose reader fails with an error no parser was written to raise."""

    address = "odd-bmc"

    def __init__(self, error: Exception) -> None:
        self.error = error

    def read(self) -> object:
        raise self.error

    def read_sel(self, _after: int | None) -> object:
        raise AssertionError  # pragma: no cover - read fails first


@pytest.mark.parametrize(
    "error",
    [OverflowError("cannot convert float infinity to integer"), RecursionError(), KeyError("x")],
)
async def test_any_error_of_a_read_is_counted_and_polling_goes_on(error: Exception):
    poller = BmcPoller(Exploding(error))  # type: ignore[arg-type]
    for at in (1, 2):
        result = await poller.poll(at)
        assert result.samples[NODE, "bmc_up"] == 0
    assert poller.errors == 2


def test_decode_refuses_what_json_is_not():
    with pytest.raises(BmcError, match="Infinity is not a JSON number"):
        decode_answer("/p", 200, b'{"a": -Infinity}')
    with pytest.raises(BmcError, match="nested too deep"):
        decode_answer("/p", 200, b"[" * 100_000)


async def test_a_lone_surrogate_in_an_sel_entry_keeps_its_event(tmp_path: Path):
    """JSON's ``\\ud800`` escape is no UTF-8: it becomes U+FFFD, the entry's event still goes."""
    body = (
        b'{"Members": [{"Id": "7", "Severity": "Critical", "SensorType": "Fan\\udfff",'
        b' "Message": "PSU \\ud800 failed", "Created": "\\ud83d"}]}'
    )
    entry = parse_sel_entry(json.loads(body)["Members"][0])
    assert entry is not None
    assert (entry.sensor, entry.message, entry.created) == (
        "Fan\ufffd",
        "PSU \ufffd failed",
        "\ufffd",
    )
    service = BytesService({})
    RedfishBmc(service, "b").read_sel(None)
    (entries,) = [p for p in service.paths if p.endswith("/Entries")]
    service.replaced[entries] = body
    cursor = SelCursor(tmp_path / "sel.json", "hostile-bmc")
    cursor.save(0)  # every entry is new
    poller = BmcPoller(RedfishBmc(service, "hostile-bmc"), cursor=cursor)
    result = await poller.poll(1)
    (event,) = [e for e in result.events if e.detail.startswith("SEL 7")]
    assert event.to_pb(1).detail == "SEL 7 critical: Fan\ufffd: PSU \ufffd failed at \ufffd"
