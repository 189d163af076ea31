import dataclasses
import os
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from agent.link.commands import CommandRunner, GpuReset, NvidiaSmiReset
from agent.poll.sampler import Sampler
from agent.sim.hardware import SimNode
from agent.sources.nvml import GpuIdentity, NvmlSource
from agent.sources.sysfs import SysfsReader
from fleetwatch.testing import FakeClock
from fleetwatch.wire.settings import COMMAND_REFUSED
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb
from rules.xid_catalog import load_catalog


@pytest.fixture
def node(tmp_path: Path) -> SimNode:
    return SimNode("n", tmp_path / "sys", FakeClock(), gpus=2, nvlinks=2, ib_ports=1)


def sampler_of(node: SimNode) -> Sampler:
    sampler = Sampler(
        nvml=NvmlSource(node.nvml),
        sysfs=SysfsReader(node.sysfs.root),
        kmsg=None,
        udev=None,
        catalog=load_catalog(),
        clock=node.clock,
    )
    sampler.discover()
    return sampler


def runner(node: SimNode, reset: bool = True) -> CommandRunner:
    return CommandRunner(
        sampler_of(node), (lambda gpu: node.reset_gpu(gpu.index)) if reset else None
    )


def reset(uuid: str, *, force: bool = False) -> pb.Command:
    return pb.Command(command_id="c1", kind=pb.COMMAND_KIND_RESET_GPU, gpu_uuid=uuid, force=force)


class TestCommandRunner:
    async def test_idle_gpu_is_reset(self, node: SimNode):
        """A reset of an idle GPU of this node runs and says so."""
        result = await runner(node).run(reset(node.gpus[1].uuid))
        assert (result.command_id, result.ok, result.detail) == ("c1", True, "GPU 1 reset")
        assert node.gpus[1].resets == 1

    async def test_unknown_gpu_is_refused(self, node: SimNode, tmp_path: Path):
        """A GPU not in this node's inventory (another node's) is never reset: refused for good,
        logged and counted."""
        other = SimNode("other", tmp_path / "other", FakeClock(), gpus=2, nvlinks=2, ib_ports=1)
        commands = runner(node)
        with capture_logs() as logs:
            result = await commands.run(reset(other.gpus[0].uuid))
        assert not result.ok
        assert not result.retry_later  # asking again would not help
        assert result.detail == f"{COMMAND_REFUSED}no GPU {other.gpus[0].uuid!r} on this node"
        assert commands.refused == {"unknown_gpu": 1}
        assert [e["reason"] for e in logs if e["event"] == "command_refused"] == ["unknown_gpu"]
        assert [g.resets for g in node.gpus + other.gpus] == [0, 0, 0, 0]

    async def test_busy_gpu_is_refused_unless_forced(self, node: SimNode):
        """Compute processes block a reset for now (the collector asks again later); force goes
        ahead to the driver."""
        node.gpus[0].processes = [11]
        refused = await runner(node).run(reset(node.gpus[0].uuid))
        assert "busy: 1 compute processes (11)" in refused.detail
        assert (refused.ok, refused.retry_later) == (False, True)
        forced = await runner(node).run(reset(node.gpus[0].uuid, force=True))
        assert not forced.ok  # the simulated driver refuses too: the GPU is still in use
        assert "in use by 1 processes" in forced.detail

    async def test_resets_off_and_other_kinds(self, node: SimNode):
        """An agent without resets, and commands it does not know, refuse with a reason."""
        off = await runner(node, reset=False).run(reset(node.gpus[0].uuid))
        assert off.detail == f"{COMMAND_REFUSED}GPU resets are turned off on this agent"
        other = await runner(node).run(
            pb.Command(command_id="c2", kind=pb.COMMAND_KIND_RUN_DIAGNOSTIC)
        )
        assert "not supported" in other.detail

    def test_nvidia_smi_missing_is_a_clear_failure(self):
        """Without nvidia-smi the real resetter fails with the error, no exception."""
        from agent.sources.nvml import GpuIdentity  # noqa: PLC0415

        ok, detail = NvidiaSmiReset("/nonexistent/nvidia-smi")(
            GpuIdentity(0, "GPU-x", "0000:18:00.0", "H100", 18)
        )
        assert not ok
        assert "nvidia-smi --gpu-reset" in detail


# Command texts a collector bug, or anyone who got hold of the stream, might send.
HOSTILE_UUIDS = [
    "; rm -rf /",
    "$(reboot)",
    "`reboot`",
    "GPU-00000000 && reboot",
    "GPU-0000000a\n--help",
    "GPU-0000000a; rm -rf /",
    "--gpu-reset",
    "-r",
    "",
    "GPU-" + "a" * 200,
    "../../dev/nvidia0",
]
# Bus ids an inventory must never hand to nvidia-smi (NVML's, normalised, are dddd:bb:dd.f).
HOSTILE_BUS_IDS = [
    "0000:18:00.0; rm -rf /",
    "0000:18:00.0 --help",
    "0000:18:00.0 ",
    " 0000:18:00.0",
    "0000:18:00.0\n-r",
    "--help",
    "-r",
    "$(reboot)",
    "0000:18:00.0,0000:19:00.0",
    "0000:18:00.0/../../x",
    "",
]


@pytest.fixture
def fake_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An ``nvidia-smi`` first on PATH that records each call's arguments (one line per call,
    NUL between arguments) and says it reset the GPU."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "nvidia-smi.calls"
    script = bin_dir / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        f"for arg in \"$@\"; do printf '%s\\0' \"$arg\"; done >> '{calls}'\n"
        f"echo >> '{calls}'\n"
        'echo "GPU $3 was successfully reset."\n'
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return calls


def calls_of(calls: Path) -> list[list[str]]:
    if not calls.exists():
        return []
    return [line.split("\0")[:-1] for line in calls.read_text().splitlines()]


class TestNothingRunsFromCommandText:
    async def test_the_reset_is_built_from_the_inventory(self, node: SimNode, fake_nvidia_smi):
        """A reset of a GPU of this node runs nvidia-smi with the inventory's own bus id as one
        argument, nothing else."""
        sampler = sampler_of(node)
        result = await CommandRunner(sampler, NvidiaSmiReset()).run(reset(node.gpus[1].uuid))
        bus_id = sampler.inventory.gpus[1].pci_bus_id
        assert (result.ok, result.detail) == (True, f"GPU {bus_id} was successfully reset.")
        assert calls_of(fake_nvidia_smi) == [["--gpu-reset", "-i", bus_id]]

    @pytest.mark.parametrize("uuid", HOSTILE_UUIDS)
    async def test_hostile_uuid_is_refused_before_anything_runs(
        self, node: SimNode, fake_nvidia_smi, uuid: str
    ):
        """A command whose GPU is not a well-formed UUID of this node's inventory is refused for
        good, counted and logged, and no program runs, forced or not."""
        commands = CommandRunner(sampler_of(node), NvidiaSmiReset())
        with capture_logs() as logs:
            for force in (False, True):
                result = await commands.run(reset(uuid, force=force))
                assert (result.ok, result.retry_later) == (False, False)
                assert result.detail.startswith(COMMAND_REFUSED)
        assert calls_of(fake_nvidia_smi) == []
        assert sum(commands.refused.values()) == 2
        assert len([e for e in logs if e["event"] == "command_refused"]) == 2

    @pytest.mark.parametrize("bus_id", HOSTILE_BUS_IDS)
    async def test_inventory_with_a_hostile_bus_id_is_refused(
        self, node: SimNode, fake_nvidia_smi, bus_id: str
    ):
        """Even a GPU of the inventory is not reset when its bus id is not dddd:bb:dd.f: neither
        the runner nor nvidia-smi's resetter would put it on a command line."""
        sampler = sampler_of(node)
        gpus = list(sampler.inventory.gpus)
        gpus[0] = dataclasses.replace(gpus[0], pci_bus_id=bus_id)
        sampler.inventory = dataclasses.replace(sampler.inventory, gpus=tuple(gpus))
        ran: list[GpuIdentity] = []

        def recording(gpu: GpuIdentity) -> tuple[bool, str]:
            ran.append(gpu)
            return True, "reset"

        resetters: list[GpuReset] = [recording, NvidiaSmiReset()]
        for resetter in resetters:
            commands = CommandRunner(sampler, resetter)
            result = await commands.run(reset(gpus[0].uuid, force=True))
            assert not result.ok
            assert result.detail.startswith(f"{COMMAND_REFUSED}GPU 0 has PCI bus id {bus_id!r}")
            assert commands.refused == {"bad_bus_id": 1}
        assert ran == []
        ok, detail = NvidiaSmiReset()(gpus[0])
        assert (ok, detail.startswith(COMMAND_REFUSED)) == (False, True)
        assert calls_of(fake_nvidia_smi) == []
        with pytest.raises(ValueError, match=r"not dddd:bb:dd\.f"):
            NvidiaSmiReset().argv(gpus[0])
