"""The standing check on a real NVIDIA GPU: what NVML answers, what the agent reads, what it costs.

Run on a machine with an NVIDIA driver, from the repository root (``scripts/gpu-check.sh`` sets
up the packages and runs this, then ``pytest -m gpu``)::

    python3 scripts/gpu_check.py OUT_DIR

It writes to ``OUT_DIR``:

- ``fixture.json``: every NVML call the agent and pre-flight make, on GPU 0, and how it was
  answered (status, type, value; the UUID masked, no serial read), and what the agent's NVML
  source made of it. It becomes a fixture under ``tests/fixtures/nvml/`` that the simulator's
  tests compare against.
- ``check.json``: the simulator's differences from that probe, the agent's NVML source's
  reading and facts, the Xid event thread's start, waits and stop, the cost of reading the GPU
  (real and simulated, same machine), each call's wall time, and pre-flight's single-GPU
  measurements through the real runners.
- ``preflight.txt``: a real collector and a real agent on this machine, and
  ``fleetwatch preflight run --level standard`` against them.

Each part has its own time bound and failure; one that breaks is written down and the next runs.
The last line printed is one JSON object summarising the run.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.request
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agent.preflight.real.torch_runners import TorchCopies, TorchLadder  # noqa: E402
from agent.preflight.runners import Group  # noqa: E402
from agent.sim.devices import gpu_from_probe  # noqa: E402
from agent.sim.nvml_lib import SimNvmlLibrary  # noqa: E402
from agent.sources import nvml_fields as fi  # noqa: E402
from agent.sources.nvml import GpuIdentity, NvmlSource, load_pynvml  # noqa: E402
from agent.sources.nvml_events import NvmlEventWatcher  # noqa: E402
from agent.sources.nvml_probe import call_times_us, differences, probe  # noqa: E402
from fleetwatch.clock import SystemClock  # noqa: E402
from fleetwatch.testing import free_port  # noqa: E402

CLI = [sys.executable, "-c", "import sys; from cli.main import main; sys.exit(main())"]


def log(*parts: object) -> None:
    print(*parts, file=sys.stderr, flush=True)


def part(report: dict[str, Any], name: str, fn: Any) -> None:  # noqa: ANN401
    """Run one part; its result or its traceback goes into the report under ``name``."""
    began = time.monotonic()
    log(f"== {name}")
    try:
        report[name] = fn()
    except Exception:  # noqa: BLE001 - every failure is written down, the next part runs
        report[name] = {"failed": traceback.format_exc()}
        log(report[name]["failed"])
    log(f"   {name}: {time.monotonic() - began:.1f} s")


def nvidia_smi() -> dict[str, str]:
    query = (
        "name,driver_version,pcie.link.gen.max,pcie.link.gen.current,pcie.link.width.max,"
        "pcie.link.width.current,ecc.mode.current,persistence_mode,power.limit,"
        "temperature.gpu,clocks.max.sm,memory.total,mig.mode.current"
    )
    out = {}
    for name, argv in (
        ("query", ["nvidia-smi", f"--query-gpu={query}", "--format=csv"]),
        ("nvlink", ["nvidia-smi", "nvlink", "-s"]),
        ("topo", ["nvidia-smi", "topo", "-m"]),
    ):
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)  # noqa: S603
            out[name] = (done.stdout + done.stderr).strip()
        except (OSError, subprocess.TimeoutExpired) as exc:
            out[name] = f"could not run: {exc}"
    return out


def extras(lib: Any) -> dict[str, Any]:  # noqa: ANN401 - pynvml
    """What the agent does not read yet but a later signal may want: a sample, no serials."""
    h = lib.nvmlDeviceGetHandleByIndex(0)
    out: dict[str, Any] = {}
    for name, fn in {
        "memory_total_mib": lambda: lib.nvmlDeviceGetMemoryInfo(h).total // 2**20,
        "power_limit_mw": lambda: lib.nvmlDeviceGetPowerManagementLimit(h),
        "enforced_power_limit_mw": lambda: lib.nvmlDeviceGetEnforcedPowerLimit(h),
        "architecture": lambda: lib.nvmlDeviceGetArchitecture(h),
        "max_sm_clock_mhz": lambda: lib.nvmlDeviceGetMaxClockInfo(h, 1),
        "max_mem_clock_mhz": lambda: lib.nvmlDeviceGetMaxClockInfo(h, 2),
        "mig_mode": lambda: list(lib.nvmlDeviceGetMigMode(h)),
        "cuda_compute_capability": lambda: list(lib.nvmlDeviceGetCudaComputeCapability(h)),
        "temperature_threshold_gpu_max": lambda: lib.nvmlDeviceGetTemperatureThreshold(h, 3),
        "temperature_threshold_mem_max": lambda: lib.nvmlDeviceGetTemperatureThreshold(h, 4),
        "virtualization_mode": lambda: lib.nvmlDeviceGetVirtualizationMode(h),
        "total_energy_mj": lambda: lib.nvmlDeviceGetTotalEnergyConsumption(h),
        "fan_speed_pct": lambda: lib.nvmlDeviceGetFanSpeed(h),
        "nvlink_remote_pci_0": lambda: lib.nvmlDeviceGetNvLinkRemotePciInfo(h, 0).busId,
    }.items():
        try:
            value = fn()
            out[name] = value.decode() if isinstance(value, bytes) else value
        except Exception as exc:  # noqa: BLE001 - recorded, not raised
            out[name] = f"{type(exc).__name__}: {exc}"
    return out


def source_reading() -> dict[str, Any]:
    source = NvmlSource(load_pynvml())
    driver, nvml_version = source.start()
    try:
        gpu = source.identify(0)
        first = source.read(gpu)
        second = source.read(gpu)
        facts = source.facts(gpu)
        identity = asdict(gpu)
        identity["uuid"] = "masked"
        return {
            "driver": driver,
            "nvml_version": nvml_version,
            "cuda_driver_version": source.cuda_driver_version(),
            "device_count": source.device_count(),
            "identity": identity,
            "reading": asdict(first),
            "second_reading_equal_but_moving_values": {
                k: v for k, v in asdict(second).items() if v != asdict(first)[k]
            },
            "facts": asdict(facts),
            "compute_processes": len(source.compute_processes(gpu)),
            "nvml_calls_for_identify_and_two_reads": source.calls,
        }
    finally:
        source.stop()


def event_thread() -> dict[str, Any]:
    lib = load_pynvml()
    source = NvmlSource(lib)
    source.start()
    try:
        gpu = source.identify(0)
        watcher = NvmlEventWatcher(lib, SystemClock(), timeout_ms=100)
        began = time.monotonic()
        started = watcher.start({"gpu0": source.handle(0)})
        start_s = time.monotonic() - began
        time.sleep(1.0)
        began = time.monotonic()
        watcher.stop()
        stop_s = time.monotonic() - began
        supported = lib.nvmlDeviceGetSupportedEventTypes(source.handle(0))
        return {
            "gpu": gpu.model,
            "started": started,
            "start_s": round(start_s, 4),
            "waits_in_1s_at_100ms": watcher.waits,
            "errors": watcher.errors,
            "stop_s": round(stop_s, 4),
            "supported_event_types": hex(int(supported)),
        }
    finally:
        source.stop()


def field_batches(lib: Any, repeat: int = 20) -> dict[str, dict[str, int]]:  # noqa: ANN401
    """Which fields fail, per way of batching them, over ``repeat`` calls each.

    On one H100 without NVLink, field 3 answered NOT_SUPPORTED in a batch that also held link
    0's fields, and 0 in the agent's own batch: this tells whether the batch's makeup decides.
    """
    handle = lib.nvmlDeviceGetHandleByIndex(0)
    device = fi.request(0)
    count = [(fi.FI_NVLINK_LINK_COUNT, 0)]
    links = [(field, 0) for field in fi.LINK_FIELDS]
    out: dict[str, dict[str, int]] = {}
    for name, keys in {
        "device": device,
        "count+device": count + device,
        "device+links": device + links,
        "count+device+links": count + device + links,
        "links+device": links + device,
    }.items():
        failed: dict[str, int] = {}
        for _ in range(repeat):
            for (field, scope), entry in zip(
                keys, lib.nvmlDeviceGetFieldValues(handle, keys), strict=True
            ):
                if entry.nvmlReturn != 0:
                    key = f"{field}:{scope} -> {entry.nvmlReturn}"
                    failed[key] = failed.get(key, 0) + 1
        out[name] = failed
    return out


def warm_source(lib: Any) -> tuple[NvmlSource, GpuIdentity]:  # noqa: ANN401 - pynvml
    """A started source that has identified GPU 0 and read it 20 times."""
    source = NvmlSource(lib)
    source.start()
    gpu = source.identify(0)
    for _ in range(20):
        source.read(gpu)
    return source, gpu


def read_cost(lib: Any, rounds: int = 5, polls: int = 200) -> dict[str, float]:  # noqa: ANN401
    """CPU and wall per read of GPU 0 through the agent's source, one hand-off per read.

    With the slow counters (a poll at the counter interval) and without (the other polls).
    """
    source, gpu = warm_source(lib)
    out: dict[str, float] = {}
    try:
        for name, counters in (("", True), ("_between_counters", False)):
            cpu, wall = [], []
            calls = source.calls
            for _ in range(rounds):
                c0, w0 = time.process_time(), time.perf_counter()
                for _ in range(polls):
                    source.read(gpu, counters=counters)
                cpu.append((time.process_time() - c0) * 1000 / polls)
                wall.append((time.perf_counter() - w0) * 1000 / polls)
            out[f"cpu_ms_per_gpu_read{name}_median"] = round(statistics.median(cpu), 4)
            out[f"wall_ms_per_gpu_read{name}_median"] = round(statistics.median(wall), 4)
            out[f"nvml_calls_per_read{name}"] = (source.calls - calls) / (rounds * polls)
    finally:
        source.stop()
    return out


def read_profile(lib: Any, reads: int = 300) -> dict[str, Any]:  # noqa: ANN401 - pynvml
    """Where a read's time goes (cProfile's top functions), and the bare hand-off's cost.

    cProfile sees the calling thread only, so the profiled reads run the source's unguarded
    body here; the hand-off to the NVML worker is timed apart.
    """
    import cProfile  # noqa: PLC0415 - the diagnosis alone needs it
    import io  # noqa: PLC0415
    import pstats  # noqa: PLC0415

    source, gpu = warm_source(lib)
    try:
        body = source._read  # noqa: SLF001 - on this thread, for the profiler
        c0 = time.process_time()
        for _ in range(reads):
            body(gpu)
        unguarded_ms = (time.process_time() - c0) * 1000 / reads
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(reads):
            body(gpu)
        profiler.disable()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(14)
        c0 = time.process_time()
        for _ in range(reads):
            source.guarded("nothing", lambda: None)
        handoff_ms = (time.process_time() - c0) * 1000 / reads
        return {
            "profile_top_by_tottime": text.getvalue().splitlines()[:40],
            "cpu_ms_bare_handoff": round(handoff_ms, 4),
            "cpu_ms_per_read_unguarded": round(unguarded_ms, 4),
        }
    finally:
        source.stop()


def sim_like(real: dict[str, Any]) -> SimNvmlLibrary:
    """The simulator's library with one GPU like the real one (model, links, thresholds...)."""
    lib = SimNvmlLibrary([gpu_from_probe(real)])
    lib.nvmlInit()
    return lib


def preflight_runners() -> dict[str, Any]:
    copies = TorchCopies()
    out: dict[str, Any] = {}
    began = time.monotonic()
    out["host"] = [asdict(m) for m in copies.measure_host([0], 90.0)]
    out["host_s"] = round(time.monotonic() - began, 1)
    group = Group("gpu-check", ("local",), 0, 1, "127.0.0.1", free_port(), 64 << 20, 90.0)
    began = time.monotonic()
    out["ladder_1gpu"] = asdict(TorchLadder().run(group, 20))
    out["ladder_s"] = round(time.monotonic() - began, 1)
    return out


def end_to_end(out_dir: Path, *, simulate: bool = False) -> dict[str, Any]:
    """A real collector and agent here, and ``fleetwatch preflight run --level standard``."""
    work = Path(tempfile.mkdtemp(prefix="fw-gpu-check-"))
    grpc_port, http_port = free_port(), free_port()
    api = f"http://127.0.0.1:{http_port}"
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    logs = (work / "collector.log").open("w"), (work / "agent.log").open("w")
    collector = subprocess.Popen(  # noqa: S603 - our own command
        [
            *CLI,
            "collector",
            *("--listen", f"127.0.0.1:{grpc_port}", "--http", f"127.0.0.1:{http_port}"),
            *("--journal", str(work / "journal.db")),
        ],
        stdout=logs[0],
        stderr=subprocess.STDOUT,
        env=env,
    )
    agent = subprocess.Popen(  # noqa: S603 - our own command
        [
            *CLI,
            "agent",
            *("--collector", f"127.0.0.1:{grpc_port}", "--node", "gpu-check-01"),
            *("--state-dir", str(work / "state"), "--job-socket", "", "--no-udev"),
            *("--poll-interval", "2"),
            *(["--simulate"] if simulate else []),
        ],
        stdout=logs[1],
        stderr=subprocess.STDOUT,
        env=env,
    )
    text: list[str] = []
    result: dict[str, Any] = {}
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{api}/api/v1/nodes", timeout=3) as resp:
                    if b"gpu-check-01" in resp.read():
                        break
            except OSError:
                pass
            time.sleep(1)
        time.sleep(5)  # a few polls
        for argv in (
            ["preflight", "--api", api, "run", "--level", "standard", "--nodes", "all"],
            ["preflight", "--api", api, "--json", "show"],
            ["nodes", "--api", api],
            ["incidents", "--api", api],
        ):
            began = time.monotonic()
            command = [*CLI, *argv, *(["--wait", "200"] if "run" in argv else [])]
            done = subprocess.run(  # noqa: S603 - our own command
                command,
                capture_output=True,
                text=True,
                timeout=240,
                env=env,
                check=False,
            )
            took = time.monotonic() - began
            text.append(f"$ fleetwatch {' '.join(argv)}  -> rc {done.returncode} in {took:.1f} s")
            text.append(done.stdout)
            text.append(done.stderr[-4000:])
            result[argv[0] + ("_" + argv[-1] if argv[0] == "preflight" else "")] = done.returncode
        with urllib.request.urlopen(f"{api}/metrics", timeout=10) as resp:
            metrics = resp.read().decode()
        gpu_lines = [
            line
            for line in metrics.splitlines()
            if "gpu-check-01" in line and not line.startswith("#")
        ]
        text.append(f"## /metrics: {len(gpu_lines)} series of node gpu-check-01")
        text.extend(gpu_lines[:400])
    finally:
        for proc in (agent, collector):
            proc.terminate()
        for proc in (agent, collector):
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
        for handle in logs:
            handle.close()
        for name in ("agent.log", "collector.log"):
            body = (work / name).read_text(errors="replace")
            text.append(f"## {name} (last 6000 characters)")
            text.append(body[-6000:])
        (out_dir / "preflight.txt").write_text("\n".join(text))
        shutil.rmtree(work, ignore_errors=True)
    return result


def main() -> int:
    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else "gpu-check-out")
    out_dir.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {}
    if "--simulate" in sys.argv:  # the plumbing alone, on a machine without a GPU
        part(report, "end_to_end", lambda: end_to_end(out_dir, simulate=True))
        print(json.dumps(report, sort_keys=True, default=str))
        return 0
    part(report, "nvidia_smi", nvidia_smi)
    lib = load_pynvml()
    lib.nvmlInit()
    real = probe(lib)
    part(report, "extras", lambda: extras(lib))
    sim = sim_like(real)
    part(report, "sim_differences", lambda: differences(real, probe(sim)))
    part(report, "source", source_reading)
    source = report["source"]
    fixture = {
        "recorded": {
            "how": "scripts/gpu-check.sh (scripts/gpu_check.py)",
            "date": time.strftime("%Y-%m-%d", time.gmtime()),
            "machine": os.environ.get("FW_GPU_CHECK_MACHINE", "not named"),
            "note": "UUID masked; no serial number read",
        },
        "probe": real,
        "source": {k: source.get(k) for k in ("identity", "reading", "facts")},
    }
    (out_dir / "fixture.json").write_text(json.dumps(fixture, indent=1, sort_keys=True) + "\n")
    part(report, "events", event_thread)
    part(report, "field_batches", lambda: field_batches(lib))
    part(report, "call_times_us_real", lambda: call_times_us(lib, repeat=50))
    part(report, "read_cost_real", lambda: read_cost(load_pynvml()))
    part(report, "read_cost_sim", lambda: read_cost(sim_like(real)))
    part(report, "read_profile_real", lambda: read_profile(load_pynvml()))
    part(report, "preflight_runners", preflight_runners)
    (out_dir / "check.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    part(report, "end_to_end", lambda: end_to_end(out_dir))
    (out_dir / "check.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    lib.nvmlShutdown()
    summary = {
        "gpu": real["calls"]["nvmlDeviceGetName"].get("value"),
        "sim_differences": len(report.get("sim_differences") or []),
        "real_cpu_ms_per_gpu_read": report.get("read_cost_real", {}).get(
            "cpu_ms_per_gpu_read_median"
        ),
        "sim_cpu_ms_per_gpu_read": report.get("read_cost_sim", {}).get(
            "cpu_ms_per_gpu_read_median"
        ),
        "failed_parts": [k for k, v in report.items() if isinstance(v, dict) and "failed" in v],
    }
    print(json.dumps(summary, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
