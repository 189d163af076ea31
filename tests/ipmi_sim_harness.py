"""OpenIPMI's ``ipmi_sim`` as a node's BMC for tests: fans, temperatures, supplies and a SEL.

The simulator answers ``ipmitool -I lanplus`` on a loopback UDP port. Its sensors are declared
with IPMI Full Sensor Records (``main_sdr_add``, built here byte by byte per the IPMI 2.0
specification, table 43-1) and changed at run time through its console (the process's standard
input: ``sensor_set_value``, ``sensor_set_bit``), as a BMC's sensors change; a threshold crossed
or a state asserted with events on logs an SEL entry, as a real BMC does.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from pathlib import Path

IPMI_SIM: Final = shutil.which("ipmi_sim") or "/usr/bin/ipmi_sim"
IPMITOOL: Final = shutil.which("ipmitool") or "/usr/bin/ipmitool"
MC: Final = "0x20"
USER: Final = "fleetwatch"  # of IPMI's User privilege: it only reads
PASSWORD: Final = "s3cret-ipmi"  # noqa: S105 - the simulator's, made up for the test

# Sensor types, event/reading types and units (IPMI 2.0 tables 42-1, 42-3, 43-15).
FAN, TEMPERATURE, POWER_SUPPLY = 0x04, 0x01, 0x08
THRESHOLD, GENERIC_REDUNDANCY, SENSOR_SPECIFIC = 0x01, 0x0B, 0x6F
DEGREES_C, RPM = 0x01, 0x12
# Entity ids (table 43-13): power supply, system board, fan/cooling device.
ENTITY_PSU, ENTITY_BOARD, ENTITY_FAN = 0x0A, 0x07, 0x1D


@dataclass(frozen=True)
class Sensor:
    """One sensor: number, name, type, reading type, unit, multiplier M, entity."""

    number: int
    name: str
    sensor_type: int
    reading_type: int
    unit: int = 0
    m: int = 1
    entity: int = ENTITY_BOARD


FANS: Final = tuple(
    Sensor(0x30 + i, f"FAN{i}", FAN, THRESHOLD, RPM, 100, ENTITY_FAN) for i in (0, 1, 2)
)
INLET: Final = Sensor(0x40, "Inlet Temp", TEMPERATURE, THRESHOLD, DEGREES_C)
EXHAUST: Final = Sensor(0x41, "Exhaust Temp", TEMPERATURE, THRESHOLD, DEGREES_C)
PSUS: Final = tuple(
    Sensor(0x50 + i, f"PS{i + 1} Status", POWER_SUPPLY, SENSOR_SPECIFIC, entity=ENTITY_PSU)
    for i in (0, 1)
)
REDUNDANCY: Final = Sensor(
    0x52, "PS Redundancy", POWER_SUPPLY, GENERIC_REDUNDANCY, entity=ENTITY_PSU
)
SENSORS: Final = (*FANS, INLET, EXHAUST, *PSUS, REDUNDANCY)
# The states that log SEL entries, as ipmi_sim's 15-bit masks (bit 0 rightmost): a fan's lower
# non-critical and critical going low; a temperature's upper non-critical and critical going
# high; a supply's presence, failure, predictive failure and input lost; redundancy's states.
EVENT_BITS: Final = {
    (FAN, THRESHOLD): "000000000000101",
    (TEMPERATURE, THRESHOLD): "000001010000000",
    (POWER_SUPPLY, SENSOR_SPECIFIC): "000000000001111",
    (POWER_SUPPLY, GENERIC_REDUNDANCY): "000000000000111",
}


def full_sensor_record(record_id: int, s: Sensor) -> bytes:
    """An SDR type 01h (Full Sensor Record) for ``s``."""
    threshold = s.reading_type == THRESHOLD
    name = s.name.encode("ascii")
    body = bytes(
        [
            int(MC, 16),  # sensor owner id
            0,  # owner LUN
            s.number,
            s.entity,
            1,  # entity instance
            0x7F,  # init: scanning, events, thresholds, hysteresis, type; events and scanning on
            0x68 if threshold else 0x40,  # auto re-arm; thresholds readable and settable
            s.sensor_type,
            s.reading_type,
            0xFF,
            0x7F,  # assertion event mask (every state, or every threshold going the wrong way)
            0xFF,
            0x7F,  # deassertion event mask
            0x3F if threshold else 0xFF,  # settable / readable thresholds, or discrete reading mask
            0x3F if threshold else 0x7F,
            0x00,  # unsigned analog reading
            s.unit,
            0x00,  # no modifier unit
            0x00,  # linear
            s.m & 0xFF,
            (s.m >> 8) << 6,  # M's top bits, tolerance 0
            0,
            0,  # B = 0, accuracy 0
            0,  # accuracy, exponent, direction
            0,  # R and B exponents 0
            0,  # no nominal, normal max or min given
            0,
            0,
            0,
            0xFF,  # sensor maximum reading
            0x00,  # minimum
            0,
            0,
            0,
            0,
            0,
            0,  # thresholds: set with sensor_set_threshold
            1,
            1,  # hysteresis
            0,
            0,  # reserved
            0,  # OEM
            0xC0 | len(name),  # 8-bit ASCII id string
        ]
    )
    body += name
    header = bytes([record_id & 0xFF, record_id >> 8, 0x51, 0x01, len(body)])
    return header + body


def emulator_commands() -> str:
    """The command file ipmi_sim starts with: the MC, its SEL, the sensors and their state."""
    lines = [
        f"mc_setbmc {MC}",
        f"mc_add {MC} 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02",
        f"sel_enable {MC} 1000 0x0a",
    ]
    for record_id, sensor in enumerate(SENSORS, start=1):
        lines.append(
            f"sensor_add {MC} 0 {sensor.number:#x} {sensor.sensor_type:#x} {sensor.reading_type:#x}"
        )
        data = " ".join(f"{b:#04x}" for b in full_sensor_record(record_id, sensor))
        lines.append(f"main_sdr_add {MC} {data}")
        bits = EVENT_BITS[sensor.sensor_type, sensor.reading_type]
        lines.append(
            f"sensor_set_event_support {MC} 0 {sensor.number:#x} enable scanning per-state "
            + " ".join([bits] * 4)
        )
    for fan in FANS:  # lower critical 1,000 RPM, lower non-critical 2,000 (raw x 100)
        lines.append(f"sensor_set_threshold {MC} 0 {fan.number:#x} settable 000011 0 0 0 0 10 20")
        lines.append(f"sensor_set_value {MC} 0 {fan.number:#x} 98 0")
    for temp, critical, warm, now in ((INLET, 42, 35, 24), (EXHAUST, 75, 65, 46)):
        thresholds = f"settable 011000 0 {critical} {warm} 0 0 0"
        lines.append(f"sensor_set_threshold {MC} 0 {temp.number:#x} {thresholds}")
        lines.append(f"sensor_set_value {MC} 0 {temp.number:#x} {now} 0")
    lines.extend(f"sensor_set_bit {MC} 0 {psu.number:#x} 0 1 0" for psu in PSUS)  # present
    lines.append(f"sensor_set_bit_clr_rest {MC} 0 {REDUNDANCY.number:#x} 0 1 0")  # fully redundant
    lines.append(f"mc_enable {MC}")
    return "\n".join(lines) + "\n"


def lan_conf(port: int, state: Path) -> str:
    """The simulator's LAN configuration: one loopback channel, one user who may only read."""
    auths = "none md2 md5 straight"
    return (
        f'name "fleetwatch-test"\n'
        f"set_working_mc {MC}\n"
        "  startlan 1\n"
        f"    addr 127.0.0.1 {port}\n"
        "    priv_limit admin\n"
        + "".join(
            f"    allowed_auths_{p} {auths}\n" for p in ("callback", "user", "operator", "admin")
        )
        + "    guid a123456789abcdefa123456789abcdef\n"
        "  endlan\n"
        f'  user 2 true "{USER}" "{PASSWORD}" user 10 {auths}\n'
    )


class IpmiSim:
    """A running ipmi_sim; :meth:`command` types into its console."""

    def __init__(self, root: Path, port: int) -> None:
        self.port = port
        state = root / "state"
        state.mkdir(parents=True, exist_ok=True)
        (root / "lan.conf").write_text(lan_conf(port, state))
        (root / "bmc.emu").write_text(emulator_commands())
        self.password_file = root / "password"
        self.password_file.write_text(PASSWORD + "\n")
        self.password_file.chmod(0o600)
        self._proc = subprocess.Popen(
            [IPMI_SIM, "-c", str(root / "lan.conf"), "-f", str(root / "bmc.emu"), "-s", str(state)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def command(self, line: str) -> None:
        """Run one emulator command (ipmi_sim_cmd(5)) in the running simulator."""
        assert self._proc.stdin is not None
        self._proc.stdin.write(line.encode() + b"\n")
        self._proc.stdin.flush()

    def ipmitool(self, *args: str) -> str:
        """What ``ipmitool`` prints for ``args`` against this BMC."""
        argv = [IPMITOOL, "-I", "lanplus", "-C", "3", "-L", "USER", "-H", "127.0.0.1"]
        argv += ["-p", str(self.port)]
        argv += ["-U", USER, "-f", str(self.password_file), *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout

    def wait_ready(self) -> None:
        """Until the simulator answers (ipmitool mc info), at most 30 s."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                msg = f"ipmi_sim exited with {self._proc.returncode}"
                raise RuntimeError(msg)
            with contextlib.suppress(subprocess.SubprocessError):
                self.ipmitool("-N", "1", "-R", "1", "mc", "info")
                return
        msg = "ipmi_sim did not answer within 30 s"
        raise RuntimeError(msg)

    def stop(self) -> None:
        """End the simulator."""
        if self._proc.stdin is not None:
            with contextlib.suppress(OSError):
                self._proc.stdin.close()
        self._proc.terminate()
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(10)


def free_udp_port() -> int:
    """A UDP port nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
