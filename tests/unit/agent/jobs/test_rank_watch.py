"""The agent's watch on rank processes: real processes, read in the real /proc."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.jobs.peer_identity import PeerResolver
from agent.jobs.rank_watch import EXITED_REPORTS, RankWatch, parse_stat, status_uids


def states(watch: RankWatch) -> dict[tuple[str, int], str]:
    return {(p.job_id, p.rank): p.state for p in watch.snapshot()}


def wait_for_state(watch: RankWatch, key: tuple[str, int], state: str) -> None:
    deadline = time.monotonic() + 10
    while (seen := states(watch).get(key)) != state:
        assert time.monotonic() < deadline, f"{key} is {seen}, not {state}"
        time.sleep(0.01)


@pytest.fixture
def child():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def test_stat_is_parsed_from_the_last_parenthesis():
    """A command name with spaces and parentheses does not shift the fields."""
    line = "4242 (py (torch) 1) S 1 2 3 4 5 6 7 8 9 10 250 50 13 14 15 16 17 18 987654 19"
    stat = parse_stat(line)
    assert (stat.state, stat.cpu_ticks, stat.start_ticks) == ("sleeping", 300, 987654)
    with pytest.raises(ValueError, match="fields"):
        parse_stat("4242 (x) S 1 2")
    with pytest.raises(ValueError, match="command"):
        parse_stat("garbage")


def test_a_rank_process_is_seen_sleeping_stopped_then_exited_then_forgotten(child):
    """SIGSTOP shows as stopped, SIGCONT as sleeping again; once killed it is exited for
    EXITED_REPORTS polls, then no more."""
    watch = RankWatch(Path("/proc"))
    start = PeerResolver(Path("/proc")).started(child.pid)
    watch.saw("train", 3, child.pid, start)
    wait_for_state(watch, ("train", 3), "sleeping")
    os.kill(child.pid, signal.SIGSTOP)
    wait_for_state(watch, ("train", 3), "stopped")
    os.kill(child.pid, signal.SIGCONT)
    wait_for_state(watch, ("train", 3), "sleeping")
    child.kill()
    child.wait()
    seen = [states(watch).get(("train", 3)) for _ in range(EXITED_REPORTS + 2)]
    assert seen == ["exited"] * EXITED_REPORTS + [None, None]
    assert len(watch) == 0


def test_a_pid_that_names_a_later_process_is_exited(child, tmp_path):
    """The pid's stat gives another start: the process that reported is gone."""
    start = PeerResolver(Path("/proc")).started(child.pid)
    (tmp_path / str(child.pid)).mkdir()
    real = Path(f"/proc/{child.pid}/stat").read_text()
    (tmp_path / str(child.pid) / "stat").write_text(real.replace(f" {start} ", f" {start + 1} "))
    watch = RankWatch(tmp_path)
    watch.saw("train", 0, child.pid, start)
    assert states(watch) == {("train", 0): "exited"}


def test_cpu_time_is_in_seconds(child):
    watch = RankWatch(Path("/proc"))
    watch.saw("j", 0, os.getpid(), PeerResolver(Path("/proc")).started(os.getpid()))
    (mine,) = watch.snapshot()
    assert 0 < mine.cpu_s < time.process_time() + 60


def test_a_sleeping_process_says_where_it_waits(child):
    """The wait channel as the kernel gives it (a kernel that hides it gives nothing to test)."""
    watch = RankWatch(Path("/proc"))
    watch.saw("train", 0, child.pid, PeerResolver(Path("/proc")).started(child.pid))
    wait_for_state(watch, ("train", 0), "sleeping")
    shown = Path(f"/proc/{child.pid}/wchan").read_text().strip()
    if shown in {"", "0"}:
        pytest.skip("this kernel does not show wait channels")
    (process,) = watch.snapshot()
    assert process.wchan == shown == "hrtimer_nanosleep"


def test_a_jobs_live_ranks_with_their_state_letter(child):
    """ranks_of gives the job's processes still there, by rank, with the kernel's state letter
    and the uid they reported as; another job's, and a pid now naming a later process, not."""
    watch = RankWatch(Path("/proc"))
    start = PeerResolver(Path("/proc")).started(child.pid)
    watch.saw("train", 1, child.pid, start, 1000)
    watch.saw("train", 0, child.pid, start, 1000)
    watch.saw("train", 2, child.pid, start + 1, 1000)  # a process before this one had the pid
    watch.saw("other", 0, os.getpid(), PeerResolver(Path("/proc")).started(os.getpid()))
    wait_for_state(watch, ("train", 0), "sleeping")
    now = watch.ranks_of("train")
    assert [(r.rank, r.pid, r.uid, r.state) for r in now] == [
        (0, child.pid, 1000, "S"),
        (1, child.pid, 1000, "S"),
    ]
    assert watch.ranks_of("nobody") == []


def test_the_same_process_has_the_same_start_and_every_uid(child):
    """A pid still names the process that reported when its start and all four uids match."""
    watch = RankWatch(Path("/proc"))
    start = PeerResolver(Path("/proc")).started(child.pid)
    assert watch.same_process(child.pid, start, os.getuid())
    assert not watch.same_process(child.pid, start + 1, os.getuid())
    assert not watch.same_process(child.pid, start, os.getuid() + 1)
    assert not watch.same_process(child.pid, start, None)
    assert not watch.same_process(2**22 + 1, start, os.getuid())  # above pid_max: no process


def test_status_uids():
    """The four uids of a status file; none when the line is missing or garbled."""
    assert status_uids("Name:\tpython\nUid:\t1000\t0\t1000\t1000\nGid:\t1\n") == (
        1000,
        0,
        1000,
        1000,
    )
    assert status_uids("Name:\tpython\n") == ()
    assert status_uids("Uid:\tx\n") == ()
    assert parse_stat("1 (x) t " + "0 " * 19).letter == "t"
