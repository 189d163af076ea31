"""The BMC's answers: hostile Redfish bodies and documents, and hostile ``ipmitool`` listings,
through the real readers and the real poller. A reader gives a reading (or SEL entries) with
finite numbers and bounded names, or BmcError with a short message naming what was wrong; the
poller never raises, counts every failed read, and what it makes the wire carries."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from hypothesis import example, given
from hypothesis import strategies as st

from agent.outbox.changes import refusal
from agent.poll.bmc import BmcPoller
from agent.sim.bmc import CHASSIS, ROOT, SEL_ENTRIES, SimBmc, SimRedfishService
from agent.sources.bmc import BmcError, BmcReading, SelEntry, SelRead
from agent.sources.bmc_ipmi import IpmiBmc, parse_power_supplies, parse_sel_list, parse_sensor_list
from agent.sources.bmc_redfish import MAX_BODY, RedfishBmc, decode_answer
from fleetwatch.model import sample_to_pb
from fleetwatch.wire.validate import DEVICE_NAME, MAX_DETAIL, Inventory, validate_event
from tests.property.hostile import HUGE_INTS, SCALARS, WEIRD_TEXT, assert_clear, nested, tried

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from agent.poll.findings import PollResult
    from agent.sources.bmc import Fan, PowerSupply, Temperature
    from agent.sources.sel_cursor import SelCursor

REDFISH = "bmc_redfish"
IPMI = "bmc_ipmi"
NOW_MS = 1_767_225_600_000
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "ipmitool"
MAX_DESCRIBE = 512  # one component's line in an event's detail

# ---- Redfish ---------------------------------------------------------------------------------

# JSON text put into a document where a value goes: what json.dumps never writes.
RAW = [
    "NaN",
    "Infinity",
    "-Infinity",
    "1e400",
    "-1e400",
    "1e-400",
    "1" + "0" * 400,
    "9" * 4000,  # a 4,000-digit number: still a Python int
    "-" + "9" * 4000,
    "9" * 5000,  # past int()'s digit limit
    "[" * 100_000 + "]" * 100_000,
    "[" * 990 + "]" * 990,  # just inside json's own recursion limit
    '{"a":' * 600 + "1" + "}" * 600,
    '"\\ud800"',  # a lone surrogate, which no UTF-8 (and no protobuf string) can hold
    '"a\\udfffb\\ud83d"',
    '"\\u0000\\u2028\\u001b[31m"',
    '"' + "x" * 70_000 + '"',
    '"0x' + "f" * 4000 + '"',
    '"' + "9" * 4000 + '"',
    '"-5"',
    '"0x1f"',
    '"1_000"',
    "true",
    "null",
    "[]",
    "{}",
]
PLACEHOLDER = "\x01raw{}\x01"
KEYS = [
    "Id",
    "Name",
    "MemberId",
    "Reading",
    "ReadingCelsius",
    "ReadingType",
    "LowerThresholdCritical",
    "UpperThresholdCritical",
    "Thresholds",
    "SpeedPercent",
    "Status",
    "Health",
    "State",
    "PhysicalContext",
    "LineInputVoltage",
    "LastPowerOutputWatts",
    "PowerConsumedWatts",
    "MinNumNeeded",
    "Members",
    "Members@odata.nextLink",
    "@odata.id",
    "Chassis",
    "Managers",
    "Systems",
    "Thermal",
    "Power",
    "ThermalSubsystem",
    "PowerSubsystem",
    "Sensors",
    "Fans",
    "PowerSupplies",
    "LogServices",
    "Entries",
    "LogEntryType",
    "Severity",
    "SensorType",
    "SensorNumber",
    "Message",
    "EntryCode",
    "Created",
]
SIM = SimBmc()
SIM.fail_fan(3)
SIM.unplug_psu(1)
SIM.heat_inlet(45.0)
for i in range(6):
    SIM.log("Critical" if i % 2 else "Warning", "Power Supply", f"entry {i}")
SIM_SERVICE = SimRedfishService(SIM)


def _paths() -> list[str]:
    """The paths the reader asks for, as it asks for them (the root with its slash)."""
    asked: list[str] = []

    class Recording:
        def get(self, path: str) -> dict[str, Any]:
            asked.append(path)
            return SIM_SERVICE.get(path)

    bmc = RedfishBmc(Recording(), "sim")
    bmc.read()
    bmc.read_sel(None)
    return sorted(set(asked))


PATHS = _paths()
LINKS = st.sampled_from([*PATHS, "/nope", "/", "", "relative/path", "/" + "a" * 3000])


def _raw(index: int) -> str:
    return PLACEHOLDER.format(index)


def _body(doc: object) -> bytes:
    """``doc`` as JSON, its placeholders replaced by their raw text."""
    try:
        text = json.dumps(doc, allow_nan=True)
    except (ValueError, RecursionError):  # an int past the digit limit: write it by hand
        text = json.dumps(repr(doc))
    for index, raw in enumerate(RAW):
        text = text.replace(json.dumps(_raw(index)), raw)
    return text.encode("utf-8", "surrogatepass")


THERMAL, POWER, CHASSIS_LIST = f"{CHASSIS}/Thermal", f"{CHASSIS}/Power", f"{ROOT}/Chassis"
NEAR_LIMIT = _raw(RAW.index("[" * 990 + "]" * 990))
SURROGATE = _raw(RAW.index('"\\ud800"'))
SURROGATES = _raw(RAW.index('"a\\udfffb\\ud83d"'))


def sel_entry(**fields: object) -> dict[str, object]:
    """A critical SEL entry, numbered 7, with ``fields`` changed."""
    return {"Id": "7", "Severity": "Critical", "Message": "PSU failure", **fields}


def answer(path: str, doc: object) -> dict[str, tuple[int, bytes]]:
    """``path`` answered with ``doc`` (with its raw placeholders)."""
    return {path: (200, _body(doc))}


VALUES = st.one_of(
    SCALARS,
    HUGE_INTS,
    nested(),
    st.integers(0, len(RAW) - 1).map(_raw),
    st.builds(lambda link: {"@odata.id": link}, LINKS),
    st.lists(st.builds(lambda link: {"@odata.id": link}, LINKS), max_size=6),
)


def _containers(node: object) -> list[Any]:
    if isinstance(node, dict):
        return [v for v in node.values() if isinstance(v, dict | list)]
    if isinstance(node, list):
        return [v for v in node if isinstance(v, dict | list)]
    return []


@st.composite
def edited(draw: st.DrawFn, doc: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``doc`` with a few values replaced, removed or added, anywhere in it."""
    doc = json.loads(json.dumps(doc))
    for _ in range(draw(st.integers(1, 4))):
        node: Any = doc
        for _ in range(draw(st.integers(0, 4))):
            inner = _containers(node)
            if not inner:
                break
            node = draw(st.sampled_from(inner))
        if isinstance(node, dict):
            key = draw(st.sampled_from([*node, *KEYS]) if node else st.sampled_from(KEYS))
            if draw(st.integers(0, 3)) == 0:
                node.pop(key, None)
            else:
                node[key] = draw(VALUES)
        elif node:
            at = draw(st.integers(0, len(node) - 1))
            if draw(st.booleans()):
                del node[at]
            else:
                node[at] = draw(VALUES)
        else:
            node.append(draw(VALUES))
    return doc


@st.composite
def bodies(draw: st.DrawFn, path: str) -> bytes:
    """What the BMC answers at ``path``: its document edited, other JSON, or any bytes."""
    kind = draw(st.integers(0, 5))
    if kind == 0:
        return draw(st.binary(max_size=300))
    if kind == 1:
        return draw(st.sampled_from(RAW)).encode()
    if kind == 2:
        return _body(draw(nested()))
    return _body(draw(edited(SIM_SERVICE.get(path.rstrip("/") or "/"))))


@st.composite
def answers(draw: st.DrawFn) -> dict[str, tuple[int, bytes]]:
    """Some of the simulator's paths answered with hostile bodies (or an HTTP error)."""
    out: dict[str, tuple[int, bytes]] = {}
    for path in draw(st.lists(st.sampled_from(PATHS), min_size=1, max_size=4, unique=True)):
        status = draw(st.sampled_from([200, 200, 200, 200, 401, 404, 500, 302, 0, 999]))
        out[path] = (status, draw(bodies(path)))
    return out


class HostileService:
    """The simulator's documents as an answer's bytes, through ``decode_answer``; some replaced."""

    def __init__(self, replaced: dict[str, tuple[int, bytes]]) -> None:
        self.replaced = replaced
        self.gets = 0

    def get(self, path: str) -> dict[str, Any]:
        self.gets += 1
        assert self.gets < 5_000, "the reader follows links without end"
        status, body = self.replaced.get(path, (200, b""))
        if not body and status == 200:
            body = json.dumps(SIM_SERVICE.get(path)).encode()
        return decode_answer(path, status, body)


def _finite(value: float | None) -> bool:
    return value is None or math.isfinite(value)


def check_reading(reading: BmcReading) -> None:
    """Finite numbers, names a wire target's device may carry, bounded lines."""
    items: list[Fan | PowerSupply | Temperature] = [
        *reading.fans,
        *reading.psus,
        *reading.temperatures,
    ]
    for item in items:
        assert DEVICE_NAME.fullmatch(item.name), item.name[:100]
        assert len(item.describe()) <= MAX_DESCRIBE
    for fan in reading.fans:
        assert _finite(fan.rpm)
        assert _finite(fan.lower_critical)
    for psu in reading.psus:
        assert _finite(psu.output_watts)
    for temp in reading.temperatures:
        assert _finite(temp.celsius)
        assert _finite(temp.upper_critical)
    assert reading.psus_needed is None or isinstance(reading.psus_needed, int)


def check_entries(entries: list[SelEntry]) -> None:
    for entry in entries:
        assert isinstance(entry.key, int)
        assert len(entry.sensor) <= 64
        assert len(entry.message) <= 200
        assert len(entry.describe()) <= MAX_DESCRIBE


def check_sel(sel: SelRead, after: int | None) -> None:
    check_entries(sel.entries)
    keys = [e.key for e in sel.entries]
    assert keys == sorted(keys)
    if after is None:
        assert not sel.entries
    elif sel.last_key >= after:
        assert all(k > after for k in keys)


def read_all(bmc: RedfishBmc | IpmiBmc, after: int | None) -> None:
    """A reading and the SEL, each a value or a clear BmcError."""
    try:
        check_reading(bmc.read())
    except BmcError as exc:
        assert_clear(exc)
    try:
        check_sel(bmc.read_sel(after), after)
    except BmcError as exc:
        assert_clear(exc)


def check_poll(poller: BmcPoller, result: PollResult, errors_before: int) -> None:
    """The poll counted a failure or read the BMC; what it made, the agent can send."""
    samples = {signal: value for (_, signal), value in result.samples.items()}
    assert samples["bmc_up"] in (0, 1)
    if samples["bmc_up"] == 0:
        assert poller.errors == errors_before + 1
    assert samples["agent_source_errors_bmc"] == poller.errors
    for (target, signal), value in result.samples.items():
        if refusal(value) is None:  # what the agent would refuse, it counts and keeps out
            sample_to_pb(target, signal, value)
    for seq, event in enumerate(result.events, start=1):
        assert len(event.detail) <= MAX_DETAIL
        validate_event(event.to_pb(seq), Inventory())  # the agent drops what this refuses


class StartAt:
    """A SEL cursor kept in memory: the poller reads the SEL after ``key`` from its first poll."""

    def __init__(self, key: int | None) -> None:
        self.key = key

    def load(self) -> int | None:
        return self.key

    def save(self, key: int) -> None:
        self.key = key


def poll_twice(source: RedfishBmc | IpmiBmc, after: int | None) -> None:
    """Two polls of ``source``, the SEL read after ``after`` from the first."""
    poller = BmcPoller(source, cursor=cast("SelCursor", StartAt(after)), timeout_s=60.0)

    async def run() -> None:
        for at in (NOW_MS, NOW_MS + 30_000):
            before = poller.errors
            check_poll(poller, await poller.poll(at), before)
            poller.commit_sel()

    asyncio.run(run())


class TestRedfishAnswer:
    @given(st.sampled_from([200, 200, 200, 401, 403, 404, 500, 0, -1, 10**6]), st.binary())
    @example(200, b"[" * 100_000 + b"]" * 100_000)
    @example(200, b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    @example(200, b'{"Id": ' + b"9" * 4000 + b"}")
    @example(200, b'{"Id": ' + b"9" * 5000 + b"}")
    @example(200, b'{"Reading": NaN}')
    @example(200, b'{"Reading": -Infinity}')
    @example(200, b'{"Reading": 1e400}')
    @example(200, b"\xff\xfe{}")
    @example(200, b'{"Name": "\\ud800"}')
    @example(200, b" " * (MAX_BODY + 1))
    @example(200, b'"just a string"')
    def test_any_body_is_an_object_or_a_clear_error(self, status, body):
        """Any status and body: a JSON object, or BmcError naming the path, short."""
        tried(REDFISH)
        try:
            doc = decode_answer("/redfish/v1/Chassis/1", status, body)
        except BmcError as exc:
            assert_clear(exc, "/redfish/v1/Chassis/1")
            return
        assert isinstance(doc, dict)

    @given(answers(), st.one_of(st.none(), st.integers(0, 10), HUGE_INTS))
    @example(answer(THERMAL, {"Fans": [{"Name": NEAR_LIMIT}]}), 0)
    @example(answer(THERMAL, {"Fans": [{"Status": {"Health": NEAR_LIMIT}}]}), 0)
    @example(answer(POWER, {"PowerSupplies": [{"Name": NEAR_LIMIT}]}), 0)
    @example(answer(SEL_ENTRIES, {"Members": [{"Id": "7", "Message": NEAR_LIMIT}]}), 0)
    @example(answer(SEL_ENTRIES, {"Members": [{"Id": 10**400, "Severity": "Critical"}]}), 0)
    @example(answer(SEL_ENTRIES, {"Members": [{"Id": "1", "SensorNumber": 10**400}]}), 0)
    @example(answer(SEL_ENTRIES, {"Members": [{"Id": "0x" + "f" * 4000}]}), 0)
    @example(answer(CHASSIS_LIST, {"Members": [], "Members@odata.nextLink": CHASSIS_LIST}), None)
    def test_hostile_documents_read_or_fail_clearly(self, replaced, after):
        """The simulator's documents with some made hostile: readings and SEL, or BmcError."""
        tried(REDFISH)
        read_all(RedfishBmc(HostileService(replaced), "hostile-bmc"), after)

    @given(answers(), st.one_of(st.none(), st.integers(0, 10), HUGE_INTS))
    @example(answer(SEL_ENTRIES, {"Members": [sel_entry(Message=SURROGATE)]}), 0)
    @example(
        answer(SEL_ENTRIES, {"Members": [sel_entry(SensorType=SURROGATES, Created=SURROGATE)]}), 0
    )
    @example(answer(SEL_ENTRIES, {"Members": [sel_entry(Id=str(i)) for i in range(1, 400)]}), 0)
    @example(answer(POWER, {"PowerControl": [{"PowerConsumedWatts": 1e308}] * 2}), None)
    @example(answer(POWER, {"Redundancy": [{"MinNumNeeded": 1e308}] * 2}), None)
    @example(answer(THERMAL, {"Temperatures": [{"Name": NEAR_LIMIT, "ReadingCelsius": 1}]}), None)
    def test_the_poller_counts_what_it_cannot_read(self, replaced, after):
        """Two polls over a hostile service: never raised, failures counted, events valid."""
        tried(REDFISH)
        poll_twice(RedfishBmc(HostileService(replaced), "hostile-bmc"), after)


# ---- IPMI ------------------------------------------------------------------------------------

LISTINGS = {
    name: (FIXTURES / f"{name}.txt").read_text().splitlines()
    for name in ("sensor", "sdr-type-power-supply", "sel-elist")
}
FIELDS = st.one_of(
    WEIRD_TEXT,
    st.sampled_from(
        [
            "na",
            "ns",
            "ok",
            "cr",
            "nr",
            "inf",
            "-inf",
            "nan",
            "1e400",
            "-0.000",
            "9" * 5000,
            "0x" + "f" * 5000,
            "f" * 16,
            "f" * 17,
            "-1",
            "RPM",
            "degrees C",
            "Presence detected, Failure detected, Power Supply AC lost",
            "Redundancy Lost",
            "Fully Redundant",
            "Asserted",
            "Deasserted",
            "Power Supply PS1 Status",
            "Fan #0x30",
            "\x00\x1b[2J\x07",
            "\ufffd\ufffd",
            "\u2028",
            "\r",
            "\x0b\x0c\x1c\x1d\x1e\x85",
            "a|b|c",
        ]
    ),
)


@st.composite
def listing(draw: st.DrawFn, name: str) -> str:
    """``ipmitool``'s listing with lines mutated: columns changed, added, dropped; or junk."""
    kind = draw(st.integers(0, 4))
    if kind == 0:  # what run_ipmitool makes of any bytes
        return draw(st.binary(max_size=400)).decode(errors="replace")
    lines = list(LISTINGS[name])
    for _ in range(draw(st.integers(0, 6))):
        at = draw(st.integers(0, len(lines)))
        base = lines[at % len(lines)] if lines else ""
        cols = base.split("|")
        for _ in range(draw(st.integers(1, 4))):
            op = draw(st.integers(0, 3))
            i = draw(st.integers(0, len(cols)))
            if op == 0 and cols:
                del cols[i % len(cols)]
            elif op == 1:
                cols.insert(i, draw(FIELDS))
            elif cols:
                cols[i % len(cols)] = draw(FIELDS)
        line = draw(st.sampled_from(["|", " | ", "||"])).join(cols)
        if draw(st.booleans()):
            lines.insert(at, line)
        elif lines:
            lines[at % len(lines)] = line
    if kind == 1:
        lines = lines * draw(st.integers(1, 50))
    return draw(st.sampled_from(["\n", "\r\n", "\r"])).join(lines)


def check_ipmi_sensors(text: str) -> None:
    fans, temps = parse_sensor_list(text)
    check_reading(BmcReading(fans=tuple(fans), temperatures=tuple(temps)))
    assert len(fans) + len(temps) <= len(text.splitlines())


def check_ipmi_psus(text: str) -> None:
    psus, redundancy = parse_power_supplies(text)
    check_reading(BmcReading(psus=tuple(psus)))
    assert redundancy in (None, True, False)
    assert len(psus) <= len(text.splitlines())


def check_ipmi_sel(text: str) -> None:
    entries = parse_sel_list(text)
    check_entries(entries)
    for entry in entries:
        assert 0 <= entry.key < 2**64
        assert len(entry.created) <= 40
        assert len(entry.sensor_type) <= 40
    assert len(entries) <= len(text.splitlines())


def _parses(check: Callable[[str], None], text: str) -> None:
    """The parsers return values; BmcError with a clear message is the only error allowed."""
    try:
        check(text)
    except BmcError as exc:
        assert_clear(exc)


class TestIpmiListings:
    @given(listing("sensor"))
    @example("FAN0 | " + "9" * 5000 + " | RPM | ok | na | " + "9" * 5000 + " | na | na | na | na")
    @example("T | 1e400 | degrees C | ok | na | na | na | na | -1e400 | na")
    @example("FAN0 | nan | RPM | cr | na | inf | na | na | na | na | extra | columns")
    @example("\x00\x1b | 1 | RPM | ok" + " | na" * 6)
    @example("\ufffd" * 5000 + " | 1 | degrees C | ok" + " | na" * 6)
    def test_sensor_listing(self, text):
        """``ipmitool sensor``: fans and temperatures with finite readings and safe names."""
        tried(IPMI)
        _parses(check_ipmi_sensors, text)

    @given(listing("sdr-type-power-supply"))
    @example("PS1 | 50h | ok | 10.1")  # a column short
    @example("x" * 5000 + " | 50h | cr | 10.1 | Failure detected | | | |")
    @example(" | | | | ")
    def test_power_supply_listing(self, text):
        """``sdr type "Power Supply"``: supplies and a redundancy verdict, or nothing."""
        tried(IPMI)
        _parses(check_ipmi_psus, text)

    @given(listing("sel-elist"))
    @example("f" * 16 + " | d | t | Fan FAN1 | failure | Asserted")
    @example("f" * 17 + " | d | t | Fan FAN1 | failure | Asserted")
    @example("9" * 5000 + " | d | t | s | e")
    @example("-1 | d | t | s | e")
    @example("1 | " + "d" * 5000 + " | t | " + "s" * 5000 + " | " + "e" * 5000 + " | x | y")
    def test_sel_listing(self, text):
        """``sel elist``: entries with 64-bit keys and bounded text, or none."""
        tried(IPMI)
        _parses(check_ipmi_sel, text)

    @given(
        listing("sensor"),
        listing("sdr-type-power-supply"),
        listing("sel-elist"),
        st.one_of(st.none(), st.integers(0, 2**64)),
    )
    def test_the_poller_over_ipmi(self, sensors, supplies, sel, after):
        """An IPMI BMC printing hostile listings: reads are values, polls never raise."""
        tried(IPMI)
        by_command: dict[str, str] = {"sensor": sensors, "Power Supply": supplies, "elist": sel}

        def run(argv: Sequence[str], _timeout: float) -> str:
            return by_command[argv[-1]]

        bmc = IpmiBmc("bmc", 623, "user", Path("/nonexistent"), run=run)
        read_all(bmc, after)
        poll_twice(bmc, after)
