"""SlurmNodes against a real slurmctld and slurmd on loopback (tests/slurm_harness.py)."""

from __future__ import annotations

import os
import shutil

import pytest
from structlog.testing import capture_logs

from collector.actions.slurm import (
    MAX_REASON_CHARS,
    DrainOutcome,
    ResumeOutcome,
    SlurmError,
    SlurmNodes,
    SlurmRefusedError,
    parse_node_line,
    sanitize_reason,
)
from collector.exceptions import CollectorError
from tests.slurm_harness import SlurmCluster, SlurmHarnessError, slurm_cluster

pytestmark = pytest.mark.integration

HUMAN_REASON = "ticket 4711: bad DIMM, do not touch"


@pytest.fixture(scope="module")
def cluster():
    try:
        with slurm_cluster() as running:
            yield running
    except SlurmHarnessError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture
def nodes(cluster: SlurmCluster) -> SlurmNodes:
    return SlurmNodes(env=cluster.env)


@pytest.fixture
def spare(cluster: SlurmCluster) -> str:
    return cluster.take_spare()


@pytest.fixture
def real_node(cluster: SlurmCluster):
    """node-01 (the one with a slurmd), IDLE before the test and made IDLE again after it."""
    name = cluster.real_node
    cluster.wait_for(name, lambda s: s.states == {"IDLE"})
    yield name
    cluster.cancel_all()
    if cluster.node(name).reason is not None:
        cluster.run("scontrol", "update", f"NodeName={name}", "State=RESUME")
    cluster.wait_for(name, lambda s: s.states == {"IDLE"})


def human_drain(cluster: SlurmCluster, node: str) -> None:
    cluster.run("scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={HUMAN_REASON}")


class TestState:
    async def test_idle_node_reads_idle_without_reason(self, nodes, spare):
        """A fresh node reads as IDLE, responding, with no reason and no drain."""
        state = await nodes.state(spare)
        assert (spare, frozenset({"IDLE"}), None) == (state.name, state.states, state.reason)
        assert (state.drained, state.draining, state.responding) == (False, False, True)

    async def test_unknown_node_raises_slurm_error_naming_it(self, nodes):
        """Asking about a node Slurm does not know raises SlurmError naming it, with scontrol's
        words."""
        with pytest.raises(SlurmError, match=r"'no-such-node'.*not found") as caught:
            await nodes.state("no-such-node")
        assert caught.value.node == "no-such-node"
        assert isinstance(caught.value, CollectorError)

    async def test_hostlist_expression_is_refused_before_scontrol_runs(self):
        """A name scontrol would expand to several nodes is refused without running scontrol."""
        nodes = SlurmNodes(scontrol="/nonexistent/scontrol")
        for name in ("node-[01-02]", "node-01,node-02", "-o", "node 01", ""):
            with pytest.raises(SlurmError, match="not a single Slurm node name"):
                await nodes.drain(name, "xid 79")

    @pytest.mark.parametrize("name", ["ALL", "all", "DEFAULT"])
    async def test_reserved_name_is_refused_before_scontrol_runs(self, cluster, tmp_path, name):
        """``scontrol update NodeName=ALL`` would drain every node of the cluster: the name is
        refused before any scontrol call (the pre-read included), and every node stays up."""
        calls = tmp_path / "calls"
        wrapper = tmp_path / "scontrol"
        real = shutil.which("scontrol", path=f"{os.environ.get('PATH', '')}:/usr/sbin:/usr/bin")
        wrapper.write_text(f'#!/bin/sh\necho "$*" >> "{calls}"\nexec "{real}" "$@"\n')
        wrapper.chmod(0o755)
        nodes = SlurmNodes(scontrol=str(wrapper), env=cluster.env)
        reasons = {node: state.reason for node, state in cluster.nodes().items()}

        with pytest.raises(SlurmRefusedError, match="not a single Slurm node name"):
            await nodes.drain(name, "xid 79")
        with pytest.raises(SlurmRefusedError, match="not a single Slurm node name"):
            await nodes.resume(name)

        assert not calls.exists()
        assert {node: state.reason for node, state in cluster.nodes().items()} == reasons


class TestDrain:
    async def test_drain_sets_drain_and_our_reason(self, nodes, cluster, spare):
        """A drain shows in scontrol as a DRAIN state with a reason that starts with our
        prefix."""
        with capture_logs() as logs:
            result = await nodes.drain(spare, "xid 79 on GPU 3 (fell off the bus)")
        assert result.outcome == DrainOutcome.DRAINED
        assert result.changed
        assert result.reason == "fleetwatch: xid 79 on GPU 3 (fell off the bus)"
        seen = cluster.node(spare)
        assert "DRAIN" in seen.states
        assert seen.drained
        assert result.reason == seen.reason
        assert seen == result.state
        assert [e["event"] for e in logs] == ["slurm_node_drained"]

    async def test_draining_twice_is_a_noop(self, nodes, cluster, spare):
        """A second drain of a node we drained runs nothing and keeps the first reason."""
        first = await nodes.drain(spare, "xid 79")
        second = await nodes.drain(spare, "nvlink down")
        assert second.outcome == DrainOutcome.ALREADY_DRAINED
        assert not second.changed
        assert first.reason == cluster.node(spare).reason == second.state.reason

    async def test_human_drain_is_not_overwritten(self, nodes, cluster, spare):
        """A node drained by a person keeps that person's reason and is reported held."""
        human_drain(cluster, spare)
        result = await nodes.drain(spare, "xid 79")
        assert result.outcome == DrainOutcome.HELD_BY_OTHER
        assert HUMAN_REASON == cluster.node(spare).reason == result.state.reason

    async def test_reason_is_sanitised(self, nodes, cluster, spare):
        """Newlines and control characters never reach Slurm, and length is bounded."""
        raw = "xid 79\non GPU\t3\x00\r\n" + "evidence " * 40
        result = await nodes.drain(spare, raw)
        reason = cluster.node(spare).reason
        assert result.reason == reason
        assert reason is not None
        assert reason.startswith("fleetwatch: xid 79 on GPU 3 evidence")
        assert reason.endswith("...")
        assert len(reason) <= MAX_REASON_CHARS
        assert all(ch.isprintable() for ch in reason)

    @pytest.mark.parametrize(
        "raw",
        ['"xid 79"', "\x1b[31m", "; rm -rf /", "$(reboot)", "`id`", "a | b", "a > b", "a=b"],
    )
    async def test_reason_with_shell_or_slurm_syntax_is_refused(self, raw):
        """Quotes, escapes and shell or Slurm syntax are refused before scontrol runs (it
        does not exist here: running it would fail differently)."""
        nodes = SlurmNodes(scontrol="/nonexistent/scontrol")
        with pytest.raises(SlurmRefusedError, match="refusing reason"):
            await nodes.drain("node-02", f"xid 79 {raw}")

    async def test_busy_node_reads_draining_then_drained(self, nodes, cluster, real_node):
        """A drained node that runs a job is DRAINING, and DRAINED once the job ends."""
        cluster.allocate(real_node)
        cluster.wait_for(real_node, lambda s: "ALLOCATED" in s.states)
        result = await nodes.drain(real_node, "xid 79")
        assert (result.state.draining, result.state.drained) == (True, False)
        assert (await nodes.drain(real_node, "xid 79")).outcome == DrainOutcome.ALREADY_DRAINED
        cluster.cancel_all()
        assert cluster.wait_for(real_node, lambda s: "ALLOCATED" not in s.states).drained


class TestResume:
    async def test_resume_of_our_drain_returns_node_to_idle(self, nodes, cluster, real_node):
        """Resuming a node we drained clears the drain and the reason; the node is IDLE again."""
        await nodes.drain(real_node, "xid 79")
        with capture_logs() as logs:
            result = await nodes.resume(real_node)
        assert result.outcome == ResumeOutcome.RESUMED
        assert result.changed
        idle = cluster.wait_for(real_node, lambda s: s.states == {"IDLE"})
        assert idle.reason is None
        assert [e["event"] for e in logs] == ["slurm_node_resumed"]

    async def test_human_drain_is_not_resumed(self, nodes, cluster, spare):
        """A node drained by a person is not resumed, and keeps its drain and reason."""
        human_drain(cluster, spare)
        result = await nodes.resume(spare)
        assert result.outcome == ResumeOutcome.NOT_OURS
        assert not result.changed
        seen = cluster.node(spare)
        assert (seen.drained, seen.reason) == (True, HUMAN_REASON)

    async def test_resume_of_undrained_node_is_refused(self, nodes, spare):
        """Resuming a node that is not drained runs nothing and says so."""
        result = await nodes.resume(spare)
        assert result.outcome == ResumeOutcome.NOT_DRAINED
        assert frozenset({"IDLE"}) == result.state.states

    async def test_other_prefix_does_not_own_our_drain(self, cluster, spare):
        """A SlurmNodes with another prefix treats our drain as someone else's."""
        await SlurmNodes(env=cluster.env).drain(spare, "xid 79")
        other = SlurmNodes(env=cluster.env, reason_prefix="NHC:")
        assert (await other.resume(spare)).outcome == ResumeOutcome.NOT_OURS
        assert (await other.drain(spare, "x")).outcome == DrainOutcome.HELD_BY_OTHER


class TestScontrolFailures:
    async def test_missing_scontrol_raises_clear_slurm_error(self):
        """A missing scontrol binary raises SlurmError naming the node and the command."""
        nodes = SlurmNodes(scontrol="/nonexistent/bin/scontrol")
        with pytest.raises(SlurmError, match=r"'node-01'.*'/nonexistent/bin/scontrol'.*slurm"):
            await nodes.state("node-01")

    async def test_slow_scontrol_times_out(self, tmp_path):
        """An scontrol that does not answer in time is killed and raises SlurmError."""
        slow = tmp_path / "scontrol"
        slow.write_text("#!/bin/sh\nexec sleep 30\n")
        slow.chmod(0o755)
        nodes = SlurmNodes(scontrol=str(slow), timeout_s=0.2)
        with pytest.raises(SlurmError, match=r"'node-01' timed out after 0.2 s"):
            await nodes.state("node-01")

    async def test_failed_update_raises_with_scontrol_stderr(self, tmp_path):
        """A non-zero exit raises SlurmError carrying what scontrol printed on stderr."""
        fake = tmp_path / "scontrol"
        fake.write_text(
            "#!/bin/sh\n"
            'if [ "$1" = show ]; then echo "NodeName=n1 Arch=x State=IDLE Weight=1"; exit 0; fi\n'
            'echo "slurm_update error: Access/permission denied" >&2; exit 1\n'
        )
        fake.chmod(0o755)
        with pytest.raises(SlurmError, match=r"exit 1.*permission denied") as caught:
            await SlurmNodes(scontrol=str(fake)).drain("n1", "xid 79")
        assert caught.value.stderr == "slurm_update error: Access/permission denied"

    def test_bad_options_fail_at_construction(self):
        """Empty commands, non-positive timeouts and unprintable prefixes are refused early."""
        for kwargs in (
            {"scontrol": ""},
            {"timeout_s": 0},
            {"timeout_s": float("nan")},
            {"reason_prefix": ""},
            {"reason_prefix": "fw\n"},
            {"reason_prefix": " fw:"},
            {"reason_prefix": "fw;"},
            {"reason_prefix": "$fw:"},
        ):
            with pytest.raises(ValueError, match=next(iter(kwargs))):
                SlurmNodes(**kwargs)


class TestParseNodeLine:
    def test_not_responding_star_and_drain_flag(self):
        """A ``*`` suffix reads as NOT_RESPONDING next to the base state and its flags."""
        state = parse_node_line("NodeName=n1 Arch=x86_64 State=DOWN*+DRAIN ThreadsPerCore=1")
        assert frozenset({"DOWN", "DRAIN", "NOT_RESPONDING"}) == state.states
        assert (state.drained, state.draining, state.responding) == (True, False, False)

    def test_reason_keeps_brackets_and_loses_the_stamp(self):
        """The reason ends before Slurm's ``[user@time]`` stamp, not at its own brackets."""
        line = (
            "NodeName=n1 State=MIXED+DRAIN Weight=1 Reason=fleetwatch: xid [79] a=b "
            "[root@2026-01-01T00:00:00] Comment=c Reason=no"
        )
        state = parse_node_line(line)
        assert state.reason == "fleetwatch: xid [79] a=b"
        assert (state.drained, state.draining) == (False, True)

    def test_comment_mentioning_reason_is_not_a_reason(self):
        """A Comment that contains ``Reason=`` does not make an undrained node look drained."""
        state = parse_node_line("NodeName=n1 State=IDLE Weight=1 Comment=see Reason=x [a@b]")
        assert state.reason is None

    def test_reason_without_stamp_ends_at_next_free_field(self):
        """A reason with no stamp (set in slurm.conf) ends where Comment starts."""
        state = parse_node_line("NodeName=n1 State=IDLE+DRAIN Reason=maint window Comment=x")
        assert state.reason == "maint window"

    def test_sinfo_style_words(self):
        """DRAINED and DRAINING words are understood as well as the DRAIN flag."""
        assert parse_node_line("NodeName=n1 State=DRAINED").drained
        assert parse_node_line("NodeName=n1 State=DRAINING").draining

    def test_line_without_state_is_refused(self):
        """A line with no State field raises ValueError."""
        with pytest.raises(ValueError, match="not a node line"):
            parse_node_line("Node n1 not found")


class TestSanitizeReason:
    def test_prefix_is_added_once(self):
        """A reason that already carries the prefix does not get it twice."""
        assert sanitize_reason("fw:  a\n b", "fw:") == "fw: a b"
        assert sanitize_reason("a", "fw:") == "fw: a"
        assert sanitize_reason("\n\t", "fw:") == "fw:"

    def test_length_is_bounded(self):
        """A long reason is cut to the limit and ends with an ellipsis."""
        reason = sanitize_reason("x" * 500, "fw:", limit=20)
        assert reason == "fw: xxxxxxxxxxxxx..."
