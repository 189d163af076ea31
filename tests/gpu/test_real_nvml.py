"""The real NVML source on a real GPU. Skipped where no NVIDIA driver answers."""

import json
import time
from pathlib import Path

import pytest

from agent.exceptions import NvmlError
from agent.sim.devices import gpu_from_probe
from agent.sim.nvml_lib import SimNvmlLibrary
from agent.sources.nvml import NvmlSource, load_pynvml
from agent.sources.nvml_events import NvmlEventWatcher
from agent.sources.nvml_probe import differences, probe
from fleetwatch.clock import SystemClock

pytestmark = pytest.mark.gpu
RECORDS = Path(__file__).resolve().parents[1] / "fixtures" / "nvml"


@pytest.fixture(scope="module")
def source():
    src = NvmlSource(load_pynvml())
    try:
        src.start()
    except NvmlError as exc:
        pytest.skip(f"no NVIDIA GPU here: {exc}")
    if src.device_count() == 0:
        pytest.skip("NVML started but reports no GPU")
    yield src
    src.stop()


def test_real_gpu_identity_and_reading(source: NvmlSource):
    """Every GPU identifies itself and a poll returns its values in range."""
    for index in range(source.device_count()):
        gpu = source.identify(index)
        assert gpu.uuid.startswith("GPU-")
        assert len(gpu.pci_bus_id) == len("0000:00:00.0")
        reading = source.read(gpu)
        assert len(reading.nvlinks) == gpu.nvlink_count
        if reading.temperature_c is not None:
            assert 0 < reading.temperature_c < 120
        if reading.power_w is not None:
            assert 0 < reading.power_w < 2000


def test_real_event_thread_starts_waits_and_stops(source: NvmlSource):
    """The Xid waiting thread starts on a real driver, times out quietly and stops fast."""
    gpu = source.identify(0)
    watcher = NvmlEventWatcher(load_pynvml(), SystemClock(), timeout_ms=100)
    if not watcher.start({gpu.uuid: source.handle(0)}):
        pytest.skip("this GPU cannot deliver Xid events")
    time.sleep(0.5)
    began = time.monotonic()
    watcher.stop()
    assert time.monotonic() - began < 1.0
    assert watcher.waits >= 2
    assert watcher.errors == 0


def test_the_simulator_answers_as_this_gpu_does(source: NvmlSource):
    """Every call and field the agent uses: same status and type from the simulator given a GPU
    like this one (tests/unit/agent/sim/test_sim_matches_real_gpu.py checks the same against
    records)."""
    lib = load_pynvml()
    real = probe(lib)
    sim_lib = SimNvmlLibrary([gpu_from_probe(real)])
    sim_lib.nvmlInit()
    assert differences(real, probe(sim_lib)) == []


def test_this_gpu_answers_as_its_record_says(source: NvmlSource):
    """Where a record of this model and driver exists, the GPU still answers as recorded."""
    lib = load_pynvml()
    real = probe(lib)
    model = real["calls"]["nvmlDeviceGetName"]["value"]
    driver = real["system"]["nvmlSystemGetDriverVersion"]["value"]
    matching = [
        record
        for record in (json.loads(p.read_text()) for p in RECORDS.glob("real-*.json"))
        if record["probe"]["calls"]["nvmlDeviceGetName"]["value"] == model
        and record["probe"]["system"]["nvmlSystemGetDriverVersion"]["value"] == driver
    ]
    if not matching:
        pytest.skip(f"no record of {model} on driver {driver} under {RECORDS}")
    assert differences(matching[0]["probe"], real) == []
