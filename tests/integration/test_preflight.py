"""Pre-flight end to end: real agents on simulated nodes, real gRPC, SQLite and HTTP on loopback.

The measured checks run on small fixed-value runners (hardware stand-ins implementing the runner
interfaces); the quick checks read the simulated NVML and sysfs through the agent's own sources.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import TYPE_CHECKING

import pytest

from cli.output import cut
from collector.preflight.plan import PlanTimes
from fleetwatch.testing import wait_until
from tests.integration.fleet_harness import api, kinds
from tests.integration.preflight_bed import NODES, Fixed, api_text, run_cli

if TYPE_CHECKING:
    from tests.integration.preflight_bed import Bed

pytestmark = pytest.mark.integration


class TestQuickAndStandard:
    async def test_a_healthy_fleet_passes_and_lands_in_journal_and_api(self, bed: Bed):
        """quick then standard over the API and the CLI: exit 0, every node pass, the judged
        results journaled (quick checks read from the simulated NVML and sysfs), and the API's
        run shows each node's checks."""
        code, text = await run_cli(bed, "run", "--level", "quick", "--nodes", "gpu-[01-04]")
        assert code == 0, text
        assert "PASS" in text
        code, text = await run_cli(bed, "run", "--level", "standard")
        assert code == 0, text
        status, listing = await asyncio.to_thread(api, bed.service, "GET", "/api/v1/preflight")
        assert status == 200
        runs = listing["runs"]
        assert [r["level"] for r in runs] == ["standard", "quick"]
        assert all(r["verdict"] == "pass" for r in runs)
        status, detail = await asyncio.to_thread(
            api, bed.service, "GET", f"/api/v1/preflight/{runs[0]['id']}"
        )
        assert status == 200
        assert set(detail["nodes"]) == set(NODES)
        checks = detail["nodes"]["gpu-02"]["checks"]
        assert checks["nvlink_up"] == "pass"
        assert checks["ib_port"] == "pass"
        assert checks["nic_firmware"] == "pass"
        assert checks["p2p_bw"] == "pass"
        assert checks["allreduce_node"] == "pass"
        rows = await bed.service.journal.do(lambda s: s.preflight.results(runs[0]["id"]))
        ecc = [r for r in rows if r.check == "ecc_mode" and r.node == "gpu-03"]
        assert len(ecc) == 8
        assert {r.value for r in ecc} == {1.0}
        assert all(r.gate for r in ecc)
        assert bed.receiver.deliveries() == []  # nothing held out

    async def test_dry_run_prints_the_plan_and_runs_nothing(self, bed: Bed):
        code, text = await run_cli(bed, "run", "--level", "full", "--dry-run")
        assert code == 0, text
        assert "ib_write_bw mlx5_0/1 server with" in text
        assert "ladder on 4 nodes" in text
        runs = await bed.service.journal.do(lambda s: s.preflight.runs())
        assert runs == []


class TestFailures:
    async def test_a_failing_node_exits_1_and_is_drained_naming_the_check(self, bed: Bed):
        """ECC off on one GPU of gpu-02: the run fails (exit 1), gpu-02 alone fails, and it is
        drained through the ordinary drain action with the check in the reason."""
        bed.cluster.nodes["gpu-02"].gpus[5].ecc_mode = 0
        code, text = await run_cli(bed, "run", "--level", "quick")
        assert code == 1, text
        assert "ecc_mode gpu:5" in text
        await wait_until(
            lambda: ("drain_request", "gpu-02") in kinds(bed.receiver), what="drain request"
        )
        drains = [d for d in bed.receiver.deliveries() if d.body["kind"] == "drain_request"]
        assert len(drains) == 1
        assert "preflight_ecc_mode" in drains[0].body["payload"]["reason"]
        assert set(bed.service.dispatcher.drained) == {"gpu-02"}
        # show reads the journal and exits by the verdict too
        code, text = await run_cli(bed, "show")
        assert code == 1
        assert "gpu-02" in text
        # history lists the run with its whole summary in -o wide, cut to the width otherwise
        [run] = await bed.service.journal.do(lambda s: s.preflight.runs())
        code, wide = await run_cli(bed, "history", "-o", "wide")
        assert code == 0, wide
        [row] = [line for line in wide.splitlines() if line.startswith(run.id)]
        assert run.detail
        assert row.endswith(run.detail), (row, run.detail)
        _, narrow = await run_cli(bed, "history", "--node", "gpu-02")
        [row] = [line for line in narrow.splitlines() if line.startswith(run.id)]
        assert row.split()[1:4] == ["quick", "4", "fail"]
        assert row.endswith(cut(run.detail, "table"))
        _, elsewhere = await run_cli(bed, "history", "--node", "gpu-09", "--json")
        assert json.loads(elsewhere)["runs"] == []

    async def test_a_hold_past_the_drain_cap_waits_for_room(self, bed: Bed):
        """Two nodes fail and the cap (4 nodes x 0.1, at least 1) allows one drain: the second
        waits, and is drained once the first is released, like any rule's drain."""
        bed.cluster.nodes["gpu-01"].gpus[0].ecc_mode = 0
        bed.cluster.nodes["gpu-02"].gpus[0].ecc_mode = 0
        code, _ = await run_cli(bed, "run", "--level", "quick")
        assert code == 1
        await wait_until(lambda: len(bed.service.dispatcher.drained) == 1, what="one drain")
        assert len(bed.service.dispatcher.waiting) == 1
        (first,) = bed.service.dispatcher.drained
        path = f"/api/v1/drains/{first}/release"
        status, _ = await asyncio.to_thread(api, bed.service, "POST", path, {"reason": "fixed"})
        assert status == 200
        second = ({"gpu-01", "gpu-02"} - {first}).pop()
        await wait_until(
            lambda: second in bed.service.dispatcher.drained, what="the waiting drain ran"
        )
        drains = [d for d in bed.receiver.deliveries() if d.body["kind"] == "drain_request"]
        assert [d.body["payload"]["node"] for d in drains] == [first, second]

    async def test_release_can_require_a_passing_quick_run(self, bed: Bed):
        bed.cluster.nodes["gpu-04"].gpus[0].persistence_mode = 0
        code, _ = await run_cli(bed, "run", "--level", "quick", "--nodes", "gpu-04")
        assert code == 1
        await wait_until(lambda: "gpu-04" in bed.service.dispatcher.drained, what="drained")
        body = {"reason": "fixed", "require_preflight": True}
        path = "/api/v1/drains/gpu-04/release"
        status, answer = await asyncio.to_thread(api, bed.service, "POST", path, body)
        assert status == 409
        assert "has not passed" in answer["error"]
        bed.cluster.nodes["gpu-04"].gpus[0].persistence_mode = 1
        code, _ = await run_cli(bed, "run", "--level", "quick", "--nodes", "gpu-04")
        assert code == 0
        status, answer = await asyncio.to_thread(api, bed.service, "POST", path, body)
        assert status == 200, answer
        assert "gpu-04" not in bed.service.dispatcher.drained

    async def test_a_pass_from_before_a_rule_drained_the_node_does_not_release_it(self, bed: Bed):
        """gpu-01 passes, then loses a GPU and the gpu_lost rule drains it: the earlier pass
        does not count, the release asking for pre-flight is refused."""
        code, _ = await run_cli(bed, "run", "--level", "quick", "--nodes", "gpu-01")
        assert code == 0
        bed.cluster.nodes["gpu-01"].xid(3, 79)
        await wait_until(lambda: "gpu-01" in bed.service.dispatcher.drained, what="drained")
        body = {"reason": "repaired", "require_preflight": True}
        path = "/api/v1/drains/gpu-01/release"
        status, answer = await asyncio.to_thread(api, bed.service, "POST", path, body)
        assert status == 409, answer
        assert "gpu-01" in bed.service.dispatcher.drained

    async def test_a_node_that_is_not_connected_could_not_run(self, bed: Bed):
        """An agent gone: its checks could not run, naming the node; exit 2, never a pass."""
        await bed.cluster.crash("gpu-03")
        await wait_until(
            lambda: bed.service.grpc.registry.session("gpu-03") is None, what="stream gone"
        )
        code, text = await run_cli(bed, "run", "--level", "quick")
        assert code == 2, text
        assert "node gpu-03 is not connected" in text
        run = (await bed.service.journal.do(lambda s: s.preflight.runs()))[0]
        assert run.verdict == "could_not_run"
        assert run.node_verdicts is not None
        assert run.node_verdicts["gpu-03"] == "could_not_run"
        assert run.node_verdicts["gpu-01"] == "pass"

    async def test_a_node_that_never_answers_could_not_run(self, bed: Bed):
        """A tool that hangs past the round's time: the node is could_not_run, the rest pass."""
        bed.figures["gpu-01"].hang = threading.Event()
        bed.service.preflight.times = PlanTimes(quick_s=20, node_bandwidth_s=2)
        bed.service.preflight.answer_margin_s = 1.0
        code, text = await run_cli(bed, "run", "--level", "standard")
        assert code == 2, text
        run = (await bed.service.journal.do(lambda s: s.preflight.runs()))[0]
        assert run.node_verdicts is not None
        assert run.node_verdicts["gpu-01"] == "could_not_run"
        assert run.node_verdicts["gpu-02"] == "pass"
        rows = await bed.service.journal.do(lambda s: s.preflight.results(run.id))
        errors = {r.error for r in rows if r.node == "gpu-01" and r.check == "p2p_bw"}
        assert any("gpu-01" in e for e in errors), errors

    async def test_a_node_running_a_job_refuses(self, bed: Bed):
        """Compute processes on a GPU: the agent refuses the task; could_not_run, exit 2."""
        bed.cluster.nodes["gpu-04"].gpus[2].processes = [4242]
        code, text = await run_cli(bed, "run", "--level", "quick")
        assert code == 2, text
        assert "a job is running here" in text
        assert bed.cluster.agents["gpu-04"].link._preflight is not None
        assert bed.cluster.agents["gpu-04"].link._preflight.refused["job_running"] == 1

    async def test_a_low_gpu_pair_is_localised_to_the_pair(self, bed: Bed):
        bed.figures["gpu-02"] = bed.figures.get("gpu-02", Fixed())
        bed.figures["gpu-02"].low_pairs[3, 6] = 120.0
        code, _ = await run_cli(bed, "run", "--level", "standard")
        assert code == 1
        run = (await bed.service.journal.do(lambda s: s.preflight.runs()))[0]
        blamed = [(s["kind"], s["node"], s["component"]) for s in run.suspects or []]
        assert ("gpu_pair", "gpu-02", "gpu:3-gpu:6") in blamed
        assert run.node_verdicts is not None
        assert [n for n, v in run.node_verdicts.items() if v == "fail"] == ["gpu-02"]


class TestFull:
    async def test_full_runs_ib_pairs_collective_and_ladder(self, bed: Bed):
        code, text = await run_cli(bed, "run", "--level", "full")
        assert code == 0, text
        run = (await bed.service.journal.do(lambda s: s.preflight.runs()))[0]
        rows = await bed.service.journal.do(lambda s: s.preflight.results(run.id))
        rails = {r.component for r in rows if r.check == "ib_write_bw"}
        # 4 nodes in a ring: 4 pairs, 8 rails each
        assert len(rails) == 4 * 8
        eff = sorted((r.component, r.value) for r in rows if r.check == "ladder_efficiency")
        assert eff == [("nodes:2", 1.0), ("nodes:4", 1.0)]
        assert any(r.check == "allreduce_multi" and r.verdict == "pass" for r in rows)


class TestBisection:
    async def test_an_unexplained_slow_all_reduce_is_bisected_to_the_slow_half(self, bed: Bed):
        """Only collectives with gpu-03 are slow and nothing else fails: one bisection round runs
        both halves at once and names the half with gpu-03; no node is held out for it."""
        bed.figures["gpu-03"].multi_busbw = 150.0
        code, text = await run_cli(bed, "run", "--level", "full")
        assert code == 1, text
        run = (await bed.service.journal.do(lambda s: s.preflight.runs()))[0]
        found = {s["kind"]: s for s in run.suspects or []}
        assert found["bisection"]["nodes"] == ["gpu-03", "gpu-04"]
        assert "after 1 bisection rounds" in found["bisection"]["reason"]
        assert "unexplained" in found
        assert set((run.node_verdicts or {}).values()) == {"pass"}
        assert "bisection" in text
        assert bed.receiver.deliveries() == []


class TestAgentStaysResponsive:
    async def test_events_flow_while_a_task_measures(self, bed: Bed):
        """While gpu-03's pair test is held, an Xid on gpu-03 still reaches the journal: the
        task runs on a thread of its own, the agent's loop polls and streams meanwhile."""
        figures = bed.figures["gpu-03"]
        figures.hang = threading.Event()
        run = asyncio.ensure_future(bed.service.preflight.run("standard", "gpu-03"))
        await asyncio.to_thread(figures.entered.wait, 30)
        bed.cluster.nodes["gpu-03"].xid(1, 13)
        await wait_until(
            lambda: [r.xid for r in bed.service.reader.events(node="gpu-03")] == [13],
            what="the Xid journaled while the task runs",
        )
        assert not run.done()
        figures.hang.set()
        row = await run
        assert row.verdict == "pass"


class TestHostileAndCutShort:
    async def test_hostile_results_are_refused_and_counted_and_never_pass(self, bed: Bed):
        """A rogue agent answers its task with a NaN, an unknown check and a result for a task
        never sent to it: each is refused and counted by reason, its stream stays open, what
        it sent that was fine is judged, and what it left out could not run."""
        import grpc  # noqa: PLC0415

        from fleetwatch.wire import settings  # noqa: PLC0415
        from fleetwatch.wire.v1 import fleetwatch_pb2 as pb  # noqa: PLC0415

        service = bed.service
        port = service.grpc_port
        hello = pb.Hello(node="rogue-1", boot_id="b-1", protocol_version=1)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call: grpc.aio.StreamStreamCall[bytes, bytes] = channel.stream_stream(
                settings.STREAM_METHOD,
            )()
            await call.write(pb.AgentMessage(hello=hello).SerializeToString())
            await wait_until(
                lambda: service.grpc.registry.session("rogue-1") is not None, what="rogue in"
            )
            run = asyncio.ensure_future(service.preflight.run("quick", "rogue-1"))
            task = None
            while task is None:
                raw = await call.read()
                assert isinstance(raw, bytes)
                message = pb.CollectorMessage.FromString(raw)
                if message.WhichOneof("body") == "preflight_task":
                    task = message.preflight_task
            stray = pb.PreflightResult(run_id=task.run_id, task_id="pf-other.task")
            answer = pb.PreflightResult(
                run_id=task.run_id,
                task_id=task.task_id,
                measurements=[
                    pb.PreflightMeasurement(
                        check="ecc_mode", component="gpu:0", value=float("nan")
                    ),
                    pb.PreflightMeasurement(check="rm_rf", component="node", value=1),
                    pb.PreflightMeasurement(check="driver_version", component="node", text="570.1"),
                ],
            )
            for result in (stray, answer):
                await call.write(pb.AgentMessage(preflight_result=result).SerializeToString())
            row = await run
            assert service.grpc.registry.session("rogue-1") is not None  # not thrown off
            await call.done_writing()
        refused = dict(service.stats.preflight_refused)
        assert refused == {"unknown_task": 1, "bad_value": 1, "unknown_check": 1}
        assert row.verdict == "could_not_run"  # gpu_count never came
        rows = await service.journal.do(lambda s: s.preflight.results(row.id))
        assert {(r.check, r.verdict) for r in rows} == {
            ("driver_version", "pass"),
            ("gpu_count", "could_not_run"),
        }
        status, text = await asyncio.to_thread(api_text, service, "/metrics")
        assert status == 200
        assert 'fleetwatch_preflight_results_refused_total{reason="bad_value"} 1.0' in text

    async def test_a_run_cut_short_is_journaled_as_could_not_run(self, bed: Bed):
        """The collector stops mid-run (a tool hangs): the run is journaled could_not_run, cut
        short, never pass; a run left running by a collector that died is closed at start."""
        bed.figures["gpu-02"].hang = threading.Event()
        plan = await bed.service.preflight.submit("standard", "all")
        await wait_until(
            lambda: bed.service.preflight.live[plan.run_id].round_index == 1, what="round 2"
        )
        await bed.service.preflight.stop()
        row = await bed.service.journal.do(lambda s: s.preflight.run(plan.run_id))
        assert row is not None
        assert row.verdict == "could_not_run"
        assert "cut short" in row.detail
        assert set((row.node_verdicts or {}).values()) == {"could_not_run"}
        # a run row left unfinished (its collector died) is closed by the next start
        from collector.store.preflight import RunRow  # noqa: PLC0415

        orphan = RunRow("pf-orphan-1", "quick", ("gpu-01",), 1, collector=bed.service.peers.name)
        await bed.service.journal.do(lambda s: s.preflight.start_run(orphan))
        await bed.service.preflight.start()
        closed = await bed.service.journal.do(lambda s: s.preflight.run("pf-orphan-1"))
        assert closed is not None
        assert closed.verdict == "could_not_run"


class TestApiGuards:
    async def test_a_run_is_a_change_guarded_like_the_others(self, bed: Bed):
        """A page of another origin, or a form, starts no run (refused and counted); a bad level
        or an unknown node is a 400 naming it; the CLI's JSON from loopback starts one."""
        from tests.integration.raw_http import request  # noqa: PLC0415

        port = bed.service.http_port
        body = '{"level": "quick", "nodes": "all"}'
        evil = {"Content-Type": "application/json", "Origin": "https://evil.example"}
        answer = await asyncio.to_thread(request, port, "POST", "/api/v1/preflight", body, evil)
        assert answer.status == 403
        form = {"Content-Type": "application/x-www-form-urlencoded"}
        answer = await asyncio.to_thread(request, port, "POST", "/api/v1/preflight", body, form)
        assert answer.status == 415
        assert await bed.service.journal.do(lambda s: s.preflight.runs()) == []
        assert sum(bed.service.stats.api_refused.values()) == 2
        status, answer_json = await asyncio.to_thread(
            api, bed.service, "POST", "/api/v1/preflight", {"level": "deep"}
        )
        assert status == 400
        assert "level" in answer_json["error"]
        status, answer_json = await asyncio.to_thread(
            api, bed.service, "POST", "/api/v1/preflight", {"nodes": "gpu-[01-09]"}
        )
        assert status == 400
        assert "gpu-05" in answer_json["error"]
        status, answer_json = await asyncio.to_thread(
            api, bed.service, "POST", "/api/v1/preflight", {"level": "quick", "nodes": "gpu-01"}
        )
        assert status == 202
        run_id = answer_json["run_id"]
        await wait_until(lambda: run_id not in bed.service.preflight.live, what="the run to finish")
