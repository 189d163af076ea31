"""A compromised node forges pre-flight results: real collector, real agents, one of them lying.

The lying node's agent answers its tasks with its real results plus forged ones (its executor's
answer is rewritten on the way out, as a node running altered software would). Neither forgery
may blame a healthy node: results for rails, GPUs or groups its plan never asked of it are
refused, each (check, component) counts once, and the node that sent them is the suspect.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import pytest

from fleetwatch.wire.v1 import fleetwatch_pb2 as pb
from tests.integration.preflight_bed import NODES, api_text, run_cli

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.integration.preflight_bed import Bed

pytestmark = pytest.mark.integration

LIAR = "gpu-04"
VICTIM = "gpu-01"


def forge(b: Bed, extra: Callable[[pb.PreflightTask], list[pb.PreflightMeasurement]]) -> None:
    """From now on the liar's answers carry ``extra(task)`` after its real results."""
    executor = b.cluster.agents[LIAR].link._preflight
    assert executor is not None
    honest = executor.run

    async def lying(task: pb.PreflightTask) -> pb.PreflightResult:
        result = await honest(task)
        result.measurements.extend(extra(task))
        return result

    executor.run = lying  # type: ignore[method-assign]


def drained(b: Bed) -> list[str]:
    return sorted(
        d.body["payload"]["node"]
        for d in b.receiver.deliveries()
        if d.body["kind"] == "drain_request"
    )


async def latest_run(b: Bed) -> tuple[dict[str, str], list[dict[str, object]]]:
    run = (await b.service.journal.do(lambda s: s.preflight.runs()))[0]
    return dict(run.node_verdicts or {}), list(run.suspects or [])


class TestForgedRails:
    async def test_rails_between_the_liar_and_a_victim_it_was_not_planned_on_blame_no_one_else(
        self,
        bed: Bed,
    ):
        """The liar reports two rails to the victim on an HCA that does not exist, at 1 Gb/s,
        as if the victim were slow with every partner: refused (not planned), the victim
        passes, and the liar is the one held out."""

        def rails(task: pb.PreflightTask) -> list[pb.PreflightMeasurement]:
            if not task.ib_tests:
                return []
            return [
                pb.PreflightMeasurement(
                    check="ib_write_bw", component=f"rail:evil/1:{a}-{b}", value=1.0, unit="Gb/s"
                )
                for a, b in ((LIAR, VICTIM), (VICTIM, LIAR))
            ]

        forge(bed, rails)
        code, text = await run_cli(bed, "run", "--level", "full")
        assert code == 1, text
        verdicts, suspects = await latest_run(bed)
        assert verdicts[LIAR] == "fail"
        assert all(verdicts[n] == "pass" for n in NODES if n != LIAR), verdicts
        assert [s["node"] for s in suspects] == [LIAR]
        assert "did not ask for" in str(suspects[0]["reason"])
        assert "evil" in str(suspects[0]["reason"])
        await_drains = [n for n in drained(bed) if n != LIAR]
        assert await_drains == []  # no healthy node drained
        status, metrics = await asyncio.to_thread(api_text, bed.service, "/metrics")
        assert status == 200
        forged_rails = 2 * sum(1 for pairs in bed.service.preflight.plan("full").ib_pairs
                               for pair in pairs if LIAR in pair)  # fmt: skip
        assert dict(bed.service.preflight.results_refused) == {"not_planned": forged_rails}
        assert (
            f'fleetwatch_preflight_results_refused_total{{reason="not_planned"}} {forged_rails}.0'
            in metrics
        )


class TestDuplicates:
    async def test_copies_of_one_figure_do_not_move_the_fleets_median(
        self,
        bed: Bed,
    ):
        """The liar sends 300 copies of its one-node rung at 3x its figure: only the first
        (check, component) counts, the honest nodes are judged against each other and pass."""

        def copies(task: pb.PreflightTask) -> list[pb.PreflightMeasurement]:
            if not any(g.check == "ladder_throughput" and len(g.nodes) == 1 for g in task.groups):
                return []
            fake = pb.PreflightMeasurement(
                check="ladder_throughput", component="nodes:1", value=3000.0, unit="samples/s"
            )
            return [fake] * 300

        forge(bed, copies)
        code, text = await run_cli(bed, "run", "--level", "full")
        verdicts, _ = await latest_run(bed)
        assert all(verdicts[n] == "pass" for n in NODES if n != LIAR), (verdicts, text)
        assert verdicts[LIAR] == "fail"  # its answer did not fit its plan
        assert code == 1
        assert [n for n in drained(bed) if n != LIAR] == []
        refused = dict(bed.service.preflight.results_refused)
        assert refused == {"duplicate": 300}
