"""Rebooting a Slurm node: the command line built, the checks every argument passes before
scontrol runs, what a node's state says to do, and scontrol's errors as the adapter words them
(a recording scontrol that replays what the real one printed, tests/fixtures/slurm)."""

from __future__ import annotations

from pathlib import Path

import pytest

from collector.actions.adapters import SlurmRebooter
from collector.actions.slurm import SlurmError, SlurmRefusedError, parse_node_line
from collector.actions.slurm_reboot import (
    REBOOT_FLAGS,
    RebootOutcome,
    SlurmReboots,
    reboot_args,
)

CAPTURES = Path(__file__).parents[3] / "fixtures" / "slurm"
REASON = "fleetwatch: gpu_lost: GPU 3 (incident gpu_lost:node-02/gpu/3:5400123)"


def capture(name: str) -> str:
    return (CAPTURES / name).read_text()


def replaying_scontrol(
    tmp_path: Path, shows: list[str], *, fail_reboot: str = ""
) -> tuple[Path, Path]:
    """An scontrol that records each call, answers ``show`` with the captures ``shows`` in turn
    (the last one again once they run out), and fails ``reboot`` with the capture
    ``fail_reboot`` on stderr (exit 1) when one is named."""
    calls = tmp_path / "scontrol.calls"
    count = tmp_path / "shows"
    lines = [
        "#!/bin/sh",
        f"for arg in \"$@\"; do printf '%s\\0' \"$arg\"; done >> '{calls}'",
        f"echo >> '{calls}'",
    ]
    if fail_reboot:
        lines.append(f"if [ \"$1\" = reboot ]; then cat '{CAPTURES / fail_reboot}' >&2; exit 1; fi")
    lines += [
        'if [ "$1" = show ]; then',
        f"  n=$(cat '{count}' 2>/dev/null || echo 0); echo $((n + 1)) > '{count}'",
    ]
    for i, name in enumerate(shows):
        keyword = "if" if i == 0 else "elif"
        lines.append(f"  {keyword} [ \"$n\" -le {i} ]; then cat '{CAPTURES / name}'")
    lines += [f"  else cat '{CAPTURES / shows[-1]}'; fi", "fi"]
    script = tmp_path / "scontrol"
    script.write_text("\n".join(lines) + "\n")
    script.chmod(0o755)
    return script, calls


def calls_of(calls: Path) -> list[list[str]]:
    if not calls.exists():
        return []
    return [line.split("\0")[:-1] for line in calls.read_text().splitlines()]


class TestCommandLine:
    def test_reboot_asap_nextstate_down_reason_node(self):
        """The reboot is ASAP (drain first), comes back DOWN, and the reason is one argument
        whose spaces need no quotes: scontrol runs without a shell."""
        assert reboot_args("node-02", REASON) == (
            "reboot",
            "ASAP",
            "nextstate=DOWN",
            f"reason={REASON}",
            "node-02",
        )

    async def test_the_real_arguments_reach_scontrol(self, tmp_path):
        """An idle node: show, then the reboot as built above, then show again."""
        scontrol, calls = replaying_scontrol(
            tmp_path, ["show-node-idle.txt", "show-node-reboot-requested.txt"]
        )
        result = await SlurmReboots(scontrol=str(scontrol)).reboot("node-02", REASON)
        assert calls_of(calls) == [
            ["show", "node", "-o", "node-02"],
            list(reboot_args("node-02", REASON)),
            ["show", "node", "-o", "node-02"],
        ]
        assert result.outcome is RebootOutcome.REQUESTED
        assert result.state.states == {"IDLE", "DRAIN", "REBOOT_REQUESTED"}
        assert result.reason == REASON

    async def test_quotes_and_line_breaks_are_made_safe_or_refused(self, tmp_path):
        """A double quote (scontrol strips one at either end) and line breaks never reach
        scontrol as they are: line breaks become spaces, a quote makes the reason refused."""
        scontrol, calls = replaying_scontrol(tmp_path, ["show-node-idle.txt"])
        reboots = SlurmReboots(scontrol=str(scontrol))
        await reboots.reboot("node-02", "fleetwatch: r: GPU 1\n(incident r:n/gpu/1:2)")
        (sent,) = [c for c in calls_of(calls) if c[0] == "reboot"]
        assert sent[3] == "reason=fleetwatch: r: GPU 1 (incident r:n/gpu/1:2)"
        with pytest.raises(SlurmRefusedError, match="reason"):
            await reboots.reboot("node-02", 'fleetwatch: r "quoted"')

    @pytest.mark.parametrize(
        "reason", ["; rm -rf /", "$(reboot)", "a`id`", "x | y", "x > y", "a=b ALL", "é"]
    )
    async def test_hostile_reason_is_refused_before_scontrol_runs(self, tmp_path, reason):
        """Shell or Slurm syntax in a reason refuses the reboot: nothing runs."""
        scontrol, calls = replaying_scontrol(tmp_path, ["show-node-idle.txt"])
        with pytest.raises(SlurmRefusedError, match="reason"):
            await SlurmReboots(scontrol=str(scontrol)).reboot("node-02", reason)
        assert calls_of(calls) == []

    @pytest.mark.parametrize(
        "node", ["ALL", "all", "Default", "node-[01-04]", "a,b", "-x", "", "n 1", "n;1"]
    )
    async def test_node_that_is_not_one_node_is_refused(self, tmp_path, node):
        """``scontrol reboot ALL`` reboots the cluster: anything but one node name runs
        nothing."""
        scontrol, calls = replaying_scontrol(tmp_path, ["show-node-idle.txt"])
        with pytest.raises(SlurmRefusedError, match="node name"):
            await SlurmReboots(scontrol=str(scontrol)).reboot(node, REASON)
        assert calls_of(calls) == []

    def test_bad_options_fail_at_construction(self):
        """An empty command or a timeout of nothing is a configuration error at start."""
        with pytest.raises(ValueError, match="scontrol"):
            SlurmReboots(scontrol="")
        with pytest.raises(ValueError, match="timeout_s"):
            SlurmReboots(timeout_s=0)


class TestWhatTheNodeSays:
    def test_the_reboot_flags_as_slurm_prints_them(self):
        """Requested, then issued (with Slurm's words appended to our reason)."""
        requested = parse_node_line(capture("show-node-reboot-requested.txt"))
        issued = parse_node_line(capture("show-node-reboot-issued.txt"))
        assert requested.states & REBOOT_FLAGS == {"REBOOT_REQUESTED"}
        assert issued.states == {"DOWN", "DRAIN", "REBOOT_ISSUED"}
        assert requested.reason == REASON
        assert issued.reason == f"{REASON} : reboot issued"

    @pytest.mark.parametrize(
        "show", ["show-node-reboot-requested.txt", "show-node-reboot-issued.txt"]
    )
    async def test_a_reboot_of_ours_is_not_asked_for_again(self, tmp_path, show):
        """A reboot fleetwatch asked for, pending or issued: no second ``scontrol reboot``."""
        scontrol, calls = replaying_scontrol(tmp_path, [show])
        result = await SlurmReboots(scontrol=str(scontrol)).reboot("node-02", REASON)
        assert result.outcome is RebootOutcome.ALREADY_REQUESTED
        assert [c[0] for c in calls_of(calls)] == ["show"]

    async def test_a_persons_drain_is_left_alone(self, tmp_path):
        """A node a person drained keeps the person's reason: no reboot, and the adapter
        says who holds it."""
        scontrol, calls = replaying_scontrol(tmp_path, ["show-node-drained-by-person.txt"])
        reboots = SlurmReboots(scontrol=str(scontrol))
        result = await reboots.reboot("node-02", REASON)
        assert result.outcome is RebootOutcome.HELD_BY_OTHER
        assert [c[0] for c in calls_of(calls)] == ["show"]
        outcome = await SlurmRebooter(reboots).reboot("node-02", REASON, "k")
        assert not outcome.ok
        assert outcome.detail == (
            "slurm: node-02 left alone, held out by someone else (bad fan); not rebooted"
        )


class TestErrors:
    async def test_no_reboot_program_is_a_failure_naming_the_node(self, tmp_path):
        """Without a RebootProgram in slurm.conf scontrol refuses; the action fails with the
        node and scontrol's own words."""
        scontrol, _ = replaying_scontrol(
            tmp_path, ["show-node-idle.txt"], fail_reboot="reboot-no-reboot-program.stderr"
        )
        reboots = SlurmReboots(scontrol=str(scontrol))
        with pytest.raises(SlurmError) as caught:
            await reboots.reboot("node-02", REASON)
        assert caught.value.node == "node-02"
        assert "RebootProgram isn't defined" in caught.value.stderr
        outcome = await SlurmRebooter(reboots).reboot("node-02", REASON, "k")
        assert not outcome.ok
        assert not outcome.refused
        assert outcome.detail.startswith(
            "slurm: reboot of node-02 not asked for: scontrol reboot for node 'node-02' failed "
            "(exit 1): scontrol: error: RebootProgram isn't defined"
        )

    async def test_an_unknown_node_is_a_failure_naming_it(self, tmp_path):
        """scontrol's ``Invalid node name specified`` comes back with the node named."""
        scontrol, _ = replaying_scontrol(
            tmp_path, ["show-node-idle.txt"], fail_reboot="reboot-unknown-node.stderr"
        )
        outcome = await SlurmRebooter(SlurmReboots(scontrol=str(scontrol))).reboot(
            "node-02", REASON, "k"
        )
        assert not outcome.ok
        assert "node 'node-02'" in outcome.detail
        assert "Invalid node name specified" in outcome.detail

    async def test_a_missing_scontrol_says_so(self, tmp_path):
        """No scontrol at all: the message names the node and what to install."""
        missing = str(tmp_path / "no-such-scontrol")
        outcome = await SlurmRebooter(SlurmReboots(scontrol=missing)).reboot("node-02", REASON, "k")
        assert not outcome.ok
        assert "node 'node-02'" in outcome.detail
        assert "slurm-client" in outcome.detail

    async def test_a_refused_argument_is_refused_not_failed(self, tmp_path):
        """A node name that fails its check is journaled refused: nothing was run."""
        scontrol, calls = replaying_scontrol(tmp_path, ["show-node-idle.txt"])
        outcome = await SlurmRebooter(SlurmReboots(scontrol=str(scontrol))).reboot(
            "ALL", REASON, "k"
        )
        assert (outcome.ok, outcome.refused) == (False, True)
        assert calls_of(calls) == []
