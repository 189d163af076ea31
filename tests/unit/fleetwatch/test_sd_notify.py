import asyncio
import itertools
import os
import uuid
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from agent.config import AgentConfig
from agent.main import build_agent
from agent.sim.cluster import sim_hardware
from agent.sim.hardware import SimNode
from agent.sim.nvml_lib import SimNvmlLibrary
from fleetwatch.clock import SystemClock
from fleetwatch.sd_notify import SdNotifier
from fleetwatch.testing import FakeClock, free_port, wait_until
from tests.notify_socket import NotifySocket


@pytest.fixture
def listener(tmp_path: Path):
    with NotifySocket(str(tmp_path / "notify.sock")) as sock:
        yield sock


class TestSdNotifier:
    def test_messages_reach_a_path_socket(self, listener: NotifySocket):
        """READY, STATUS, WATCHDOG and STOPPING arrive as KEY=VALUE lines, one datagram each."""
        notifier = SdNotifier(listener.address)
        assert notifier.ready("serving 3 nodes")
        assert notifier.watchdog()
        assert notifier.stopping()
        got = listener.wait_for("STOPPING=1")
        assert [n.lines for n in listener.received] == [
            ("READY=1", "STATUS=serving 3 nodes"),
            ("WATCHDOG=1",),
            ("STOPPING=1", "STATUS=stopping"),
        ]
        assert got[0].pid == os.getpid()

    def test_abstract_socket(self):
        """An '@' NOTIFY_SOCKET names a socket in the abstract namespace."""
        address = f"@fleetwatch-test-{uuid.uuid4().hex}"
        with NotifySocket(address) as listener:
            assert SdNotifier(address).status("waiting\nfor NVML")
            [message] = listener.wait_for("STATUS=waiting for NVML")
        assert message.get("STATUS") == "waiting for NVML"  # a newline would end the line

    def test_extend_timeout(self, listener: NotifySocket):
        """EXTEND_TIMEOUT_USEC asks for more time, in microseconds."""
        SdNotifier(listener.address).extend_timeout(61.5, "discovery failed")
        [message] = listener.wait_for("STATUS=discovery failed")
        assert message.get("EXTEND_TIMEOUT_USEC") == "61500000"

    def test_no_socket_is_a_quiet_no_op(self):
        """Without NOTIFY_SOCKET nothing is sent and there is no watchdog."""
        notifier = SdNotifier()
        assert not notifier.enabled
        assert not notifier.ready("x")
        assert notifier.watchdog_interval_s is None

    @pytest.mark.parametrize(
        ("kwargs", "message"),
        [
            ({"socket_path": "relative/path"}, "NOTIFY_SOCKET must be a path or an @abstract"),
            ({"socket_path": "@"}, "NOTIFY_SOCKET must be"),
            ({"socket_path": "/run/x", "watchdog_usec": 0}, "WATCHDOG_USEC must be a positive"),
        ],
    )
    def test_bad_settings_are_refused(self, kwargs, message):
        """A socket that is neither a path nor an @name, or a watchdog of 0, is refused."""
        with pytest.raises(ValueError, match=message):
            SdNotifier(**kwargs)

    def test_a_gone_socket_logs_once(self, tmp_path: Path):
        """Sends to a socket nobody listens on fail quietly: one warning, not one per ping."""
        notifier = SdNotifier(str(tmp_path / "nobody.sock"))
        with capture_logs() as logs:
            assert not notifier.watchdog()
            assert not notifier.watchdog()
        assert [e["event"] for e in logs] == ["sd_notify_failed"]


class TestFromEnviron:
    def test_takes_the_variables_out(self, listener: NotifySocket):
        """systemd's variables are removed, so children (nvidia-smi, scontrol) do not inherit
        them; the watchdog pings at half of WATCHDOG_USEC."""
        environ = {
            "NOTIFY_SOCKET": listener.address,
            "WATCHDOG_USEC": "30000000",
            "WATCHDOG_PID": "4242",
            "PATH": "/usr/bin",
        }
        notifier = SdNotifier.from_environ(environ, pid=4242)
        assert environ == {"PATH": "/usr/bin"}
        assert notifier.enabled
        assert notifier.watchdog_interval_s == 15.0

    def test_watchdog_of_another_pid_is_not_ours(self, listener: NotifySocket):
        """WATCHDOG_PID naming another process: notify, but do not ping."""
        environ = {"NOTIFY_SOCKET": listener.address, "WATCHDOG_USEC": "1000", "WATCHDOG_PID": "1"}
        notifier = SdNotifier.from_environ(environ, pid=4242)
        assert notifier.enabled
        assert notifier.watchdog_interval_s is None

    def test_unusable_watchdog_still_notifies(self, listener: NotifySocket):
        """A WATCHDOG_USEC that is not a positive integer turns the watchdog off, not READY."""
        with capture_logs() as logs:
            notifier = SdNotifier.from_environ(
                {"NOTIFY_SOCKET": listener.address, "WATCHDOG_USEC": "soon"}, pid=1
            )
        assert notifier.enabled
        assert notifier.watchdog_interval_s is None
        assert [e["event"] for e in logs] == ["sd_notify_watchdog_disabled"]

    def test_unusable_values_leave_notifications_off(self):
        """A value we cannot use is logged and turns notifications off; the daemon still runs."""
        with capture_logs() as logs:
            notifier = SdNotifier.from_environ({"NOTIFY_SOCKET": "vsock:2:1234"}, pid=1)
        assert not notifier.enabled
        assert [e["event"] for e in logs] == ["sd_notify_disabled"]


class TestKeepAlive:
    async def test_pings_every_half_period_until_cancelled(self, listener: NotifySocket):
        """keep_alive pings at once and then every WATCHDOG_USEC / 2 on the loop it runs on."""
        notifier = SdNotifier(listener.address, watchdog_usec=100_000)
        task = asyncio.create_task(notifier.keep_alive(SystemClock()))
        pings = await listener.wait_for_async("WATCHDOG=1", count=4)
        task.cancel()
        gaps = [b.at - a.at for a, b in itertools.pairwise(pings)]
        assert all(0.03 < gap < 0.5 for gap in gaps), gaps

    async def test_without_a_watchdog_it_returns(self, listener: NotifySocket):
        """No WATCHDOG_USEC: keep_alive ends at once and sends nothing."""
        await asyncio.wait_for(SdNotifier(listener.address).keep_alive(FakeClock()), 1)
        assert listener.drain() == []


class TestAgentNotifies:
    async def test_extends_start_while_nvml_is_missing_then_ready(
        self, listener: NotifySocket, tmp_path: Path
    ):
        """While NVML cannot start the agent asks systemd for more time and says why; READY=1
        comes after its first poll, STOPPING=1 when it is stopped."""
        clock = SystemClock()
        node = SimNode("node-a", tmp_path / "sys", clock, gpus=2, nvlinks=2, ib_ports=1)
        hardware = sim_hardware(node)
        assert isinstance(hardware.nvml, SimNvmlLibrary)
        hardware.nvml.driver_loaded = False
        cfg = AgentConfig(
            node="node-a",
            collector=f"127.0.0.1:{free_port()}",
            job_socket=None,
            state_dir=None,
            backoff_initial=0.05,
            backoff_max=0.05,
        )
        agent = build_agent(cfg, hardware, clock, notifier=SdNotifier(listener.address, 200_000))
        run = asyncio.create_task(agent.run())
        await listener.wait_for_async("WATCHDOG=1")  # the loop pings while it still starts
        await wait_until(lambda: bool(listener.with_key("EXTEND_TIMEOUT_USEC")))
        extend = listener.with_key("EXTEND_TIMEOUT_USEC")[0]
        assert 60_000_000 <= int(extend.get("EXTEND_TIMEOUT_USEC") or 0) <= 60_050_000
        assert (extend.get("STATUS") or "").startswith("discovery failed, retrying in 0 s: ")
        assert listener.with_line("READY=1") == []
        hardware.nvml.driver_loaded = True
        [ready] = await listener.wait_for_async("READY=1")
        assert agent.polls >= 1
        assert ready.get("STATUS") == "polling 2 GPUs and 1 IB ports every 5 s"
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)
        await listener.wait_for_async("STOPPING=1")
