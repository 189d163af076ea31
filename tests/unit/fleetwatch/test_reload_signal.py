import asyncio
import os
import signal
from pathlib import Path

import pytest

from fleetwatch.reload import Hangups, ReloadTally, changed_keys, one_line
from fleetwatch.sd_notify import SdNotifier
from tests.notify_socket import NotifySocket


@pytest.fixture
def _restore_sighup():
    saved = signal.getsignal(signal.SIGHUP)
    yield
    signal.signal(signal.SIGHUP, saved)


def pending(hangups: Hangups) -> bool:
    return hangups.pending


class TestHangups:
    @pytest.mark.usefixtures("_restore_sighup")
    def test_a_sighup_before_start_is_held_not_fatal(self):
        """SIGHUP while the daemon starts neither kills the process nor is lost: the reload
        runs once the daemon attaches it, and only once."""
        hangups = Hangups()
        hangups.catch_early()
        os.kill(os.getpid(), signal.SIGHUP)
        assert pending(hangups)
        runs: list[str] = []
        hangups.attach(lambda: runs.append("reload"))
        assert runs == ["reload"]
        assert not pending(hangups)
        hangups.arrived()
        assert runs == ["reload", "reload"]

    @pytest.mark.usefixtures("_restore_sighup")
    async def test_sighup_on_the_loop_runs_the_reload(self):
        """Installed on the event loop, a real SIGHUP runs the attached reload there."""
        loop = asyncio.get_running_loop()
        hangups = Hangups()
        hangups.install(loop)
        done = asyncio.Event()
        hangups.attach(done.set)
        try:
            os.kill(os.getpid(), signal.SIGHUP)
            await asyncio.wait_for(done.wait(), timeout=5)
        finally:
            loop.remove_signal_handler(signal.SIGHUP)

    def test_without_a_reload_attached_it_waits(self):
        """A SIGHUP the loop takes before the daemon is up is kept for later."""
        hangups = Hangups()
        hangups.arrived()
        assert hangups.pending


class TestReloadTally:
    def test_success_and_failure(self):
        """A failure keeps the last success time and says so; a success clears it."""
        tally = ReloadTally(last_success_unix=100.0)
        assert (tally.successful, tally.counts) == (True, {"success": 0, "failure": 0})
        tally.failure("x.yaml:3: bad")
        assert (tally.successful, tally.last_success_unix, tally.last_error) == (
            False,
            100.0,
            "x.yaml:3: bad",
        )
        tally.success(200.0)
        assert (tally.successful, tally.last_success_unix, tally.last_error) == (True, 200.0, "")
        assert tally.counts == {"success": 1, "failure": 1}

    def test_helpers(self):
        """changed_keys lists differing attributes; one_line flattens a multi-line error."""

        class Cfg:
            def __init__(self, **kw: object) -> None:
                self.__dict__.update(kw)

        assert changed_keys(Cfg(a=1, b=2), Cfg(a=1, b=3), ["a", "b"]) == ["b"]
        assert one_line("while parsing\n  a block\tmapping") == "while parsing a block mapping"


class TestReloadingNotification:
    def test_reloading_then_ready(self, tmp_path: Path):
        """RELOADING=1 carries MONOTONIC_USEC (systemd tells reloads apart by it) and a status;
        READY=1 ends the reload."""
        with NotifySocket(str(tmp_path / "notify.sock")) as listener:
            notifier = SdNotifier(listener.address)
            assert notifier.reloading(12.5, "reloading configuration")
            assert notifier.ready("serving")
            listener.wait_for("READY=1")
        assert [n.lines for n in listener.received] == [
            ("RELOADING=1", "MONOTONIC_USEC=12500000", "STATUS=reloading configuration"),
            ("READY=1", "STATUS=serving"),
        ]
