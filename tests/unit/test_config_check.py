import re
import socket
from pathlib import Path

import pytest

from collector.config import load_collector_config
from collector.exceptions import ConfigError
from collector.main import CollectorService
from fleetwatch import cli_config
from fleetwatch.cli import main
from fleetwatch.testing import FakeClock
from tests.tls_pki import make_pki

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "deploy" / "config"


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["config", "check", *args])
    out, err = capsys.readouterr()
    return code, out, err


def full_collector(tmp_path: Path, **webhook: str) -> Path:
    """A collector file that uses every part the daemon checks at start."""
    rules = tmp_path / "site.yaml"
    rules.write_text((REPO / "rules" / "default.yaml").read_text())
    secret = tmp_path / "drain.secret"
    secret.write_text("s3cret-drain\n")
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
        assert (code, err) == (0, "")
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
        for name in ("drain", "notify"):
            (etc / f"{name}.secret").write_text(f"{name}-secret\n")
        (etc / "api.token").write_text("api-token\n")
        (etc / "journal-password").write_text("journal-password\n")
        make_pki(tmp_path / "pki").install(etc / "tls", "gpu-node-017")
        monkeypatch.setenv("FLEETWATCH_ONCALL_SECRET", "oncall-secret")
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
        assert "http 0.0.0.0:9470 (changes with the API token)" in out
        assert re.search(r"\d+ rules, drains via slurm and webhook, 2 notify channels\n", out)

    def test_every_part_of_a_full_collector_file(self, capsys, tmp_path: Path, monkeypatch):
        """Rule files, Slurm, a webhook with a secret file and one with a secret variable."""
        monkeypatch.setenv("FLEETWATCH_NOTIFY_SECRET", "s3cret-notify")
        code, out, err = run(capsys, str(full_collector(tmp_path)))
        assert (code, err) == (0, "")
        assert "drains via slurm and webhook, 1 notify channels" in out

    def test_env_file_supplies_secret_variables(self, capsys, tmp_path: Path, monkeypatch):
        """--env-file reads the unit's EnvironmentFile= format; the secret is never printed."""
        monkeypatch.delenv("FLEETWATCH_NOTIFY_SECRET", raising=False)
        env = tmp_path / "collector.env"
        env.write_text("# secrets\n\nFLEETWATCH_NOTIFY_SECRET='s3cret-notify'\n")
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
        ("text", "message"),
        [
            ("[collector\n", "invalid TOML"),
            ('[collector]\nlisten_addr = "0.0.0.0:1"\n', "unknown key(s) listen_addr; known: "),
            ('[agent]\npoll_interval = "fast"\n', "poll_interval must be a number > 0, got 'fast'"),
            ('[agent]\ngpu_reset = "yes"\n', "gpu_reset must be true or false"),
            ("[collector]\nmissed_heartbeats = 2.5\n", "missed_heartbeats must be an integer"),
            ('poll_interval = 3\n[agent]\nnode = "n1"\n', "poll_interval outside the [agent]"),
            (
                (
                    "[collector.actions.drain_webhook]\nurl = 'https://d.example/x'\n"
                    "secret_file = '/nonexistent/drain.secret'\n"
                ),
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
                "actions.notify.oncall.secret_env must name an environment variable",
            ),
            (
                (
                    "[collector.actions.drain_webhook]\nurl = 'https://d.example/x'\n"
                    "secret_env = 'A'\nsecret_file = '/x'\n"
                ),
                "actions.drain_webhook takes secret_file or secret_env, not both",
            ),
            (
                "[collector.actions.drain_webhook]\nurl = 'https://d.example/x'\nsecret = 'x'\n",
                (
                    "actions.drain_webhook has no key(s) secret; it takes url, secret_file, "
                    "secret_env, timeout, max_attempts"
                ),
            ),
            (
                "[collector.actions.drain_webhook]\nurl = 'https://d.example/x'\ntimeout = '5'\n",
                "actions.drain_webhook.timeout must be a number > 0, got '5'",
            ),
            (
                "[collector.actions.drain_webhook]\nurl = 'ftp://d.example/x'\n",
                "actions.drain_webhook: url must start with http:// or https://",
            ),
            (
                "[collector]\napi_token_file = '/nonexistent/api.token'\n",
                "api_token_file /nonexistent/api.token: No such file or directory",
            ),
            (
                "[collector]\napi_token_env = 'FLEETWATCH_TEST_UNSET'\n",
                (
                    "collector config: api_token_env: environment variable FLEETWATCH_TEST_UNSET "
                    "is not set in the collector's environment"
                ),
            ),
            (
                "[collector]\napi_token_env = 'FLEETWATCH-TOKEN'\n",
                "api_token_env must name an environment variable, got 'FLEETWATCH-TOKEN'",
            ),
            (
                "[collector]\napi_token_env = 'A'\napi_token_file = '/x'\n",
                "takes api_token_file or api_token_env, not both",
            ),
            ("[collector]\napi_token_file = 7\n", "api_token_file must be a non-empty string"),
            ("[collector]\nrules = ['/nonexistent/site.yaml']\n", "rules: /nonexistent/site.yaml"),
            ("[collector]\nxid_catalog = '/nonexistent/x.yaml'\n", "cannot read the Xid catalog"),
        ],
    )
    def test_broken_file_is_named_with_what_is_wrong(self, capsys, tmp_path: Path, text, message):
        """Each broken file fails with exit 2 and a line naming the file and the key."""
        path = tmp_path / "broken.toml"
        path.write_text(text)
        kind = "--agent" if "[agent]" in text else "--collector"
        code, out, err = run(capsys, kind, str(path))
        assert (code, out) == (2, "")
        assert err.startswith(f"{path}: ")
        assert message in err

    def test_every_problem_is_listed(self, capsys, tmp_path: Path, monkeypatch):
        """A broken rule file, a missing secret file and an unset variable: all three reported,
        one per line, each naming the config file."""
        monkeypatch.delenv("FLEETWATCH_NOTIFY_SECRET", raising=False)
        path = full_collector(tmp_path, secret_file=str(tmp_path / "missing.secret"))
        (tmp_path / "site.yaml").write_text("version: 1\nrules:\n  - name: x\n")
        code, _, err = run(capsys, str(path))
        assert code == 2
        lines = err.splitlines()
        assert all(line.startswith(f"{path}: ") for line in lines)
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
        path.write_text(f'[collector]\nlisten = "127.0.0.1:7070"\nhttp = "0.0.0.0:9470"\n{line}\n')
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
