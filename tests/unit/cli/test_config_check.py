import re
import socket
from pathlib import Path

import pytest

from cli import config as cli_config
from cli.main import main
from collector.config import load_collector_config
from collector.exceptions import ConfigError
from collector.main import CollectorService
from fleetwatch.testing import FakeClock
from tests.tls_pki import make_pki

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "deploy" / "config"


# Somewhere for the built-in rules' drains and notifications to go: without them a collector
# file gets a warning for each (tests/unit/cli/test_config_check_lines.py).
SINKS = (
    "[collector.actions.slurm]\nenabled = true\n"
    "[collector.actions.notify.default]\nurl = 'https://chat.example/hooks/abc'\n"
)


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["config", "check", *args])
    out, err = capsys.readouterr()
    return code, out, err


def problems(err: str) -> list[str]:
    """The problem lines of ``err`` (warnings left out)."""
    return [line for line in err.splitlines() if ": warning: " not in line]


def full_collector(tmp_path: Path, **webhook: str) -> Path:
    """A collector file that uses every part the daemon checks at start."""
    rules = tmp_path / "site.yaml"
    rules.write_text((REPO / "rules" / "default.yaml").read_text())
    secret = tmp_path / "drain.secret"
    secret.write_text("s3cret-drain\n")
    secret.chmod(0o600)  # as docs/deploy.md asks: not open to others
    drain = webhook or {"secret_file": str(secret)}
    drain_lines = "\n".join(f'{k} = "{v}"' for k, v in drain.items())
    path = tmp_path / "collector.toml"
    path.write_text(
        "[collector]\n"
        'listen = "127.0.0.1:0"\n'
        'http = "127.0.0.1:0"\n'
        f'journal = "{tmp_path / "journal.db"}"\n'
        f'rules = ["{rules}"]\n'
        "[collector.actions]\n"
        "max_drained_nodes = 2\n"
        "[collector.actions.slurm]\n"
        "enabled = true\n"
        "[collector.actions.drain_webhook]\n"
        'url = "https://drainer.example/fleetwatch"\n'
        f"{drain_lines}\n"
        "[collector.actions.notify.default]\n"
        'url = "https://chat.example/hooks/abc"\n'
        'secret_env = "FLEETWATCH_NOTIFY_SECRET"\n'
        "[collector.jobs]\n"
        "straggler_margin = 0.2\n"
    )
    return path


class TestExamples:
    def test_shipped_examples_pass(self, capsys, tmp_path: Path):
        """deploy/config's two files pass once the certificates they name exist (here made by
        `fleetwatch certs`, installed in a scratch /etc/fleetwatch), each with a one-line
        summary, exit 0."""
        make_pki(tmp_path / "pki").install(tmp_path / "etc" / "tls", socket.gethostname())
        for example in ("agent.toml", "collector.toml"):
            text = (EXAMPLES / example).read_text().replace("/etc/fleetwatch/", f"{tmp_path}/etc/")
            (tmp_path / example).write_text(text)
        code, out, err = run(capsys, str(tmp_path / "agent.toml"), str(tmp_path / "collector.toml"))
        assert (code, problems(err)) == (0, [])
        drain, notify = err.splitlines()  # the example leaves actions off, and says so
        assert drain.startswith(f"{tmp_path / 'collector.toml'}: warning: no drain sink: ")
        assert notify.startswith(f"{tmp_path / 'collector.toml'}: warning: no notify sink: ")
        agent_line, collector_line = out.splitlines()
        assert agent_line.startswith(f"{tmp_path / 'agent.toml'}: agent config OK: node ")
        assert "collector collector.example.internal:7070 (mTLS)" in agent_line
        assert "GPU resets off" in agent_line
        assert collector_line.startswith(f"{tmp_path / 'collector.toml'}: collector config OK: ")
        assert "listen 0.0.0.0:7070 (mTLS)" in collector_line
        assert "rules (built-in)" in collector_line

    def test_every_documented_key_is_valid(self, capsys, tmp_path: Path, monkeypatch):
        """With every commented-out key and table of the examples switched on (paths moved to
        a scratch /etc/fleetwatch holding what they name), both files still pass."""
        etc = tmp_path / "etc"
        (etc / "rules").mkdir(parents=True)
        (etc / "rules" / "default.yaml").write_text((REPO / "rules" / "default.yaml").read_text())
        (etc / "rules" / "site.yaml").write_text("version: 1\nrules: []\n")
        catalog = REPO / "rules" / "builtin" / "xid_catalog.yaml"
        (etc / "xid_catalog.yaml").write_text(catalog.read_text())
        gates = REPO / "rules" / "preflight_gates.yaml"
        (etc / "preflight_gates.yaml").write_text(gates.read_text())
        names = (
            "drain.secret",
            "notify.secret",
            "rma.secret",
            "api.token",
            "journal-password",
            "alertmanager.token",
        )
        for name in (*names, "bmc.user", "bmc.password"):
            (etc / name).write_text(f"{name}-value\n")
            (etc / name).chmod(0o600)
        make_pki(tmp_path / "pki").install(etc / "tls", "gpu-node-017")
        (etc / "tls" / "bmc-ca.pem").write_bytes((etc / "tls" / "ca.pem").read_bytes())
        (etc / "tls" / "alertmanager-ca.pem").write_bytes((etc / "tls" / "ca.pem").read_bytes())
        monkeypatch.setenv("FLEETWATCH_ONCALL_SECRET", "oncall-secret")
        monkeypatch.setenv("FLEETWATCH_REBOOT_SECRET", "reboot-secret")
        switched = []
        for example in ("agent.toml", "collector.toml"):
            text = re.sub(
                r"^# (\[[\w.]+\]|\w+ = .*)$",
                r"\1",
                (EXAMPLES / example).read_text(),
                flags=re.MULTILINE,
            )
            assert "# " + "[" not in text
            path = tmp_path / example
            path.write_text(text.replace("/etc/fleetwatch/", f"{etc}/"))
            switched.append(str(path))
        code, out, err = run(capsys, *switched)
        assert (code, err) == (0, "")
        assert "node gpu-node-017, " in out
        assert "BMC redfish 10.20.0.17" in out
        assert "http 0.0.0.0:9470 (changes with the API token)" in out
        assert re.search(
            r"\d+ rules, drains via slurm and webhook, 2 notify channels, reboots via slurm and "
            r"webhook, RMA tickets via webhook\n",
            out,
        )

    def test_every_part_of_a_full_collector_file(self, capsys, tmp_path: Path, monkeypatch):
        """Rule files, Slurm, a webhook with a secret file and one with a secret variable."""
        monkeypatch.setenv("FLEETWATCH_NOTIFY_SECRET", "s3cret-notify")
        code, out, err = run(capsys, str(full_collector(tmp_path)))
        assert (code, err) == (0, "")
        assert "drains via slurm and webhook, 1 notify channels" in out

    def test_requeue_is_named_when_on(self, capsys, tmp_path: Path, monkeypatch):
        """``requeue = true`` shows in the summary; a quoted one is refused, naming the key."""
        monkeypatch.setenv("FLEETWATCH_NOTIFY_SECRET", "s3cret-notify")
        path = full_collector(tmp_path)
        text = path.read_text()
        path.write_text(text.replace("enabled = true\n", "enabled = true\nrequeue = true\n"))
        code, out, err = run(capsys, str(path))
        assert (code, err) == (0, "")
        assert "1 notify channels, requeues jobs via slurm" in out
        path.write_text(text.replace("enabled = true\n", 'enabled = true\nrequeue = "yes"\n'))
        code, _, err = run(capsys, str(path))
        assert code != 0
        assert "actions.slurm.requeue must be true or false" in err

    def test_env_file_supplies_secret_variables(self, capsys, tmp_path: Path, monkeypatch):
        """--env-file reads the unit's EnvironmentFile= format; the secret is never printed."""
        monkeypatch.delenv("FLEETWATCH_NOTIFY_SECRET", raising=False)
        env = tmp_path / "collector.env"
        env.write_text("# secrets\n\nFLEETWATCH_NOTIFY_SECRET='s3cret-notify'\n")
        env.chmod(0o600)
        code, out, err = run(capsys, "--env-file", str(env), str(full_collector(tmp_path)))
        assert (code, err) == (0, "")
        assert "s3cret" not in out

    def test_files_without_a_table_need_their_kind(self, capsys, tmp_path: Path):
        """A file of bare keys is refused unless --agent or --collector says what it is."""
        bare = tmp_path / "bare.toml"
        bare.write_text('collector = "127.0.0.1:7070"\npoll_interval = 2.0\n')
        code, _, err = run(capsys, str(bare))
        assert code == 2
        assert "has neither an [agent] nor a [collector] table" in err
        code, out, _ = run(capsys, "--agent", str(bare))
        assert code == 0
        assert "poll every 2 s" in out

    def test_defaults_are_the_files_under_etc(self, capsys, tmp_path: Path, monkeypatch):
        """With no files named, the default paths that exist are checked; none is an error."""
        agent = tmp_path / "agent.toml"
        monkeypatch.setattr(
            cli_config,
            "DEFAULT_FILES",
            {"agent": agent, "collector": tmp_path / "collector.toml"},
        )
        code, _, err = run(capsys)
        assert code == 2
        assert "no config files given" in err
        agent.write_text("[agent]\n")
        code, out, _ = run(capsys)
        assert code == 0
        assert out.startswith(f"{agent}: agent config OK")


class TestProblems:
    @pytest.mark.parametrize(
        ("text", "where", "message"),
        [
            ("[collector\n", ":1:11", "invalid TOML"),
            (
                '[collector]\nlisten_addr = "0.0.0.0:1"\n',
                ":2",
                "unknown key listen_addr; did you mean listen?",
            ),
            (
                '[agent]\npoll_interval = "fast"\n',
                ":2",
                "poll_interval must be a number > 0, got 'fast'",
            ),
            ('[agent]\ngpu_reset = "yes"\n', ":2", "gpu_reset must be true or false"),
            (
                "[collector]\nmissed_heartbeats = 2.5\n",
                ":2",
                "missed_heartbeats must be an integer",
            ),
            (
                'poll_interval = 3\n[agent]\nnode = "n1"\n',
                ":1",
                "key poll_interval outside the [agent] table",
            ),
            (
                (
                    "[collector.actions.drain_webhook]\nurl = 'https://d.example/x'\n"
                    "secret_file = '/nonexistent/drain.secret'\n"
                ),
                ":3",
                (
                    "actions.drain_webhook.secret_file /nonexistent/drain.secret: "
                    "No such file or directory"
                ),
            ),
            (
                (
                    "[collector.actions.notify.oncall]\nurl = 'https://p.example/x'\n"
                    "secret_env = 'FLEETWATCH_TEST_UNSET'\n"
                ),
                ":3",
                (
                    "actions.notify.oncall.secret_env: environment variable FLEETWATCH_TEST_UNSET "
                    "is not set in the collector's environment"
                ),
            ),
            (
                (
                    "[collector.actions.notify.oncall]\nurl = 'https://p.example/x'\n"
                    "secret_env = 'FLEETWATCH-BAD'\n"
                ),
                ":3",
                "actions.notify.oncall.secret_env must name an environment variable",
            ),
            (
                (
                    "[collector.actions.drain_webhook]\nurl = 'https://d.example/x'\n"
                    "secret_env = 'A'\nsecret_file = '/x'\n"
                ),
                ":1",
                "actions.drain_webhook takes secret_file or secret_env, not both",
            ),
            (
                "[collector.actions.drain_webhook]\nurl = 'https://d.example/x'\nsecret = 'x'\n",
                ":3",
                (
                    "unknown key actions.drain_webhook.secret; "
                    "did you mean actions.drain_webhook.secret_env?"
                ),
            ),
            (
                "[collector.actions.drain_webhook]\nurl = 'https://d.example/x'\ntimeout = '5'\n",
                ":3",
                "actions.drain_webhook.timeout must be a number > 0, got '5'",
            ),
            (
                "[collector.actions.drain_webhook]\nurl = 'ftp://d.example/x'\n",
                ":1",
                "actions.drain_webhook: url must start with http:// or https://",
            ),
            (
                "[collector]\napi_token_file = '/nonexistent/api.token'\n",
                ":2",
                "api_token_file /nonexistent/api.token: No such file or directory",
            ),
            (
                "[collector]\napi_token_env = 'FLEETWATCH_TEST_UNSET'\n",
                ":2",
                (
                    "collector config: api_token_env: environment variable FLEETWATCH_TEST_UNSET "
                    "is not set in the collector's environment"
                ),
            ),
            (
                "[collector]\napi_token_env = 'FLEETWATCH-TOKEN'\n",
                ":2",
                "api_token_env must name an environment variable, got 'FLEETWATCH-TOKEN'",
            ),
            (
                "[collector]\napi_token_env = 'A'\napi_token_file = '/x'\n",
                ":3",
                "takes api_token_file or api_token_env, not both",
            ),
            (
                "[collector]\napi_token_file = 7\n",
                ":2",
                "api_token_file must be a non-empty string",
            ),
            # Problems in the files the config names give their own file and line.
            (
                "[collector]\nrules = ['/nonexistent/site.yaml']\n",
                "",
                "rules: /nonexistent/site.yaml",
            ),
            (
                "[collector]\nxid_catalog = '/nonexistent/x.yaml'\n",
                "",
                "cannot read the Xid catalog",
            ),
        ],
    )
    def test_broken_file_is_named_with_what_is_wrong(
        self, capsys, tmp_path: Path, text, where, message
    ):
        """Each broken file fails with exit 2 and a line naming the file, the line that sets
        the key (as the collector's reload does), and the key."""
        path = tmp_path / "broken.toml"
        path.write_text(text)
        kind = "--agent" if "[agent]" in text else "--collector"
        code, out, err = run(capsys, kind, str(path))
        assert (code, out) == (2, "")
        [line] = [line for line in problems(err) if message in line]
        assert line.startswith(f"{path}{where}: ")

    def test_every_problem_is_listed(self, capsys, tmp_path: Path, monkeypatch):
        """A broken rule file, a missing secret file and an unset variable: all three reported,
        one per line, each naming the config file."""
        monkeypatch.delenv("FLEETWATCH_NOTIFY_SECRET", raising=False)
        path = full_collector(tmp_path, secret_file=str(tmp_path / "missing.secret"))
        (tmp_path / "site.yaml").write_text("version: 1\nrules:\n  - name: x\n")
        code, _, err = run(capsys, str(path))
        assert code == 2
        lines = err.splitlines()
        assert all(line.startswith(f"{path}:") for line in lines)
        assert any(f"rules: {tmp_path / 'site.yaml'}" in line for line in lines)
        assert any("missing.secret: No such file or directory" in line for line in lines)
        assert any("FLEETWATCH_NOTIFY_SECRET is not set" in line for line in lines)

    def test_bad_env_file_lines_are_named_not_shown(self, capsys, tmp_path: Path):
        """A line that is not NAME=VALUE is reported by number, without its content."""
        env = tmp_path / "collector.env"
        env.write_text("GOOD=1\nexport SECRET-VALUE\n")
        code, _, err = run(capsys, "--env-file", str(env), str(EXAMPLES / "collector.toml"))
        assert code == 2
        assert f"{env}:2: expected NAME=VALUE" in err
        assert "SECRET-VALUE" not in err


class TestApiToken:
    def write(self, tmp_path: Path, line: str) -> Path:
        path = tmp_path / "collector.toml"
        path.write_text(
            f'[collector]\nlisten = "127.0.0.1:7070"\nhttp = "0.0.0.0:9470"\n{line}\n{SINKS}'
        )
        return path

    def test_an_empty_token_file_is_refused(self, capsys, tmp_path: Path):
        """An empty token file is an error naming the key and the file, not an open API."""
        token = tmp_path / "api.token"
        token.write_text("\n")
        code, out, err = run(capsys, str(self.write(tmp_path, f'api_token_file = "{token}"')))
        assert (code, out) == (2, "")
        assert f"collector config: api_token_file {token} is empty" in err

    def test_an_empty_token_variable_is_refused(self, capsys, tmp_path: Path, monkeypatch):
        """A variable that is set but empty is named as empty."""
        monkeypatch.setenv("FLEETWATCH_TEST_TOKEN", "  ")
        code, _, err = run(
            capsys, str(self.write(tmp_path, 'api_token_env = "FLEETWATCH_TEST_TOKEN"'))
        )
        assert code == 2
        assert "environment variable FLEETWATCH_TEST_TOKEN is empty" in err

    def test_the_summary_says_who_may_change_state(self, capsys, tmp_path: Path, monkeypatch):
        """With a readable token the file passes (the token never printed); without one, a
        non-loopback http address is reported as refusing changes."""
        monkeypatch.setenv("FLEETWATCH_TEST_TOKEN", "t0ken-value")
        code, out, err = run(
            capsys, str(self.write(tmp_path, 'api_token_env = "FLEETWATCH_TEST_TOKEN"'))
        )
        assert (code, err) == (0, "")
        assert "http 0.0.0.0:9470 (changes with the API token)" in out
        assert "t0ken-value" not in out
        code, out, _ = run(capsys, str(self.write(tmp_path, "")))
        assert code == 0
        assert "http 0.0.0.0:9470 (changes refused: no API token)" in out

    def test_the_collector_refuses_to_start_without_its_token(self, tmp_path: Path):
        """The daemon reads the token at start and stops on the same error the check reports."""
        cfg = load_collector_config(self.write(tmp_path, 'api_token_env = "FLEETWATCH_T"'), {})
        with pytest.raises(ConfigError, match="FLEETWATCH_T is not set"):
            CollectorService(cfg, FakeClock(), environ={})


class TestDaemonAgrees:
    async def test_the_collector_fails_on_what_the_check_fails(self, tmp_path: Path):
        """The check and the collector's start-up share their checks: an unset secret variable
        stops the daemon with the same message."""
        cfg = load_collector_config(full_collector(tmp_path), {})
        with pytest.raises(ConfigError, match="FLEETWATCH_NOTIFY_SECRET is not set"):
            CollectorService(cfg, FakeClock(), environ={})

    def test_the_collector_signs_with_the_variable(self, tmp_path: Path):
        """The collector reads a secret_env secret from the environment it is given."""
        cfg = load_collector_config(full_collector(tmp_path), {})
        hook = cfg.actions.notify["default"]
        assert hook.secret("k", {"FLEETWATCH_NOTIFY_SECRET": " v \n"}) == b"v"
        drain = cfg.actions.drain_webhook
        assert drain is not None
        assert drain.secret("k", {}) == b"s3cret-drain"

    def test_an_empty_secret_file_is_refused(self, tmp_path: Path):
        """An empty secret file is a mistake, not a request for unsigned webhooks."""
        empty = tmp_path / "empty.secret"
        empty.write_text("\n")
        cfg = load_collector_config(full_collector(tmp_path, secret_file=str(empty)), {})
        drain = cfg.actions.drain_webhook
        assert drain is not None
        with pytest.raises(ConfigError, match=r"drain_webhook.secret_file .*empty.secret is empty"):
            drain.secret("actions.drain_webhook", {})


BIG = "k" * 1_000_000  # a key or value of a megabyte (the finding had 10 MB)


class TestHostileFiles:
    @pytest.mark.parametrize(
        "text",
        [
            f"[collector]\n{BIG} = 1\n",
            f'[collector]\n"{BIG}" = 1\n',
            f"[agent]\n{BIG} = 1\n",
            f"{BIG} = 1\n[collector]\n",
            f"[collector.actions]\n{BIG} = 1\n",
            f'[collector.actions.notify."{BIG}"]\nurl = 5\n',
            f"[collector.actions.drain_webhook]\nurl = 'http://d.example'\n{BIG} = 1\n",
            f"[collector.actions.drain_webhook]\nurl = 'http://d.example'\nsecret_env = '{BIG}'\n",
            f"[collector]\napi_token_env = '{BIG}'\n",
            f"[collector]\napi_token_file = '/{BIG}'\n",
            f"[collector]\nrules = ['/{BIG}']\n",
            f"[collector]\nxid_catalog = '/{BIG}'\n",
        ],
        ids=[
            "key",
            "quoted-key",
            "agent-key",
            "stray-key",
            "actions-key",
            "channel-name",
            "webhook-key",
            "secret-env",
            "token-env",
            "token-file",
            "rule-file",
            "xid-catalog",
        ],
    )
    def test_a_huge_key_or_value_is_shown_cut(self, capsys, tmp_path: Path, text):
        """A megabyte-long key, name or path is named in a few dozen characters, not echoed."""
        path = tmp_path / "huge.toml"
        path.write_text(text)
        kind = "--agent" if "[agent]" in text else "--collector"
        code, out, err = run(capsys, kind, str(path))
        assert (code, out) == (2, "")
        assert "k" * 200 not in err
        assert all(len(line) < 600 for line in err.splitlines()), [len(x) for x in err.splitlines()]

    def test_every_line_is_bounded_whatever_the_message(self, capsys, tmp_path: Path):
        """A part whose own message is not cut (the jobs table names its unknown keys whole)
        still prints one line of at most MAX_LINE characters."""
        path = tmp_path / "huge.toml"
        path.write_text(f"[collector.jobs]\n{BIG} = 1\n")
        code, _, err = run(capsys, "--collector", str(path))
        assert code == 2
        assert 0 < max(len(line) for line in err.splitlines()) <= cli_config.MAX_LINE

    @pytest.mark.parametrize(
        ("how", "expected"),
        [
            ("by-table", "{bad}: the config file is not UTF-8 text: invalid continuation byte"),
            ("as-collector", "{bad}: collector config is not UTF-8 text: invalid continuation"),
            ("env-file", "{bad}: the environment file is not UTF-8 text: invalid continuation"),
            ("rule-file", "rules: {bad}:2: not UTF-8 text: invalid continuation byte at byte 16"),
        ],
    )
    def test_a_file_that_is_not_utf8_is_named(self, capsys, tmp_path: Path, how, expected):
        """A Latin-1 file is named, with the byte and line, wherever it is read (the config,
        env and rule files were an unnamed "'utf-8' codec can't decode" before)."""
        bad = tmp_path / "bad.bin"
        first = b"version: 1\n" if how == "rule-file" else b"[collector]\n"
        bad.write_bytes(first + "# café\n".encode("latin-1"))
        config = tmp_path / "collector.toml"
        config.write_text(f"[collector]\nlisten = '127.0.0.1:0'\nrules = ['{bad}']\n")
        args = {
            "by-table": [str(bad)],
            "as-collector": ["--collector", str(bad)],
            "env-file": ["--env-file", str(bad), str(config)],
            "rule-file": [str(config)],
        }[how]
        code, _, err = run(capsys, *args)
        assert code == 2
        assert expected.format(bad=bad) in err
        if how != "rule-file":
            assert "(line 2)" in err
        assert "codec" not in err


class TestEveryProblem:
    def test_each_table_reports_its_problem(self, capsys, tmp_path: Path):
        """One mistake in each of seven tables: seven lines, each at its line, where the
        loader stops at the first. The rules, Xid catalog and TLS checks still run on what
        loaded (the missing rule file is the eighth)."""
        path = tmp_path / "collector.toml"
        path.write_text(
            "[collector]\n"
            "listen = '127.0.0.1:0'\n"
            "missed_heartbeats = 2.5\n"
            "rules = ['/nonexistent/site.yaml']\n"
            "[collector.actions]\n"
            "max_drained_nodez = 2\n"
            "[collector.actions.drain_webhook]\n"
            "url = 'https://d.example/x'\n"
            "timeout = '5'\n"
            "[collector.actions.notify.first]\n"
            "secret_env = 'A'\n"
            "[collector.actions.notify.second]\n"
            "url = 'https://p.example/x'\n"
            "secret_env = 'NOT-A-NAME'\n"
            "[collector.jobs]\n"
            "straggler_margin = 'wide'\n"
            "[collector.ingest]\n"
            "events_per_hour = 5\n"
        )
        code, _, err = run(capsys, str(path))
        assert code == 2
        wanted = [
            ":3: config: missed_heartbeats must be an integer",
            (
                ":6: collector config: unknown key actions.max_drained_nodez; did you mean "
                "actions.max_drained_nodes?"
            ),
            ":9: config: actions.drain_webhook.timeout must be a number > 0, got '5'",
            ":10: collector config: actions.notify.first needs a url",
            ":14: collector config: actions.notify.second.secret_env must name an environment",
            ":16: config: jobs.straggler_margin must be a number > 0, got 'wide'",
            (
                ":18: collector config: unknown key ingest.events_per_hour; did you mean "
                "ingest.events_per_s?"
            ),
            ": rules: /nonexistent/site.yaml:0: cannot read",
        ]
        lines = problems(err)
        assert len(lines) == len(wanted), lines
        for line, text in zip(lines, wanted, strict=True):
            assert line.startswith(f"{path}{text}"), (text, line)

    def test_parts_that_load_are_checked_further(self, capsys, tmp_path: Path):
        """A broken jobs table does not hide a missing rule file or secret file."""
        path = tmp_path / "collector.toml"
        path.write_text(
            "[collector]\n"
            "listen = '127.0.0.1:0'\n"
            "rules = ['/nonexistent/site.yaml']\n"
            "[collector.actions.drain_webhook]\n"
            "url = 'https://d.example/x'\n"
            "secret_file = '/nonexistent/drain.secret'\n"
            "[collector.jobs]\n"
            "max_jobs = -1\n"
        )
        code, _, err = run(capsys, str(path))
        assert code == 2
        assert "max_jobs" in err
        assert "rules: /nonexistent/site.yaml:0: cannot read" in err
        assert "secret_file /nonexistent/drain.secret: No such file or directory" in err


class TestSecretFileModes:
    def write(self, tmp_path: Path, mode: int) -> tuple[Path, Path]:
        token = tmp_path / "api.token"
        token.write_text("t0ken\n")
        token.chmod(mode)
        path = tmp_path / "collector.toml"
        path.write_text(
            "[collector]\nlisten = '127.0.0.1:0'\nhttp = '127.0.0.1:0'\n"
            f"api_token_file = '{token}'\n{SINKS}"
        )
        return path, token

    @pytest.mark.parametrize(
        ("mode", "warning"),
        [
            (0o644, "is open to others (mode 0644); make it 0640 with group fleetwatch"),
            (0o604, "is open to others (mode 0604)"),
            (0o602, "is open to others (mode 0602)"),
            (0o620, "is open to group root (mode 0620)"),
            (0o640, "is open to group root (mode 0640)"),
        ],
    )
    def test_an_open_secret_file_is_a_warning(self, capsys, tmp_path: Path, mode, warning):
        """A token file others can read or write, or a group other than the service's, is
        warned about on stderr; the file still passes (exit 0)."""
        path, token = self.write(tmp_path, mode)
        code, out, err = run(capsys, str(path))
        assert code == 0
        assert "collector config OK" in out
        [line] = err.splitlines()
        assert line.startswith(f"{path}: warning: api_token_file {token} {warning}")

    @pytest.mark.parametrize("mode", [0o600, 0o400, 0o640])
    def test_owner_only_or_service_group_passes_quietly(
        self, capsys, tmp_path: Path, monkeypatch, mode
    ):
        """0600, 0400, and 0640 when the group is the service's (root here), say nothing."""
        monkeypatch.setattr(cli_config, "SERVICE_GROUP", "root")
        path, _ = self.write(tmp_path, mode)
        code, _, err = run(capsys, str(path))
        assert (code, err) == (0, "")

    def test_webhook_and_journal_password_files_too(self, capsys, tmp_path: Path, monkeypatch):
        """Every secret file is looked at: the webhooks' and the journal password's."""
        monkeypatch.setenv("FLEETWATCH_NOTIFY_SECRET", "s3cret-notify")
        path = full_collector(tmp_path)
        (tmp_path / "drain.secret").chmod(0o644)
        password = tmp_path / "journal-password"
        password.write_text("pw\n")
        password.chmod(0o644)
        path.write_text(
            path.read_text().replace(
                "[collector]\n",
                "[collector]\njournal_dsn = 'host=db.example dbname=fleetwatch'\n"
                f"journal_password_file = '{password}'\n",
                1,
            )
        )
        code, _, err = run(capsys, str(path))
        assert code == 0
        assert f"journal_password_file {password} is open to others" in err
        assert f"actions.drain_webhook.secret_file {tmp_path / 'drain.secret'} is open" in err

    def test_env_file_must_be_owner_only(self, capsys, tmp_path: Path, monkeypatch):
        """The unit's environment file is read by systemd as root: 0640 is already too open."""
        monkeypatch.setattr(cli_config, "SERVICE_GROUP", "root")
        env = tmp_path / "collector.env"
        env.write_text("A=1\n")
        env.chmod(0o640)
        path, _ = self.write(tmp_path, 0o600)
        code, _, err = run(capsys, "--env-file", str(env), str(path))
        assert code == 0
        assert err == (
            f"{env}: warning: the environment file is open to group root (mode 0640); "
            "make it 0600\n"
        )
