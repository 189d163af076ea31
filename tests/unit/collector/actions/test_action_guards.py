"""Actions cannot be steered by telemetry: what reaches scontrol, a header or a reset is checked."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from structlog.testing import capture_logs

from collector.actions import guards
from collector.actions.adapters import SlurmDrainer
from collector.actions.dispatcher import Dispatcher
from collector.actions.guards import (
    TargetRef,
    UnsafeArgumentError,
    delivery_key,
    drain_reason,
    parse_target,
)
from collector.actions.safety import SafetyConfig
from collector.actions.slurm import SlurmNodes, SlurmRefusedError
from collector.model.fleet import FleetModel
from collector.store.incidents import IncidentRow
from collector.store.journal import Journal
from collector.store.sqlite import SqliteStore
from fleetwatch.testing import FakeClock
from rules.model import ActionSpec, Rule, Scope

if TYPE_CHECKING:
    from pathlib import Path

# What an event detail, a kernel log line, a sample's text or a job's label might hold.
HOSTILE = [
    "; rm -rf /",
    "$(reboot)",
    "`reboot`",
    "a\nb",
    "--help",
    "-o",
    "n 1",
    "n[1-9]",
    "n1,n2",
    "n1|sh",
    "n1 > /etc/passwd",
    "'quoted'",
    '"quoted"',
    "\x1b[31m",
    "",
]
EVIL_EVIDENCE = "IB mlx5_0/1 DOWN; rm -rf / $(reboot)\n--help `id` \"q\" 'q'"


class TestTargets:
    @pytest.mark.parametrize(
        ("target", "expected", "words"),
        [
            ("n1", TargetRef("n1"), "node n1"),
            ("n1/gpu/3", TargetRef("n1", gpu=3), "GPU 3"),
            ("n1/gpu/3/nvlink/17", TargetRef("n1", gpu=3, link=17), "GPU 3 NVLink 17"),
            ("n1/ib/mlx5_0/1", TargetRef("n1", device="mlx5_0", port=1), "IB mlx5_0/1"),
        ],
    )
    def test_keys_of_the_node_are_taken_apart(self, target, expected, words):
        """The target keys the collector builds for a node parse back to their parts."""
        ref = parse_target("n1", target)
        assert (expected, words) == (ref, ref.words())

    @pytest.mark.parametrize("bad", HOSTILE)
    def test_hostile_node_names_are_refused(self, bad):
        """A node name that is not one host name is refused, whatever target comes with it."""
        with pytest.raises(UnsafeArgumentError, match="is not a host name"):
            parse_target(bad, f"{bad}/gpu/0")

    @pytest.mark.parametrize(
        "target",
        [
            "n2/gpu/0",
            "n1x/gpu/0",
            "n1/gpu/0; rm -rf /",
            "n1/gpu/0\n",
            "n1/gpu/-1",
            "n1/gpu/1000",
            "n1/gpu/0/nvlink/$(reboot)",
            "n1/ib/mlx5 0/1",
            "n1/ib/--help/1",
            "n1/ib/mlx5_0/1/../../x",
            "job/j1",
            "fleet",
            "",
        ],
    )
    def test_other_targets_are_refused(self, target):
        """Anything but a node key, GPU, NVLink or IB port key of that node is refused."""
        with pytest.raises(UnsafeArgumentError, match="key of n1"):
            parse_target("n1", target)


class TestDrainReason:
    def test_reason_is_built_from_checked_parts_only(self):
        """The reason names the rule, the target and the incident, and nothing else."""
        reason = drain_reason("ib_port_lost", "n1", "n1/ib/mlx5_0/1", "ib_port_lost:n1/ib/x:12")
        assert reason == "fleetwatch: ib_port_lost: IB mlx5_0/1 (incident ib_port_lost:n1/ib/x:12)"

    @pytest.mark.parametrize("bad", HOSTILE)
    def test_hostile_rule_or_incident_id_is_refused(self, bad):
        """A rule name or incident id with anything a header or a shell would read is refused."""
        with pytest.raises(UnsafeArgumentError, match="rule"):
            drain_reason(bad, "n1", "n1/gpu/0", "r:n1/gpu/0:1")
        ids = (f"r:n1/gpu/0:1{bad}", f"{bad}:n1/gpu/0:1", f"r:{bad}:1")
        for incident_id in ids if bad else ("", ":n1/gpu/0:1", "r::1"):
            with pytest.raises(UnsafeArgumentError, match="incident id"):
                drain_reason("r", "n1", "n1/gpu/0", incident_id)


class TestDeliveryKey:
    def test_keys_of_checked_names_are_kept(self):
        """Action and incident id join as ``<action>:<incident id>``."""
        assert delivery_key("drain_node", "r:n1/gpu/3:5") == "drain_node:r:n1/gpu/3:5"

    def test_job_labels_become_a_digest(self):
        """A job id's ``@``, ``+`` or ``=`` never reaches a header; the key is stable."""
        key = delivery_key("notify", "slow_job:job/user@team+x=1:5")
        assert key.startswith("notify:sha256:")
        assert key == delivery_key("notify", "slow_job:job/user@team+x=1:5")
        assert len(delivery_key("notify", "r:" + "a" * 400 + ":1")) < 200

    @pytest.mark.parametrize("bad", ["a\r\nX-Evil: 1", "a b", "a;b", "", "é"])
    def test_hostile_incident_ids_are_refused(self, bad):
        """An incident id with a line break, a space or shell syntax is refused, not hashed."""
        with pytest.raises(UnsafeArgumentError, match="incident id"):
            delivery_key("notify", bad)


@pytest.fixture
def fake_scontrol(tmp_path: Path) -> tuple[Path, Path]:
    """An scontrol that records each call (one line, NUL between arguments) and shows every
    node IDLE without a reason."""
    calls = tmp_path / "scontrol.calls"
    script = tmp_path / "scontrol"
    script.write_text(
        "#!/bin/sh\n"
        f"for arg in \"$@\"; do printf '%s\\0' \"$arg\"; done >> '{calls}'\n"
        f"echo >> '{calls}'\n"
        'if [ "$1" = show ]; then echo "NodeName=$4 Arch=x86_64 State=IDLE ThreadsPerCore=1"; fi\n'
    )
    script.chmod(0o755)
    return script, calls


def calls_of(calls: Path) -> list[list[str]]:
    if not calls.exists():
        return []
    return [line.split("\0")[:-1] for line in calls.read_text().splitlines()]


def incident(node: str, target: str, incident_id: str = "", evidence: str = "") -> IncidentRow:
    return IncidentRow(
        id=incident_id or f"ib_port_lost:{target}:5400123",
        rule="ib_port_lost",
        node=node,
        target=target,
        severity="critical",
        phase="firing",
        started_ms=1,
        updated_ms=1,
        evidence=evidence,
    )


RULE = Rule(name="ib_port_lost", scope=Scope.IB_PORT, when="true")
DRAIN = (ActionSpec("drain_node"),)


async def drain_through_slurm(tmp_path: Path, scontrol: Path, row: IncidentRow, rule: Rule = RULE):
    """Fire ``row``'s drain through a Slurm drainer; return (journaled state, detail, tally)."""
    journal = Journal(SqliteStore(tmp_path / "journal.db"))
    dispatcher = Dispatcher(
        journal=journal,
        fleet=FleetModel(),
        clock=FakeClock(),
        safety=SafetyConfig(),
        drainers=(SlurmDrainer(SlurmNodes(scontrol=str(scontrol))),),
    )
    try:
        await dispatcher.start()
        await dispatcher.fire(row, rule, DRAIN)
        (action,) = await journal.do(lambda s: s.incidents.actions())
    finally:
        await journal.close()
    return action.state, action.detail, [key for key, _, _ in dispatcher.tally.snapshot()]


class TestDrainCannotBeSteered:
    async def test_slurm_reason_carries_no_evidence(self, tmp_path, fake_scontrol):
        """Evidence quoting hostile telemetry never reaches scontrol: the only update is the
        fixed form, with checked names, each one argument."""
        scontrol, calls = fake_scontrol
        row = incident("n1", "n1/ib/mlx5_0/1", evidence=EVIL_EVIDENCE)
        state, _, _ = await drain_through_slurm(tmp_path, scontrol, row)
        assert state == "succeeded"
        updates = [call for call in calls_of(calls) if call[0] == "update"]
        assert updates == [
            [
                "update",
                "NodeName=n1",
                "State=DRAIN",
                (
                    "Reason=fleetwatch: ib_port_lost: IB mlx5_0/1 "
                    "(incident ib_port_lost:n1/ib/mlx5_0/1:5400123)"
                ),
            ]
        ]

    @pytest.mark.parametrize(
        ("node", "target", "incident_id"),
        [
            ("n1; rm -rf /", "n1; rm -rf //gpu/0", ""),
            ("--help", "--help", ""),
            ("n1\nn2", "n1\nn2", ""),
            ("n[1-9]", "n[1-9]", ""),
            ("n1", "n1/gpu/0; reboot", ""),
            ("n1", "n1/ib/mlx5_0 $(reboot)/1", ""),
            ("n1", "n2/gpu/0", ""),
            ("n1", "n1/gpu/0", "r:n1/gpu/0:1\r\nX-Evil: 1"),
        ],
    )
    async def test_hostile_incident_is_refused_before_scontrol_runs(
        self, tmp_path, fake_scontrol, node, target, incident_id
    ):
        """A drain whose node, target or incident id fails its pattern runs no scontrol at all;
        it is journaled and counted as refused, and logged."""
        scontrol, calls = fake_scontrol
        with capture_logs() as logs:
            state, detail, tally = await drain_through_slurm(
                tmp_path, scontrol, incident(node, target, incident_id)
            )
        assert calls_of(calls) == []
        assert (state, detail.startswith("refused: ")) == ("refused", True)
        assert [(a, o) for a, o, _ in tally] == [("drain_node", "refused")]
        assert any(e["event"] == "action_refused" for e in logs)

    @pytest.mark.parametrize("node", ["ALL", "all", "All", "DEFAULT", "default"])
    async def test_slurm_reserved_node_name_is_refused_before_scontrol_runs(
        self, tmp_path, fake_scontrol, node
    ):
        """A node whose name Slurm reads as every node (``NodeName=ALL``) or as the defaults
        is refused at the guard, in any case: no scontrol call, not even the pre-read (this
        scontrol would describe it as an idle node and let the update run)."""
        scontrol, calls = fake_scontrol
        state, detail, _ = await drain_through_slurm(
            tmp_path, scontrol, incident(node, f"{node}/gpu/0")
        )
        assert (state, calls_of(calls)) == ("refused", [])
        assert "single node" in detail
        with pytest.raises(UnsafeArgumentError, match="single node"):
            guards.check_node(node)

    @pytest.mark.parametrize("node", ["ALL", "all", "Default", "n*", "n?", "n1,n2", "n[1-2]"])
    async def test_slurm_nodes_refuse_reserved_names_and_hostlists(self, fake_scontrol, node):
        """Whoever calls SlurmNodes, a name that is not one node never reaches scontrol:
        drain, resume and state all refuse it before running anything."""
        scontrol, calls = fake_scontrol
        nodes = SlurmNodes(scontrol=str(scontrol))
        for call in (nodes.drain(node, "xid 79"), nodes.resume(node), nodes.state(node)):
            with pytest.raises(SlurmRefusedError, match="not a single Slurm node name"):
                await call
        assert calls_of(calls) == []

    async def test_hostile_rule_name_is_refused(self, tmp_path, fake_scontrol):
        """A rule name is part of the reason, so it is checked too."""
        scontrol, calls = fake_scontrol
        rule = Rule(name="x; reboot", scope=Scope.IB_PORT, when="true")
        state, _, _ = await drain_through_slurm(
            tmp_path, scontrol, incident("n1", "n1/ib/mlx5_0/1"), rule
        )
        assert (state, calls_of(calls)) == ("refused", [])

    @pytest.mark.parametrize("reason", ["; rm -rf /", "$(reboot)", "a`id`", "x | y", "x > y"])
    async def test_slurm_refuses_a_reason_with_shell_syntax(self, fake_scontrol, reason):
        """Whoever calls SlurmNodes.drain, a reason with shell syntax never reaches scontrol."""
        scontrol, calls = fake_scontrol
        with pytest.raises(SlurmRefusedError, match="refusing reason"):
            await SlurmNodes(scontrol=str(scontrol)).drain("n1", reason)
        assert calls_of(calls) == []


def test_all_names_the_public_api():
    """``__all__`` lists the guards module's own classes and functions, and the prefix."""
    own = {
        name
        for name, value in vars(guards).items()
        if not name.startswith("_") and getattr(value, "__module__", None) == guards.__name__
    }
    assert own | {"REASON_PREFIX"} == set(guards.__all__)
