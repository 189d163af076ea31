"""The simulator answers NVML the way a real GPU did.

``tests/fixtures/nvml/real-*.json`` are records of real GPUs made by ``scripts/gpu-check.sh``
(how each NVML call the agent and pre-flight make was answered, and what the agent's NVML source
read). The simulator, given a GPU like the recorded one, must answer every call with the same
status and type, and every field with the same return code and value type; the agent's source
must read the same shape from it. Values that move (temperature, power, clocks) are not compared.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from agent.sim.devices import SimGpu, gpu_from_probe
from agent.sim.nvml_lib import SimNvmlLibrary
from agent.sources.nvml import NvmlSource
from agent.sources.nvml_probe import differences, probe

RECORDS = sorted((Path(__file__).resolve().parents[3] / "fixtures" / "nvml").glob("real-*.json"))


def load(path: Path) -> dict[str, Any]:
    record: dict[str, Any] = json.loads(path.read_text())
    return record


def sim_probe(gpu: SimGpu) -> dict[str, Any]:
    lib = SimNvmlLibrary([gpu])
    lib.nvmlInit()
    try:
        return probe(lib)
    finally:
        lib.nvmlShutdown()


def test_there_is_a_record_of_a_real_gpu():
    assert RECORDS, "no tests/fixtures/nvml/real-*.json"


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.stem)
def test_the_simulator_answers_every_call_and_field_as_the_real_gpu_did(path: Path):
    real = load(path)["probe"]
    assert differences(real, sim_probe(gpu_from_probe(real))) == []


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.stem)
def test_the_simulated_gpu_has_the_real_ones_fixed_facts(path: Path):
    real = load(path)["probe"]
    sim = sim_probe(gpu_from_probe(real))
    for call in (
        "nvmlDeviceGetName",
        "nvmlDeviceGetMaxPcieLinkGeneration",
        "nvmlDeviceGetMaxPcieLinkWidth",
        "nvmlDeviceGetTemperatureThreshold(SLOWDOWN)",
        "nvmlDeviceGetTemperatureThreshold(SHUTDOWN)",
        "nvmlDeviceGetEccMode",
        "nvmlDeviceGetPersistenceMode",
        "nvmlDeviceGetSupportedEventTypes",
    ):
        assert sim["calls"][call].get("value") == real["calls"][call].get("value"), call
    # The formats the agent parses or shows, whatever the versions are.
    assert re.fullmatch(r"\d+\.\d+\.\d+\.\d+", sim["system"]["nvmlSystemGetNVMLVersion"]["value"])
    assert re.fullmatch(r"\d+\.\d+\.\d+", sim["system"]["nvmlSystemGetDriverVersion"]["value"])
    vbios = r"[0-9A-F]{2}(\.[0-9A-F]{2}){4}"
    assert re.fullmatch(vbios, real["calls"]["nvmlDeviceGetVbiosVersion"]["value"])
    assert re.fullmatch(vbios, SimGpu(0, "GPU-x", 0x18).vbios_version)


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.stem)
def test_the_agents_source_reads_the_same_shape_from_the_simulator(path: Path):
    record = load(path)
    source = NvmlSource(SimNvmlLibrary([gpu_from_probe(record["probe"])]))
    source.start()
    try:
        gpu = source.identify(0)
        reading = asdict(source.read(gpu))
        facts = asdict(source.facts(gpu))
    finally:
        source.stop()
    real_identity = record["source"]["identity"]
    assert gpu.nvlink_count == real_identity["nvlink_count"]
    assert (gpu.max_pcie_gen, gpu.max_pcie_width) == (
        real_identity["max_pcie_gen"],
        real_identity["max_pcie_width"],
    )
    unread = {k for k, v in record["source"]["reading"].items() if v is None}
    assert {k for k, v in reading.items() if v is None} == unread
    assert len(reading["nvlinks"]) == len(record["source"]["reading"]["nvlinks"])
    assert facts == record["source"]["facts"]


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.stem)
def test_the_default_hgx_gpu_differs_from_a_gpu_without_nvlink_only_in_nvlink(path: Path):
    """The simulator's default GPU sits on an HGX board with 18 NVLinks; a record of a GPU
    without NVLink (a PCIe card, or one passed into a VM) differs from it in NVLink alone."""
    real = load(path)["probe"]
    if real["nvlink_count"]:
        pytest.skip("the recorded GPU has NVLinks")
    default = SimGpu(0, "GPU-x", 0x18, model=real["calls"]["nvmlDeviceGetName"]["value"])
    found = differences(real, sim_probe(default))
    assert found
    nvlink = re.compile(r"^(nvlink_count|nvmlDeviceGetNvLink|field (91|161|162|163|165):)")
    assert [line for line in found if not nvlink.match(line)] == []
