from pathlib import Path
from typing import Any

import pytest

from agent.poll.sampler import Sampler
from agent.sim.hardware import SimNode
from agent.sim.scenario import (
    PARAMS,
    RANK_FAULTS,
    Fault,
    FaultKind,
    ScenarioError,
    apply_fault,
    load_scenario,
    parse_scenario,
)
from agent.sources.nvml import NvmlSource
from agent.sources.pci_sysfs import PciSysfsReader
from agent.sources.sysfs import SysfsReader
from fleetwatch.model import EventKind, Target
from fleetwatch.testing import FakeClock
from rules.xid_catalog import load_catalog
from tests.unit.agent.sim.bmc_faults import BMC_EXPECTED


class TestScenarioFile:
    def test_builtin_demo_scenario_loads(self):
        """The demo's scenario file is valid and names its nodes and faults."""
        scenario = load_scenario()
        assert scenario.name == "demo"
        assert scenario.nodes == ("node-01", "node-02", "node-03", "node-04")
        assert {f.kind for f in scenario.faults} >= {FaultKind.GPU_LOST, FaultKind.NODE_CRASH}

    def test_flap_expands_into_downs_and_ups(self):
        """An IB flap becomes alternating downs and ups, in time order."""
        scenario = parse_scenario(
            "version: 1\nduration: 10\nnodes: 1\nfaults:\n"
            "  - {at: 2, node: node-01, fault: ib_flap, port: 3, times: 2, every: 2}\n",
        )
        assert [(f.at_s, f.kind) for f in scenario.timeline()] == [
            (2.0, FaultKind.IB_DOWN),
            (3.0, FaultKind.IB_UP),
            (4.0, FaultKind.IB_DOWN),
            (5.0, FaultKind.IB_UP),
        ]

    def test_scaling_stretches_the_timeline(self):
        """A 30 s scenario played in 15 s keeps its order at half the times."""
        scaled = load_scenario().scaled(15)
        assert scaled.duration_s == 15
        assert [f.at_s for f in scaled.faults] == [f.at_s / 2 for f in load_scenario().faults]

    @pytest.mark.parametrize(
        ("fault", "message"),
        [
            ("{at: 1, node: node-01, fault: meteor}", "unknown fault"),
            ("{at: 1, node: node-09, fault: xid, gpu: 0, xid: 13}", "node 'node-09'"),
            ("{at: 1, node: node-01, fault: xid, gpu: 0}", r"missing: xid"),
            ("{at: 1, node: node-01, fault: xid, gpu: 0, xid: 13, pid: 4}", r"unknown: pid"),
            ("{at: 1, node: node-01, fault: xid, gpu: -1, xid: 13}", "not negative"),
            ("{at: 1, node: node-01, fault: xid, gpu: 0.5, xid: 13}", "whole number"),
            ("{at: 99, node: node-01, fault: node_crash}", "after the scenario's duration"),
            ("{node: node-01, fault: node_crash}", "at must be a number"),
            ("{at: 1, node: node-01, fault: p2p_low, gpu: 1, peer: 1, factor: 0.5}", "another"),
            ("{at: 1, node: node-01, fault: p2p_low, gpu: 1, peer: 2, factor: 1.5}", "at most 1"),
            ("{at: 1, node: node-01, fault: p2p_low, gpu: 1, peer: 2, factor: 0}", "more than 0"),
            ("{at: 1, node: node-01, fault: ib_rate_low, port: 0, rate: 300}", "rate must be"),
            (
                "{at: 1, node: node-01, fault: bad_cable, peer: node-01, port: 0, factor: .5}",
                "peer",
            ),
            (
                "{at: 1, node: node-01, fault: bad_cable, peer: node-07, port: 0, factor: .5}",
                "peer",
            ),
            (
                "{at: 1, node: node-01, fault: bad_cable, peer: 2, port: 0, factor: .5}",
                "peer must",
            ),
            ("{at: 1, node: node-01, fault: driver_version, version: 'a b'}", "version must"),
        ],
    )
    def test_bad_fault_names_fault_and_key(self, fault: str, message: str):
        """Each mistake in a fault is refused with the fault's number and what was wrong."""
        text = f"version: 1\nduration: 10\nnodes: 2\nfaults:\n  - {fault}\n"
        with pytest.raises(ScenarioError, match=message) as info:
            parse_scenario(text, "s.yaml")
        assert "s.yaml: fault 1" in str(info.value)

    @pytest.mark.parametrize(
        ("text", "message"),
        [
            ("version: 2", "version: 1"),
            ("version: 1\nduration: 0\nnodes: 1", "duration must be positive"),
            ("version: 1\nduration: 5\nnodes: zero", "nodes must be"),
            ("version: 1\nduration: 5\nnodes: 1\nfaults: {a: 1}", "faults must be a list"),
            (": : :", "not valid YAML"),
        ],
    )
    def test_bad_file_is_refused(self, text: str, message: str):
        """A broken scenario file says what is wrong with it."""
        with pytest.raises(ScenarioError, match=message):
            parse_scenario(text)

    def test_missing_file(self, tmp_path: Path):
        """A scenario path that does not exist is a clear error."""
        with pytest.raises(ScenarioError, match="cannot read"):
            load_scenario(tmp_path / "nope.yaml")


def example_params(kind: FaultKind) -> dict[str, Any]:
    values = {
        "gpu": 2,
        "link": 5,
        "port": 1,
        "xid": 31,
        "count": 40,
        "replay": 4,
        "recovery": 1,
        "crc": 9,
        "gen": 4,
        "width": 8,
        "temperature": 93,
        "times": 1,
        "every": 2.0,
        "xmit_wait_per_s": 5000.0,
        "factor": 1.3,
        "rate": 200,
        "version": "535.183.01",
        "cpu": 12,
        "device": "nvme0n1p2",
        "switch": 2,
        "sxid": 20034,
        "watts": 300,
        "seconds": 5.0,
    }
    if kind in (FaultKind.P2P_LOW, FaultKind.BAD_CABLE):
        values["factor"] = 0.5
        values["peer"] = 5 if kind == FaultKind.P2P_LOW else "node-02"
    return {key: values[key] for key in PARAMS[kind]}


# What the agent must report, exactly once, for each fault on GPU 2 / link 5 / port mlx5_1.
EXPECTED: dict[FaultKind, list[tuple[EventKind, int]]] = {
    FaultKind.XID: [(EventKind.XID, 31)],
    FaultKind.GPU_LOST: [(EventKind.GPU_LOST, 79)],
    FaultKind.PCI_REMOVE: [(EventKind.GPU_LOST, 0)],
    FaultKind.NVLINK_DOWN: [(EventKind.NVLINK_DOWN, 0)],
    FaultKind.NVLINK_UP: [],  # the link was up already
    FaultKind.NVLINK_ERRORS: [],
    FaultKind.PCIE_REPLAYS: [(EventKind.PCIE_AER, 0)],
    FaultKind.PCIE_DOWNGRADE: [],
    FaultKind.ECC_SBE: [],
    FaultKind.ECC_DBE: [(EventKind.XID, 48), (EventKind.XID, 63)],
    FaultKind.REMAP_PENDING: [(EventKind.XID, 63)],
    FaultKind.REMAP_FAILURE: [(EventKind.XID, 64)],
    FaultKind.THERMAL: [],
    FaultKind.THERMAL_CLEAR: [],
    FaultKind.NVML_HANG: [],  # NVML values are left out; agent_nvml_hung says why
    FaultKind.NVML_HANG_CLEAR: [],
    FaultKind.IB_DOWN: [(EventKind.IB_PORT_DOWN, 0)],
    FaultKind.IB_UP: [],  # the port was up already
    FaultKind.IB_FLAP: [(EventKind.IB_PORT_DOWN, 0), (EventKind.IB_PORT_UP, 0)],
    FaultKind.IB_SYMBOL_ERRORS: [],
    FaultKind.IB_CONGESTION: [],
    FaultKind.SLOW_GPU: [],
    # A rank's hang leaves nothing in the hardware: the job's rank processes play it.
    FaultKind.RANK_STOP: [],
    FaultKind.RANK_EXIT: [],
    FaultKind.RANK_STUCK: [],
    FaultKind.RANK_DESYNC: [],
    FaultKind.JOB_STALL: [],
    # No error counter shows these: no events, no samples move (pre-flight measures them).
    FaultKind.P2P_LOW: [],
    FaultKind.BAD_CABLE: [],
    FaultKind.DRIVER_VERSION: [],
    # Read every counter interval: a port below its rate, a NIC's PCIe link, RoCE GIDs.
    FaultKind.IB_RATE_LOW: [(EventKind.IB_RATE_LOW, 0)],
    FaultKind.NIC_PCIE_DOWNGRADE: [(EventKind.PCIE_LINK_DEGRADED, 0)],
    FaultKind.ROCE_GID_MISSING: [(EventKind.ROCE_GID_MISSING, 0)],
    FaultKind.GPU_UNKNOWN_ERROR: [],  # no event: the GPU's failed polls are counted
    # The kernel's other hardware lines (the SXid carries its number in xid).
    FaultKind.MCE: [(EventKind.MACHINE_CHECK, 0)],
    FaultKind.MCE_UNCORRECTED: [(EventKind.MACHINE_CHECK_UNCORRECTED, 0)],
    FaultKind.FS_ERROR: [(EventKind.FS_ERROR, 0)],
    FaultKind.FS_READ_ONLY: [(EventKind.FS_ERROR, 0), (EventKind.FS_READ_ONLY, 0)],
    FaultKind.SXID: [(EventKind.SXID, 20034)],
    FaultKind.SXID_FATAL: [(EventKind.SXID_FATAL, 20034)],
    FaultKind.AER_UNRECOVERED: [(EventKind.PCIE_AER, 0), (EventKind.PCIE_AER_UNRECOVERED, 0)],
    # Power slows the GPU (clock samples), a failing reset shows only when one is tried.
    FaultKind.POWER_BRAKE: [],
    FaultKind.POWER_CAP: [],
    FaultKind.POWER_CLEAR: [],
    FaultKind.RESET_FAILS: [],
}

# The sample each fault must move (GPU 2, its link 5, or port mlx5_1), and to what.
EVIDENCE: dict[FaultKind, tuple[str, str, object]] = {
    FaultKind.NVLINK_ERRORS: ("link", "nvlink_crc_errors", 9),
    FaultKind.PCIE_REPLAYS: ("gpu", "aer_correctable_total", 40),
    FaultKind.PCIE_DOWNGRADE: ("gpu", "pcie_sysfs_link_width", 8),
    FaultKind.ECC_SBE: ("gpu", "ecc_sbe_volatile_total", 40),
    FaultKind.ECC_DBE: ("gpu", "remap_pending", 1),
    FaultKind.THERMAL: ("gpu", "temperature_celsius", 93),
    FaultKind.IB_SYMBOL_ERRORS: ("port", "ib_symbol_error", 40),
    FaultKind.IB_CONGESTION: ("port", "ib_port_xmit_wait_per_second", 5000.0),
    FaultKind.GPU_LOST: ("gpu", "gpu_present", 0),
    FaultKind.NVML_HANG: ("node", "agent_nvml_hung", 1),
    FaultKind.NVML_HANG_CLEAR: ("node", "agent_nvml_hung", 0),
    FaultKind.IB_RATE_LOW: ("port", "ib_rate_low", 1),
    FaultKind.NIC_PCIE_DOWNGRADE: ("port", "nic_pcie_link_degraded", 1),
    FaultKind.ROCE_GID_MISSING: ("port", "roce_gid_missing", 1),
    FaultKind.GPU_UNKNOWN_ERROR: ("gpu", "nvml_read_failures", 1),  # the poll after the fault
    FaultKind.AER_UNRECOVERED: ("gpu", "aer_nonfatal_total", 1),
    FaultKind.POWER_BRAKE: ("gpu", "clocks_hw_power_brake", 1),
    FaultKind.POWER_CAP: ("gpu", "sm_clock_mhz", 1755),
    FaultKind.POWER_CLEAR: ("gpu", "sm_clock_mhz", 1980),
}

# What the inventory (the Hello) of an agent started after the fault says.
INVENTORY: dict[FaultKind, tuple[str, str]] = {
    FaultKind.IB_RATE_LOW: ("ib_rate", "200 Gb/sec (4X HDR)"),
    FaultKind.DRIVER_VERSION: ("driver_version", "535.183.01"),
}


def _check_rank_faults(kind: FaultKind, node: SimNode, clock: FakeClock) -> None:
    """A rank's hang waits on its GPU for the job; a stall on the node, until when it ends."""
    if kind in RANK_FAULTS:
        assert [g.rank_fault for g in node.gpus if g.rank_fault] == [RANK_FAULTS[kind]]
        assert node.gpus[2].rank_fault == RANK_FAULTS[kind]
    if kind == FaultKind.JOB_STALL:  # 5 s from when it was played, 8 s ago by the fake clock
        assert node.stall_until == pytest.approx(clock.monotonic() - 8.0 + 5.0)


class TestEachFaultKind:
    def test_every_kind_has_an_expectation(self):
        """No fault kind is left untested (a crash is the collector's to see; the BMC's faults
        are played in tests/unit/agent/sim/test_scenario_bmc.py, through the agent's BMC poller)."""
        staged = {FaultKind.NODE_CRASH, FaultKind.AGENT_CUTOFF}  # played in test_sim_faults
        assert set(EXPECTED) | set(BMC_EXPECTED) | staged == set(FaultKind)

    @pytest.mark.parametrize("kind", sorted(EXPECTED))
    async def test_fault_shows_up_as_the_right_events_exactly_once(self, kind, tmp_path: Path):
        """The fault's events appear once, in order, and its evidence is in the samples."""
        clock = FakeClock()
        node = SimNode("node-01", tmp_path / "sys", clock)
        sampler = _sampler(node, clock)
        sampler.discover()
        await sampler.poll()
        scenario_fault = Fault(0.0, "node-01", kind, example_params(kind))
        events = []
        samples = {}
        for step in [scenario_fault] if kind != FaultKind.IB_FLAP else _flap(scenario_fault):
            apply_fault(step, node)
            clock.advance(2.0)
            node.tick(2.0)
            result = await sampler.poll()
            events += result.events
            samples.update(result.samples)
        for _ in range(3):  # nothing more may come of it
            clock.advance(2.0)
            node.tick(2.0)
            events += (await sampler.poll()).events
        node.nvml_hang_clear()
        sampler.close()
        assert [(e.kind, e.xid) for e in events] == EXPECTED[kind]
        if kind in EVIDENCE:
            where, signal, value = EVIDENCE[kind]
            target = {
                "gpu": Target.gpu(node.gpus[2].uuid),
                "link": Target.nvlink(node.gpus[2].uuid, 5),
                "port": Target.ib_port("mlx5_1", 1),
                "node": Target.node(),
            }[where]
            assert samples[target, signal] == pytest.approx(value)
        if kind == FaultKind.SLOW_GPU:
            assert node.gpus[2].slowdown == pytest.approx(1.3)
        _check_rank_faults(kind, node, clock)
        _check_power_and_reset(kind, node, samples)
        if kind == FaultKind.P2P_LOW:
            assert node.p2p_factors == {(2, 5): 0.5}
        if kind == FaultKind.BAD_CABLE:
            assert node.cable_factors == {("node-02", 1): 0.5}
        if kind in INVENTORY:
            fresh = _sampler(node, clock)
            fresh.discover()
            inventory = fresh.inventory
            fresh.close()
            what, expected = INVENTORY[kind]
            if what == "ib_rate":
                assert [p.rate for p in inventory.ib_ports if p.device == "mlx5_1"] == [expected]
                assert {p.rate for p in inventory.ib_ports if p.device != "mlx5_1"} == {
                    "400 Gb/sec (4X NDR)"
                }
            else:
                assert inventory.driver_version == expected


def _check_power_and_reset(kind: FaultKind, node: SimNode, samples: dict[Any, Any]) -> None:
    """A brake holds the clock lower than a cap; a cap sets the power; a reset then fails."""
    gpu = Target.gpu(node.gpus[2].uuid)
    if kind == FaultKind.POWER_BRAKE:
        assert samples[gpu, "sm_clock_mhz"] == 1600
    if kind == FaultKind.POWER_CAP:
        assert samples[gpu, "power_watts"] == pytest.approx(300)
    if kind == FaultKind.RESET_FAILS:
        ok, detail = node.reset_gpu(2)
        assert not ok
        assert "Unable to reset GPU" in detail


def _sampler(node: SimNode, clock: FakeClock) -> Sampler:
    return Sampler(
        nvml=NvmlSource(node.nvml, call_timeout_s=1.0),  # a hung GPU costs one second
        sysfs=SysfsReader(node.sysfs.root),
        pci=PciSysfsReader(node.sysfs.root),
        kmsg=node.kmsg,
        udev=node.udev,
        catalog=load_catalog(),
        clock=clock,
        counter_interval_s=1.0,
    )


def _flap(fault: Fault) -> list[Fault]:
    from agent.sim.scenario import Scenario  # noqa: PLC0415

    return Scenario("flap", 10.0, ("node-01",), (fault,)).timeline()
