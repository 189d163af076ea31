"""`fleetwatch incidents`, `actions` and `silence` against a real collector's API."""

import asyncio
import json
import os
import pwd

import pytest

from cli.main import main
from fleetwatch.testing import wait_until
from tests.integration.fleet_harness import actions, start

pytestmark = pytest.mark.integration


async def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = await asyncio.to_thread(main, list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


class TestCliTools:
    async def test_incidents_and_actions_show_a_drained_node(self, running, capsys):
        """After an Xid 79, `fleetwatch incidents` lists the firing gpu_lost incident with its
        evidence and `fleetwatch actions --node` the drain that ran and its outcome."""
        service, cluster = running
        api = f"--api=http://127.0.0.1:{service.http_port}"
        code, out, _ = await cli(capsys, "incidents", api)
        assert (code, out.strip()) == (0, "no open incidents")
        cluster.nodes["node-2"].xid(3, 79)
        await wait_until(lambda: "node-2" in service.dispatcher.drained, what="drain")
        code, out, _ = await cli(capsys, "incidents", api)
        assert code == 0
        lines = out.splitlines()
        assert lines[0].split()[:4] == ["PHASE", "SEVERITY", "RULE", "TARGET"]
        gpu_lost = [line for line in lines if " gpu_lost " in line]
        assert gpu_lost
        assert gpu_lost[0].split()[:4] == ["firing", "critical", "gpu_lost", "node-2/gpu/3"]
        code, out, _ = await cli(capsys, "actions", api, "--node", "node-2")
        assert code == 0
        drains = [line.split() for line in out.splitlines() if " drain_node " in line]
        assert drains
        assert "succeeded" in drains[0]
        code, out, _ = await cli(capsys, "actions", api, "--node", "node-1")
        assert out.strip() == "no actions"

    async def test_silence_add_list_remove(self, running, capsys):
        """A maintenance window added from the CLI is listed with its reason and can be ended."""
        service, _ = running
        api = f"--api=http://127.0.0.1:{service.http_port}"
        code, out, _ = await cli(
            capsys,
            "silence",
            api,
            "add",
            "--node=node-4",
            "--duration=2h",
            "--starts-in=1h",
            "--reason=cable swap",
        )
        assert code == 0
        silence_id = int(out.split()[1])
        code, out, _ = await cli(capsys, "silence", api, "list")
        row = next(line for line in out.splitlines() if line.startswith(str(silence_id)))
        assert row.split()[1:3] == ["node-4", "*"]
        assert "in 1h" in row
        assert row.endswith("cable swap")
        by = out.splitlines()[0].index(" BY ") + 1
        assert row[by:].startswith(f"user {pwd.getpwuid(os.getuid()).pw_name}"), row  # the kernel's
        code, out, _ = await cli(capsys, "silence", api, "remove", str(silence_id))
        assert (code, out.strip()) == (0, f"silence {silence_id} removed")
        code, out, _ = await cli(capsys, "silence", api, "list")
        assert out.strip() == "no silences"

    async def test_bad_silence_and_missing_silence_are_errors(self, running, capsys):
        """The API's refusal reaches the user as a one-line error and exit status 2."""
        service, _ = running
        api = f"--api=http://127.0.0.1:{service.http_port}"
        code, _, err = await cli(capsys, "silence", api, "add", "--node=node-1", "--duration=soon")
        assert code == 2
        assert "400" in err
        assert "duration" in err
        code, _, err = await cli(capsys, "silence", api, "add", "--duration=2h")
        assert code == 2
        assert "needs --node, --rule or both; --all silences every rule" in err
        code, _, err = await cli(capsys, "silence", api, "add", "--node=node-9", "--duration=2h")
        assert (code, "400" in err, "node-9" in err) == (2, True, True), err
        code, out, _ = await cli(capsys, "silence", api, "add", "--all", "--duration=1m")
        assert code == 0
        assert "every rule on every node" in out
        code, _, err = await cli(capsys, "silence", api, "remove", "999")
        assert code == 2
        assert "no silence 999" in err

    async def test_options_go_anywhere_and_every_list_filters(self, running, capsys):
        """--api and -o json may come before or after the command; --node narrows incidents
        and --since/--until every list; an incident carries its rule's description and runbook
        in the table and the JSON."""
        service, cluster = running
        url = f"http://127.0.0.1:{service.http_port}"
        cluster.nodes["node-2"].xid(3, 79)
        await wait_until(lambda: "node-2" in service.dispatcher.drained, what="drain")
        before = await cli(capsys, "--api", url, "-o", "json", "incidents", "--node", "node-2")
        after = await cli(capsys, "incidents", "--node=node-2", "--json", "--api", url)
        assert before[0] == after[0] == 0
        first, second = json.loads(before[1]), json.loads(after[1])
        assert [i["id"] for i in first["incidents"]] == [i["id"] for i in second["incidents"]]
        assert first["incidents"]
        assert {i["node"] for i in first["incidents"]} == {"node-2"}
        lost = next(i for i in first["incidents"] if i["rule"] == "gpu_lost")
        assert lost["description"]
        assert "runbook" in lost
        _, other, _ = await cli(capsys, "incidents", "--node", "node-1", "--api", url)
        assert other.strip() == "no open incidents"
        _, table, _ = await cli(capsys, "incidents", "--api", url)
        assert "\nrules:\n" in table
        assert any(line.startswith("  gpu_lost: ") for line in table.splitlines())
        for command in ("incidents", "actions", "events"):
            _, out, _ = await cli(capsys, command, "--since", "1h", "-o", "json", "--api", url)
            assert json.loads(out)[command], command
            code, out, err = await cli(
                capsys, command, "--until", "2000-01-01", "-o", "json", "--api", url
            )
            assert (code, json.loads(out)[command]) == (0, []), (command, err)
        code, _, err = await cli(capsys, "incidents", "--since", "yesterday-ish", "--api", url)
        assert code == 2
        assert "since" in err

    async def test_rules_eval_says_what_would_fire_and_changes_nothing(
        self, running, capsys, tmp_path
    ):
        """After an Xid 79 on node-2: ``rules eval`` shows the running gpu_lost firing there;
        a new rule file shows its rule would fire on that GPU with a drain and a notify the
        limits would let run, and nothing new is journaled; a broken file is the API's 400."""
        service, cluster = running
        url = f"http://127.0.0.1:{service.http_port}"
        cluster.nodes["node-2"].xid(3, 79)
        await wait_until(lambda: "node-2" in service.dispatcher.drained, what="drain")
        code, out, err = await cli(capsys, "rules", "eval", "--api", url)
        assert code == 0, err
        assert "nothing was changed" in out.splitlines()[0]
        [lost] = [line for line in out.splitlines() if line.startswith("gpu_lost ")]
        assert lost.split()[1:3] == ["node-2/gpu/3", "firing"], out
        # The evidence names the GPU by index; -o wide gives its UUID beside.
        assert "GPU 3" in lost
        assert "GPU-" not in lost
        _, wide, _ = await cli(capsys, "rules", "eval", "-o", "wide", "--api", url)
        [lost] = [line for line in wide.splitlines() if line.startswith("gpu_lost ")]
        assert "GPU 3 (GPU-" in lost, wide
        # What the limits hold back names its rule (two rules may hold one target).
        assert "  gpu_lost: drain_node on node-2/gpu/3: skipped: node-2 is already drained" in out
        new = tmp_path / "new.yaml"
        new.write_text(
            "version: 1\nrules:\n  - name: lost_gpu_new\n    scope: gpu\n"
            "    when: '!gpu.present'\n    severity: critical\n    actions: [notify]\n"
        )
        before = await service.journal.do(lambda s: s.incidents.actions())
        code, out, err = await cli(
            capsys, "rules", "eval", "--file", str(new), "-o", "json", "--api", url
        )
        assert code == 0, err
        answer = json.loads(out)
        (hold,) = answer["holds"]
        assert (hold["rule"], hold["target"], hold["state"]) == (
            "lost_gpu_new",
            "node-2/gpu/3",
            "would fire",
        )
        assert [(a["action"], a["outcome"]) for a in hold["actions"]] == [("notify", "would run")]
        assert len(await service.journal.do(lambda s: s.incidents.actions())) == len(before)
        assert "lost_gpu_new" not in {i.rule for i in service.evaluator.engine.open_incidents()}
        new.write_text("version: 1\nrules:\n  - name: x\n    scope: nowhere\n")
        code, _, err = await cli(capsys, "rules", "eval", "--file", str(new), "--api", url)
        assert code == 2
        assert "400" in err
        assert "do not load" in err


async def test_release_makes_room_for_a_waiting_drain(collector_config, receiver, tmp_path, capsys):
    """A node drained by fleetwatch and resumed by hand holds its place under the cap until a
    person releases it; then the drain that waited runs."""
    acts = actions(receiver, tmp_path, max_drained_nodes=1, max_drained_share=1.0)
    service, cluster = await start(collector_config, tmp_path, acts)
    api = f"--api=http://127.0.0.1:{service.http_port}"
    try:
        cluster.nodes["node-1"].xid(0, 79)
        await wait_until(lambda: "node-1" in service.dispatcher.drained, what="first drain")
        cluster.nodes["node-2"].xid(0, 79)
        await wait_until(lambda: len(service.dispatcher.waiting) == 1, what="waiting drain")
        code, out, _ = await cli(capsys, "drains", api)
        assert code == 0
        assert out.splitlines()[0] == "1 of at most 1 drained by fleetwatch, 1 drains waiting"
        assert out.splitlines()[2].split()[0] == "node-1"
        code, out, _ = await cli(capsys, "drains", api, "release", "node-1", "--reason=fixed")
        assert (code, out.split()[:2]) == (0, ["node-1", "released:"])
        await wait_until(lambda: "node-2" in service.dispatcher.drained, what="waiting drain ran")
        rows = await service.journal.do(lambda s: s.incidents.actions(node="node-1"))
        assert ("release_node", "succeeded", "released by a person: fixed") in {
            (r.action, r.state, r.detail) for r in rows
        }
        code, _, err = await cli(capsys, "drains", api, "release", "node-3")
        assert code == 2
        assert "holds no drain of 'node-3'" in err
    finally:
        await cluster.stop()
        await service.stop(grace=None)


async def test_a_release_ends_the_node_cooldown(collector_config, receiver, tmp_path, capsys):
    """A node drained, repaired and released by a person: a new fault a minute later drains it
    again. The drain cooldown (5 minutes) skipped it as "cooldown" before (issue 43)."""
    service, cluster = await start(collector_config, tmp_path, actions(receiver, tmp_path))
    api = f"--api=http://127.0.0.1:{service.http_port}"
    try:
        cluster.nodes["node-1"].xid(0, 79)
        await wait_until(lambda: "node-1" in service.dispatcher.drained, what="first drain")
        code, _, _ = await cli(capsys, "drains", api, "release", "node-1", "--reason=GPU 0 swapped")
        assert code == 0
        cluster.nodes["node-1"].xid(3, 79)

        async def drains() -> list[tuple[str, str, str]]:
            rows = await service.journal.do(lambda s: s.incidents.actions(node="node-1"))
            return [(r.target, r.state, r.detail) for r in rows if r.action == "drain_node"]

        async def second_decided() -> bool:
            return any(t == "node-1/gpu/3" and s != "planned" for t, s, _ in await drains())

        await wait_until(second_decided, what="the second fault's drain decided")
        (second,) = [d for d in await drains() if d[0] == "node-1/gpu/3"]
        assert second[1] == "succeeded", second
        assert service.dispatcher.drained["node-1"].startswith("gpu_lost:node-1/gpu/3")
        # The fleet-wide view (the journal, for collectors sharing it) agrees.
        fleet = await service.journal.do(lambda s: s.incidents.fleet_actions(0))
        assert fleet.drained["node-1"].startswith("gpu_lost:node-1/gpu/3")
    finally:
        await cluster.stop()
        await service.stop(grace=None)
