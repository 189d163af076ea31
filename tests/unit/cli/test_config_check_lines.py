"""``fleetwatch config check`` lists every problem of a file at its line, with what to do.

An unknown key no longer hides the file's other problems; each problem names its line as the
collector's reload does; an unknown key gets the closest known one; every unreadable TLS file
is named; a collector whose rules drain or notify with nothing to carry it out is warned about.
"""

import json
from pathlib import Path

import pytest

from cli.main import main
from collector.config import CollectorConfig
from collector.reload import ConfigSource, ReloadError, read_candidate
from fleetwatch.testing import FakeClock
from tests.tls_pki import make_pki


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["config", "check", *args])
    out, err = capsys.readouterr()
    return code, out, err


def write(tmp_path: Path, text: str, name: str = "collector.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def problems(err: str) -> list[str]:
    return [line for line in err.splitlines() if ": warning: " not in line]


def warnings(err: str) -> list[str]:
    return [line for line in err.splitlines() if ": warning: " in line]


SINKS = (
    "[collector.actions.slurm]\nenabled = true\n"
    "[collector.actions.notify.default]\nurl = 'https://chat.example/hooks/abc'\n"
)


class TestEveryProblemAtItsLine:
    def test_an_unknown_key_hides_nothing(self, capsys, tmp_path: Path):
        """An unknown top-level key, a wrong value and an unknown key of [collector.actions]:
        three lines, each at its line (the unknown key was the only line before)."""
        path = write(
            tmp_path,
            "[collector]\n"
            "listen = '127.0.0.1:7070'\n"
            "listen_adress = '0.0.0.0:7070'\n"
            "missed_heartbeats = 2.5\n"
            "[collector.actions]\n"
            "max_drained_nodez = 2\n"
            f"{SINKS}",
        )
        code, out, err = run(capsys, str(path))
        assert (code, out) == (2, "")
        assert problems(err) == [
            f"{path}:3: collector config: unknown key listen_adress; did you mean listen?",
            f"{path}:4: config: missed_heartbeats must be an integer >= 1, got 2.5",
            (
                f"{path}:6: collector config: unknown key actions.max_drained_nodez; "
                "did you mean actions.max_drained_nodes?"
            ),
        ]

    def test_an_agent_file_lists_every_problem(self, capsys, tmp_path: Path):
        """A key above the table, an unknown key and two wrong values: four lines."""
        path = write(
            tmp_path,
            "poll = 3\n[agent]\npoll_intervall = 2\nheartbeat_interval = 0\ngpu_reset = 'yes'\n",
            "agent.toml",
        )
        code, _, err = run(capsys, "--agent", str(path))
        assert code == 2
        assert problems(err) == [
            (
                f"{path}:1: agent config: key poll outside the [agent] table (above it); "
                "move it into it"
            ),
            f"{path}:3: agent config: unknown key poll_intervall; did you mean poll_interval?",
            f"{path}:4: config: heartbeat_interval must be a number > 0, got 0",
            f"{path}:5: agent config: gpu_reset must be true or false, got 'yes'",
        ]

    def test_a_sub_table_problem_sets_the_table_aside(self, capsys, tmp_path: Path):
        """A wrong ``[agent.bmc]`` value and a wrong top-level one: both at their lines, and
        the Xid catalog is still read for the rest."""
        path = write(
            tmp_path,
            "[agent]\npoll_interval = 'x'\nxid_catalog = '/nonexistent/x.yaml'\n[agent.bmc]\n"
            "protocol = 'redfish'\naddress = '10.0.0.1'\nusername_file = '/u'\n"
            "password_file = '/p'\ninterval = -1\n",
            "agent.toml",
        )
        code, _, err = run(capsys, str(path))
        assert code == 2
        assert problems(err) == [
            f"{path}:2: config: poll_interval must be a number > 0, got 'x'",
            f"{path}:9: config: [agent.bmc] interval must be a number > 0, got -1",
            f"{path}: /nonexistent/x.yaml: cannot read the Xid catalog: No such file or directory",
        ]

    def test_the_keys_a_problem_names_go_aside_together(self, capsys, tmp_path: Path):
        """``tls_cert, tls_key, tls_ca go together`` sets aside what it names: no second line
        about the same keys, and no TLS check of a config that lacks them."""
        path = write(
            tmp_path,
            "[agent]\ncollector = 'fw.example:7070'\ntls_cert = '/x.pem'\ntls_key = '/x.key'\n"
            "counter_interval = -1\n",
            "agent.toml",
        )
        code, _, err = run(capsys, "--agent", str(path))
        assert code == 2
        assert problems(err) == [
            f"{path}:3: agent config: tls_cert, tls_key, tls_ca go together; tls_ca is missing",
            f"{path}:5: config: counter_interval must be a number > 0, got -1",
        ]

    def test_the_line_is_the_one_the_reload_names(self, capsys, tmp_path: Path):
        """The check and the collector's reload place a problem at the same line."""
        path = write(
            tmp_path, f"[collector]\nlisten = '127.0.0.1:0'\n\nrules_interval = 0\n{SINKS}"
        )
        with pytest.raises(ReloadError) as caught:
            read_candidate(ConfigSource(path), CollectorConfig(), {}, FakeClock())
        [reloaded] = caught.value.problems
        _, _, err = run(capsys, str(path))
        assert problems(err) == [str(reloaded)]
        assert str(reloaded).startswith(f"{path}:4: ")


class TestDidYouMean:
    @pytest.mark.parametrize(
        ("text", "message"),
        [
            ("[collector]\nrule_interval = 2\n", "rule_interval; did you mean rules_interval?"),
            (
                "[collector.actions.slurm]\nenabeld = true\n",
                "actions.slurm.enabeld; did you mean actions.slurm.enabled?",
            ),
            (
                "[collector.actions.notify.pager]\nurl = 'https://p.example/x'\nsecret_fil = 'x'\n",
                "actions.notify.pager.secret_fil; did you mean actions.notify.pager.secret_file?",
            ),
            (
                "[collector.jobs]\nstraggler_margn = 0.2\n",
                "jobs.straggler_margn; did you mean jobs.straggler_margin?",
            ),
            ("[agent]\nsysfs_rot = '/sys'\n", "sysfs_rot; did you mean sysfs_root?"),
            (
                "[agent.bmc]\nprotocl = 'ipmi'\n",
                "bmc.protocl; did you mean bmc.protocol?",
            ),
        ],
    )
    def test_the_closest_known_key_is_offered(self, capsys, tmp_path: Path, text, message):
        """An unknown key in any table gets the known key of that table nearest to it, at the
        key's line (the file's last)."""
        kind = "agent" if text.startswith("[agent") else "collector"
        path = write(tmp_path, text, f"{kind}.toml")
        code, _, err = run(capsys, f"--{kind}", str(path))
        assert code == 2
        line = text.count("\n")
        assert f"{path}:{line}: {kind} config: unknown key {message}" in err.splitlines()

    def test_a_key_like_none_lists_the_table(self, capsys, tmp_path: Path):
        """No close key: the message lists what the table takes instead."""
        path = write(tmp_path, "[collector.actions.slurm]\nzzz = 1\n")
        _, _, err = run(capsys, str(path))
        assert (
            f"{path}:2: collector config: unknown key actions.slurm.zzz; [collector.actions.slurm] "
            "takes enabled, requeue, scontrol, slurm_conf"
        ) in err.splitlines()


class TestEveryTlsFile:
    def test_the_collector_names_each_missing_file(self, capsys, tmp_path: Path):
        """Three missing TLS files: three lines, each at its key (the first only, before)."""
        path = write(
            tmp_path,
            "[collector]\nlisten = '0.0.0.0:7070'\n"
            "tls_cert = '/nonexistent/c.pem'\ntls_key = '/nonexistent/c.key'\n"
            f"tls_client_ca = '/nonexistent/ca.pem'\n{SINKS}",
        )
        code, _, err = run(capsys, str(path))
        assert code == 2
        why = "No such file or directory"
        assert problems(err) == [
            f"{path}:3: collector config: tls_cert /nonexistent/c.pem: {why}",
            f"{path}:4: collector config: tls_key /nonexistent/c.key: {why}",
            f"{path}:5: collector config: tls_client_ca /nonexistent/ca.pem: {why}",
        ]

    def test_a_malformed_named_token_file_names_its_line_never_a_token(
        self, capsys, tmp_path: Path
    ):
        tokens = tmp_path / "api.tokens"
        tokens.write_text("# on-call\nalice tok-alice-secret\nbob\n")
        tokens.chmod(0o600)
        path = write(
            tmp_path,
            f"[collector]\nlisten = '127.0.0.1:7070'\napi_token_file = '{tokens}'\n{SINKS}",
        )
        code, out, err = run(capsys, str(path))
        assert code == 2
        assert problems(err) == [
            (
                f"{path}:3: collector config: api_token_file {tokens}: line 3:"
                " expected NAME TOKEN, found 1 fields"
            )
        ]
        assert "tok-alice" not in out + err
        tokens.write_text("# on-call\nalice tok-alice-secret\nbob tok-bob-secret\n")
        assert run(capsys, str(path))[0] == 0

    def test_the_agent_names_each_unreadable_file(self, capsys, tmp_path: Path):
        """A good certificate, a key that is a directory and a missing CA: two lines."""
        pki = make_pki(tmp_path / "pki")
        (tmp_path / "key").mkdir()
        path = write(
            tmp_path,
            "[agent]\nnode = 'gpu-017'\ncollector = 'fw.example:7070'\n"
            f"tls_cert = '{pki.node('gpu-017')['tls_cert']}'\ntls_key = '{tmp_path / 'key'}'\n"
            f"tls_ca = '{tmp_path / 'ca.pem'}'\n",
            "agent.toml",
        )
        code, _, err = run(capsys, str(path))
        assert code == 2
        assert problems(err) == [
            f"{path}:5: agent config: tls_key {tmp_path / 'key'}: Is a directory",
            f"{path}:6: agent config: tls_ca {tmp_path / 'ca.pem'}: No such file or directory",
        ]


RULE = (
    "version: 1\nrules:\n  - name: hot\n    scope: gpu\n"
    "    when: 'gpu.signals.pcie_link_width < 16'\n"
)


class TestSinkWarnings:
    BASE = "[collector]\nlisten = '127.0.0.1:0'\nhttp = '127.0.0.1:0'\n"

    def test_no_drain_and_no_notify_sink(self, capsys, tmp_path: Path):
        """The built-in rules drain and notify: with neither configured, two warnings say what
        then happens and which key turns each on; the file still passes."""
        path = write(tmp_path, self.BASE)
        code, out, err = run(capsys, str(path))
        assert code == 0
        assert "collector config OK" in out
        drain, notify = warnings(err)
        assert drain.startswith(f"{path}: warning: no drain sink: ")
        assert "drain nodes, but [collector.actions.slurm] is not enabled" in drain
        assert "each drain is journaled as failed and reaches no scheduler" in drain
        assert "set enabled = true under [collector.actions.slurm]" in drain
        assert "a url under [collector.actions.drain_webhook]" in drain
        assert notify.startswith(f"{path}: warning: no notify sink: ")
        assert "reaches nobody; set a url under [collector.actions.notify.default]" in notify

    @pytest.mark.parametrize(
        "sink",
        [
            "[collector.actions.slurm]\nenabled = true\n",
            "[collector.actions.drain_webhook]\nurl = 'https://d.example/x'\n",
        ],
    )
    def test_either_drainer_is_a_drain_sink(self, capsys, tmp_path: Path, sink: str):
        """Slurm or a drain webhook: no drain warning (the notify one stays)."""
        code, _, err = run(capsys, str(write(tmp_path, self.BASE + sink)))
        assert code == 0
        [notify] = warnings(err)
        assert ": warning: no notify sink: " in notify

    def test_a_channel_rules_name_that_nothing_takes(self, capsys, tmp_path: Path):
        """Channels are set but not the one a rule names, and there is no default."""
        rules = write(
            tmp_path,
            f"{RULE}    actions: [{{notify: {{channel: oncall}}}}]\n",
            "site.yaml",
        )
        path = write(
            tmp_path,
            f"{self.BASE}rules = ['{rules}']\n"
            "[collector.actions.notify.chat]\nurl = 'https://chat.example/x'\n",
        )
        code, _, err = run(capsys, str(path))
        assert code == 0
        assert warnings(err) == [
            (
                f"{path}: warning: no notify sink: 1 rule (hot) notify, but channel(s) oncall "
                "have no table there and there is no default: each notification is journaled "
                "as failed and reaches nobody; set a url under [collector.actions.notify.default]"
            )
        ]

    @pytest.mark.parametrize(
        ("actions", "wanted"),
        [("", []), ("    actions: [drain_node]\n", ["no drain sink: 1 rule (hot) drain nodes"])],
    )
    def test_only_what_the_rules_ask_for_is_warned_about(
        self, capsys, tmp_path: Path, actions: str, wanted: list[str]
    ):
        """A rule that only drains: the drain warning alone; one with no actions: none."""
        rules = write(tmp_path, RULE + actions, "site.yaml")
        code, _, err = run(capsys, str(write(tmp_path, f"{self.BASE}rules = ['{rules}']\n")))
        assert code == 0
        found = [line.split(": warning: ")[1] for line in warnings(err)]
        assert len(found) == len(wanted), found
        assert all(line.startswith(w) for line, w in zip(found, wanted, strict=True)), found
        assert problems(err) == []


class TestJsonOutput:
    def test_one_object_says_it_all(self, capsys, tmp_path: Path):
        """``-o json`` (or ``--json``): nothing on stderr, one object on stdout with each file's
        verdict, problems at their lines and warnings; the exit code is the same as the text's."""
        good = write(tmp_path, TestSinkWarnings.BASE + SINKS, "good.toml")
        bad = write(tmp_path, "[collector]\nlisten = 'x'\nbogus = 1\n" + SINKS, "bad.toml")
        for flag in (["-o", "json"], ["--json"]):
            code, out, err = run(capsys, str(good), str(bad), *flag)
            assert (code, err) == (2, "")
            answer = json.loads(out)
            assert answer["ok"] is False
            assert (answer["problems"], answer["warnings"]) == ([], [])
            first, second = answer["files"]
            assert (first["path"], first["kind"], first["ok"]) == (str(good), "collector", True)
            assert first["summary"].startswith("listen 127.0.0.1:0")
            assert (first["problems"], first["warnings"]) == ([], [])
            assert (second["ok"], second["summary"]) == (False, "")
            assert second["problems"][0] == (
                f"{bad}:2: collector config: listen must be host:port, got 'x'"
            )
            assert second["problems"][1].startswith(f"{bad}:3: collector config: unknown key bogus")

    def test_a_clean_file_exits_0_with_its_warnings(self, capsys, tmp_path: Path):
        path = write(tmp_path, TestSinkWarnings.BASE)
        code, out, err = run(capsys, str(path), "-o", "json")
        assert (code, err) == (0, "")
        [entry] = json.loads(out)["files"]
        assert entry["ok"] is True
        assert [w.split(":")[0] for w in entry["warnings"]] == ["no drain sink", "no notify sink"]

    def test_a_file_that_is_not_there_is_a_problem_of_no_one_file(self, capsys, tmp_path: Path):
        code, out, err = run(capsys, str(tmp_path / "missing.toml"), "-o", "json")
        answer = json.loads(out)
        assert (code, err, answer["ok"], answer["files"]) == (2, "", False, [])
        assert "missing.toml" in answer["problems"][0]
