from pathlib import Path

import pytest

from agent.commands import CommandRunner, NvidiaSmiReset
from agent.sampler import Sampler
from agent.sim.hardware import SimNode
from agent.sources.nvml import NvmlSource
from agent.sources.sysfs import SysfsReader
from fleetwatch.testing import FakeClock
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb
from rules.xid_catalog import load_catalog


@pytest.fixture
def node(tmp_path: Path) -> SimNode:
    return SimNode("n", tmp_path / "sys", FakeClock(), gpus=2, nvlinks=2, ib_ports=1)


def runner(node: SimNode, reset: bool = True) -> CommandRunner:
    sampler = Sampler(
        nvml=NvmlSource(node.nvml),
        sysfs=SysfsReader(node.sysfs.root),
        kmsg=None,
        udev=None,
        catalog=load_catalog(),
        clock=node.clock,
    )
    sampler.discover()
    return CommandRunner(sampler, (lambda gpu: node.reset_gpu(gpu.index)) if reset else None)


def reset(uuid: str, *, force: bool = False) -> pb.Command:
    return pb.Command(command_id="c1", kind=pb.COMMAND_KIND_RESET_GPU, gpu_uuid=uuid, force=force)


class TestCommandRunner:
    async def test_idle_gpu_is_reset(self, node: SimNode):
        """A reset of an idle GPU of this node runs and says so."""
        result = await runner(node).run(reset(node.gpus[1].uuid))
        assert (result.command_id, result.ok, result.detail) == ("c1", True, "GPU 1 reset")
        assert node.gpus[1].resets == 1

    async def test_unknown_gpu_is_refused(self, node: SimNode):
        """A GPU not in this node's inventory is never reset."""
        result = await runner(node).run(reset("GPU-not-here"))
        assert not result.ok
        assert not result.retry_later  # asking again would not help
        assert "no GPU 'GPU-not-here' on this node" in result.detail

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
        assert "turned off" in off.detail
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
