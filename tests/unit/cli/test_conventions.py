"""The options every command takes the same way, the output modes, --watch (cli.conventions,
cli.output), and how jobs read in a table."""

import io
import json
from typing import Any, ClassVar

import pytest

from cli import api as cli_api
from cli import conventions
from cli.main import _parser
from cli.output import WIDTH, cut, gpu_names, watch

UUID = "GPU-0a1b2c3d-0000-1111-2222-333344445555"


def parse(*argv: str, environ: dict[str, str] | None = None):
    return conventions.parse(_parser(), list(argv), environ or {})


class TestSharedOptions:
    def test_api_and_output_before_or_after_the_command_mean_the_same(self):
        """``fleetwatch --api U -o json incidents`` and ``fleetwatch incidents --json --api U``;
        a subcommand's own default never replaces what was typed before it."""
        before = parse("--api", "http://c:1", "-o", "json", "incidents", "--node", "n1")
        after = parse("incidents", "--node", "n1", "--json", "--api", "http://c:1")
        for args in (before, after):
            got = (args.api, args.output, args.json, args.node)
            assert got == ("http://c:1", "json", True, "n1")
        nested = parse("--api", "http://c:1", "silence", "list")
        assert nested.api == "http://c:1"
        deeper = parse("drains", "release", "n1", "--api", "http://c:2", "--token-file", "/t")
        assert (deeper.api, str(deeper.token_file)) == ("http://c:2", "/t")

    def test_defaults_come_from_the_environment_and_table(self):
        args = parse("nodes", environ={"FLEETWATCH_API": "http://env:9"})
        assert (args.api, args.output, args.json, args.token_file) == (
            "http://env:9",
            "table",
            False,
            None,
        )
        assert parse("nodes", "-o", "wide").output == "wide"
        assert parse("--log-level", "debug", "nodes").log_level == "debug"
        assert parse("nodes", "--log-level", "debug").log_level == "debug"

    def test_every_api_command_takes_the_shared_options_and_the_daemons_do_not_print_json(self):
        parser = _parser()
        for path, each in conventions._walk(parser):
            if path and path[0] in conventions.API_COMMANDS:
                flags = each._option_string_actions
                assert {"--api", "--token-file", "-o", "--json"} <= set(flags), path
        with pytest.raises(SystemExit):
            parse("agent", "-o", "json")

    def test_an_unknown_option_shows_the_commands_own_usage(self, capsys):
        with pytest.raises(SystemExit) as exit_:
            parse("silence", "add", "--node", "n1", "--duration", "1h", "--frob")
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("usage: fleetwatch silence add "), err
        assert "unrecognized arguments: --frob" in err

    def test_no_option_is_an_abbreviation_of_another(self, capsys):
        """``--node`` on ``preflight run`` is a node of its own, repeatable, never ``--nodes``;
        ``--nod`` or ``--dur`` are unknown options, not guesses."""
        from cli.preflight import _nodes  # noqa: PLC0415

        args = parse("preflight", "run", "--node", "node-04", "--node", "node-03")
        assert (args.nodes, args.node) == ("all", ["node-04", "node-03"])
        assert _nodes(args.nodes, args.node) == "node-04,node-03"
        both = parse("preflight", "run", "--nodes", "gpu-[01-02]", "--node", "node-9")
        assert _nodes(both.nodes, both.node) == "gpu-[01-02],node-9"
        assert _nodes("all", []) == "all"
        with pytest.raises(SystemExit):
            parse("incidents", "--nod", "n1")
        assert "unrecognized arguments: --nod n1" in capsys.readouterr().err
        with pytest.raises(SystemExit):
            parse("silence", "add", "--all", "--dur", "1h")
        assert "required: --duration" in capsys.readouterr().err

    def test_help_shows_examples_and_no_restructuredtext(self, capsys):
        with pytest.raises(SystemExit):
            parse("incidents", "--help")
        text = capsys.readouterr().out
        assert "examples:\n  fleetwatch incidents " in text
        assert "--since WHEN" in text
        with pytest.raises(SystemExit):
            parse("--help")
        top = capsys.readouterr().out
        assert "``" not in top
        assert "config check" in top

    def test_watch_is_on_the_lists_only(self):
        assert parse("incidents", "--watch").watch == conventions.DEFAULT_WATCH_S
        assert parse("events", "--watch", "5").watch == 5.0
        assert parse("nodes").watch is None
        with pytest.raises(SystemExit):
            parse("silence", "add", "--all", "--duration", "1h", "--watch")


def test_rules_check_and_test_speak_json_with_o_json(capsys, tmp_path):
    """``rules check -o json``: ok and the rule names; a broken file: ok false and the
    problems, exit 1; ``rules test -o json``: passed and failed counts."""
    from cli.main import main  # noqa: PLC0415

    assert main(["rules", "check", "-o", "json"]) == 0
    checked = json.loads(capsys.readouterr().out)
    assert checked["ok"] is True
    assert "gpu_lost" in checked["rules"]
    broken = tmp_path / "broken.yaml"
    broken.write_text("version: 1\nrules:\n  - name: x\n    scope: nowhere\n")
    assert main(["rules", "check", str(broken), "--json"]) == 1
    bad = json.loads(capsys.readouterr().out)
    assert bad["ok"] is False
    assert bad["problems"]
    # One test of the built-in rules (all of them run in test_rule_tests.py), then one failing.
    one = tmp_path / "one_test.yaml"
    one.write_text(
        "rule_files: [builtin]\ntests:\n  - name: an application Xid notifies\n"
        "    nodes: {node-01: {gpus: 2, ib_ports: 1}}\n    steps:\n"
        "      - {at: 0s, event: {node: node-01, kind: xid, gpu: 0, xid: 13}}\n"
        "    expect:\n      - at: 2s\n        firing: [xid_application_error@node-01/gpu/0]\n"
    )
    assert main(["rules", "test", str(one), "-o", "json"]) == 0
    tested = json.loads(capsys.readouterr().out)
    assert (tested["ok"], tested["passed"], tested["failed"]) == (True, 1, 0)
    assert len(tested["tests"]) == 1
    one.write_text(one.read_text().replace("xid_application_error@", "gpu_lost@"))
    assert main(["rules", "test", str(one), "-o", "json"]) == 1
    tested = json.loads(capsys.readouterr().out)
    assert (tested["ok"], tested["passed"], tested["failed"]) == (False, 0, 1)


class TestOutput:
    def test_table_cuts_text_and_wide_does_not(self):
        text = "x" * (WIDTH + 10)
        assert len(cut(text, "table")) == WIDTH
        assert cut(text, "table").endswith("\N{HORIZONTAL ELLIPSIS}")
        assert cut(text, "wide") == text
        assert cut("short", "table") == "short"

    def test_gpus_are_named_by_index_and_by_uuid_too_when_wide(self):
        text = f"{UUID} fell off the bus; {UUID[:-1]}9 too"
        indexes = {UUID: 3}
        assert gpu_names(text, indexes, "table").startswith("GPU 3 fell off the bus")
        assert gpu_names(text, indexes, "wide").startswith(f"GPU 3 ({UUID}) fell off")
        assert f"{UUID[:-1]}9 too" in gpu_names(text, indexes, "table")  # unknown: as it is
        assert gpu_names(f"GPU 3 {UUID}", indexes, "table") == "GPU 3"  # said once, not twice
        assert gpu_names(f"GPU {UUID} link 7", indexes, "table") == "GPU 3 link 7"

    def test_watch_prints_each_round_whole_until_interrupted(self):
        out = io.StringIO()
        calls: list[int] = []
        slept: list[float] = []

        def run() -> int:
            calls.append(1)
            print(f"round {len(calls)}")  # noqa: T201 - what a command prints
            return 0

        assert watch(run, 3.0, out, sleep=slept.append, rounds=2) == 0
        text = out.getvalue()
        assert text.count("every 3 s, ") == 2
        assert "round 1\n" in text
        assert "round 2\n" in text
        assert slept == [3.0]

        def interrupted(_s: float) -> None:
            raise KeyboardInterrupt

        assert watch(run, 1.0, io.StringIO(), sleep=interrupted) == 0
        assert watch(lambda: 2, 1.0, io.StringIO(), sleep=slept.append) == 2
        with pytest.raises(ValueError, match="positive"):
            watch(run, 0.0, io.StringIO())


class TestJobsRead:
    JOB: ClassVar[dict[str, Any]] = {
        "id": "j",
        "state": "running",
        "active": True,
        "gpus": 8,
        "ranks_missing": 0,
        "step": 120,
        "tokens_per_s": 52000.0,
        "mfu": 0.43,
        "ettr": 0.97,
        "straggler_nodes": [],
        "drop": False,
        "drop_share": 0.0,
        "drop_cause": None,
        "checkpoint_age_s": 0,
        "checkpoint_interval_s": 0,
        "silent_s": 2.0,
        "step_time_s": 1.5,
    }

    def test_a_job_without_a_step_for_a_while_is_stalled_not_at_its_last_pace(self):
        row = cli_api._job_row(self.JOB, 0.0)
        assert (row[1], row[5], row[6]) == ("running", "52,000", "43.0%")
        still = cli_api._job_row({**self.JOB, "silent_s": 40.0}, 0.0)
        assert (still[1], still[5], still[6]) == ("stalled 40s", "-", "-")
        hung = cli_api._job_row({**self.JOB, "state": "hung", "silent_s": 400.0}, 0.0)
        assert hung[1] == "hung"

    def test_an_mfu_no_gpu_reaches_is_flagged_as_a_reporting_mistake(self):
        out = io.StringIO()
        job = {**self.JOB, "mfu": 3.1}
        assert cli_api._job_row(job, 0.0)[6] == "310.0%!"
        cli_api._job_notes([job, self.JOB], out)
        assert "MFU over 100% (j): a reporting mistake" in out.getvalue()
        quiet = io.StringIO()
        cli_api._job_notes([self.JOB], quiet)
        assert quiet.getvalue() == ""


def test_every_example_in_the_help_parses_and_names_real_rules():
    """An example that does not parse, or silences a rule that does not exist, teaches wrong."""
    import shlex  # noqa: PLC0415

    from rules.loader import load_rules  # noqa: PLC0415

    names = {r.name for r in load_rules().rules}
    for path, text in conventions.EXAMPLES.items():
        for line in text.splitlines():
            command = line.strip().split("  ")[0].split(" | ")[0]
            argv = shlex.split(command)
            assert argv[0] == "fleetwatch", (path, line)
            args = parse(*argv[1:])
            assert conventions.command_path(_parser(), args)[: len(path)] == path, line
            rule = getattr(args, "rule", None)
            assert rule is None or rule in names, (path, line)
