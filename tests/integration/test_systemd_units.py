"""The systemd units in deploy/systemd, checked by systemd's own analyzer (no running systemd)."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agent.config import AgentConfig
from cli.config import DEFAULT_FILES
from collector.api.connections import ConnectionLimits
from collector.config import CollectorConfig

pytestmark = pytest.mark.integration

UNITS = Path(__file__).resolve().parents[2] / "deploy" / "systemd"
INSTALLED = "/opt/fleetwatch/.venv/bin/fleetwatch"
# What `systemd-analyze security` scores the units now; a change that raises it fails here.
# CAP_SYS_PTRACE (reading a hung job's rank stacks) costs the agent 0.2-0.3 of these.
MAX_EXPOSURE = {"collector": 1.5, "agent": 2.5, "agent+gpu-reset": 3.3}


def analyze() -> str:
    binary = shutil.which("systemd-analyze")
    assert binary, "systemd-analyze is missing: scripts/ensure-test-deps.sh installs systemd"
    return binary


def installed_copy(tmp_path: Path, *, drop_ins: bool = False) -> Path:
    """The units as installed, but with ExecStart pointing at this venv's fleetwatch (verify
    insists that the program exists)."""
    ours = Path(sys.executable).with_name("fleetwatch")
    assert ours.exists()
    for unit in UNITS.glob("*.service"):
        text = unit.read_text()
        assert INSTALLED in text
        (tmp_path / unit.name).write_text(text.replace(INSTALLED, str(ours)))
    if drop_ins:
        shutil.copytree(
            UNITS / "fleetwatch-agent.service.d", tmp_path / "fleetwatch-agent.service.d"
        )
    return tmp_path


def settings(kind: str) -> dict[str, list[str]]:
    """Every Key=value of a unit, a list per key (keys may repeat)."""
    found: dict[str, list[str]] = {}
    for line in (UNITS / f"fleetwatch-{kind}.service").read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            found.setdefault(key, []).append(value)
    return found


def verify(unit: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [analyze(), "verify", "--man=no", str(unit)], capture_output=True, text=True, check=False
    )


def exposure(unit: Path) -> tuple[float, str]:
    done = subprocess.run(
        [analyze(), "security", "--offline=true", "--no-pager", str(unit)],
        capture_output=True,
        text=True,
        check=True,
    )
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", done.stdout)
    assert match, done.stdout
    return float(match[1]), done.stdout


class TestVerify:
    @pytest.mark.parametrize("kind", ["agent", "collector"])
    def test_unit_is_clean(self, tmp_path: Path, kind: str):
        """`systemd-analyze verify` finds nothing to say about the unit."""
        unit = installed_copy(tmp_path) / f"fleetwatch-{kind}.service"
        done = verify(unit)
        assert (done.returncode, done.stderr) == (0, "")

    def test_agent_with_the_gpu_reset_drop_in_is_clean(self, tmp_path: Path):
        """The opt-in drop-in loads with the agent's unit (it runs as root then) and is clean."""
        unit = installed_copy(tmp_path, drop_ins=True) / "fleetwatch-agent.service"
        done = verify(unit)
        assert (done.returncode, done.stderr) == (0, "")
        assert "Service runs as root user" in exposure(unit)[1]

    def test_verify_does_catch_mistakes_here(self, tmp_path: Path):
        """The check above means something in this container: a misspelt key is reported."""
        unit = installed_copy(tmp_path) / "fleetwatch-collector.service"
        unit.write_text(unit.read_text().replace("WatchdogSec=", "WatchdogSecs="))
        done = verify(unit)
        assert "Unknown key 'WatchdogSecs'" in done.stderr


class TestSecurity:
    @pytest.mark.parametrize(
        ("kind", "drop_ins"),
        [("collector", False), ("agent", False), ("agent+gpu-reset", True)],
    )
    def test_exposure_stays_low(self, tmp_path: Path, kind: str, drop_ins: bool):
        """`systemd-analyze security` rates each unit at most what it rates it today."""
        name = kind.partition("+")[0]
        unit = installed_copy(tmp_path, drop_ins=drop_ins) / f"fleetwatch-{name}.service"
        level, report = exposure(unit)
        assert level <= MAX_EXPOSURE[kind], report


class TestUnitsMatchTheCode:
    @pytest.mark.parametrize("kind", ["agent", "collector"])
    def test_notify_watchdog_restart(self, kind: str):
        """Both daemons speak sd_notify: Type=notify with a watchdog, restarted when they fail
        but not for a configuration error (exit status 2)."""
        unit = settings(kind)
        assert unit["Type"] == ["notify"]
        assert unit["NotifyAccess"] == ["main"]
        assert int(unit["WatchdogSec"][0]) >= 10
        assert unit["Restart"] == ["always"]
        assert unit["RestartPreventExitStatus"] == ["2"]
        assert unit["User"] == ["fleetwatch"]

    @pytest.mark.parametrize("kind", ["agent", "collector"])
    def test_config_file_is_the_checked_default(self, kind: str):
        """ExecStart reads the file `fleetwatch config check` checks by default."""
        [exec_start] = settings(kind)["ExecStart"]
        assert exec_start == f"{INSTALLED} {kind} --config {DEFAULT_FILES[kind]}"

    def test_writable_directories_are_the_default_paths(self):
        """ProtectSystem=strict leaves only the units' own directories writable: the agent's
        state and job socket and the collector's journal must live there by default."""
        agent, collector = settings("agent"), settings("collector")
        assert agent["ProtectSystem"] == collector["ProtectSystem"] == ["strict"]
        defaults = AgentConfig(node="n")
        assert defaults.state_dir == Path("/var/lib") / agent["StateDirectory"][0]
        assert defaults.job_socket is not None
        assert defaults.job_socket.parent == Path("/run") / agent["RuntimeDirectory"][0]
        journal_dir = CollectorConfig().journal.parent
        assert journal_dir == Path("/var/lib") / collector["StateDirectory"][0]

    def test_agent_keeps_only_what_it_needs(self):
        """The agent gets CAP_SYSLOG for /dev/kmsg and CAP_SYS_PTRACE for its ranks' stacks, the
        kernel log and NVIDIA devices only, and netlink for udev; the collector gets no
        capability and no devices."""
        agent, collector = settings("agent"), settings("collector")
        both = ["CAP_SYSLOG CAP_SYS_PTRACE"]
        assert agent["CapabilityBoundingSet"] == agent["AmbientCapabilities"] == both
        assert agent["DevicePolicy"] == ["closed"]
        assert agent["DeviceAllow"] == ["/dev/kmsg r", "char-nvidia* rw"]
        assert "AF_NETLINK" in agent["RestrictAddressFamilies"][0].split()
        assert collector["CapabilityBoundingSet"] == [""]
        assert collector["PrivateDevices"] == ["yes"]
        assert "AF_NETLINK" not in collector["RestrictAddressFamilies"][0].split()

    def test_the_collector_may_open_a_file_per_node_and_connection(self):
        """LimitNOFILE covers two gRPC streams per node (a reconnecting fleet's old ones still
        closing) at the 4,096 nodes one collector was measured to carry, the HTTP API's
        connection cap and headroom; systemd's default soft limit (1024) does not."""
        [limit] = settings("collector")["LimitNOFILE"]
        assert int(limit) >= 2 * 4096 + ConnectionLimits().max_connections + 256


class TestSysusers:
    def test_creates_the_user_the_units_run_as(self, tmp_path: Path):
        """systemd-sysusers, given deploy's file, creates the system user and group the units
        name, with the state directory as home and no login shell."""
        binary = shutil.which("systemd-sysusers")
        assert binary, "systemd-sysusers is missing: scripts/ensure-test-deps.sh installs systemd"
        (tmp_path / "etc").mkdir()
        subprocess.run(
            [binary, f"--root={tmp_path}", str(UNITS / "fleetwatch.sysusers")],
            capture_output=True,
            check=True,
        )
        [user] = (tmp_path / "etc" / "passwd").read_text().splitlines()
        name, _, uid, gid, _, home, shell = user.split(":")
        assert [name] == settings("agent")["User"] == settings("collector")["Group"]
        assert int(uid) < 1000  # a system user
        assert (home, shell) == ("/var/lib/fleetwatch", "/usr/sbin/nologin")
        assert (tmp_path / "etc" / "group").read_text().startswith(f"fleetwatch:x:{gid}:")
