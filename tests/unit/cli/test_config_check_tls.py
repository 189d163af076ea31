import datetime as dt
from pathlib import Path

import pytest

from agent.config import AgentConfig, load_agent_config
from agent.exceptions import ConfigError as AgentConfigError
from cli import issue_certs as certs
from cli.main import main
from collector.config import CollectorConfig
from collector.exceptions import ConfigError
from tests.tls_pki import Pki, make_pki


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki")


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["config", "check", *args])
    out, err = capsys.readouterr()
    return code, out, err


def toml(path: Path, table: str, **values: object) -> Path:
    lines = [f"[{table}]"]
    for key, value in values.items():
        shown = str(value).lower() if isinstance(value, bool) else f'"{value}"'
        lines.append(f"{key} = {shown}")
    path.write_text("\n".join(lines) + "\n")
    return path


def agent_file(tmp_path: Path, pki: Pki, **extra: object) -> Path:
    values: dict[str, object] = {
        "collector": "fw.example:7070",
        "node": "gpu-017",
        **pki.node("gpu-017"),
        **extra,
    }
    return toml(tmp_path / "agent.toml", "agent", **{k: v for k, v in values.items() if v != ""})


def collector_file(tmp_path: Path, pki: Pki, **extra: object) -> Path:
    values: dict[str, object] = {
        "listen": "0.0.0.0:7070",
        "journal": tmp_path / "journal.db",
        **pki.collector("fw.example"),
        **extra,
    }
    return toml(
        tmp_path / "collector.toml", "collector", **{k: v for k, v in values.items() if v != ""}
    )


class TestTlsConfigCheck:
    def test_tls_configs_pass(self, capsys, tmp_path: Path, pki):
        """An agent and a collector with certificates from `fleetwatch certs` pass, and the
        summaries say mTLS."""
        code, out, err = run(
            capsys, str(agent_file(tmp_path, pki)), str(collector_file(tmp_path, pki))
        )
        problems = [line for line in err.splitlines() if ": warning: " not in line]
        assert (code, problems) == (0, [])
        assert "collector fw.example:7070 (mTLS)" in out
        assert "listen 0.0.0.0:7070 (mTLS)" in out

    def test_missing_key_file_is_named(self, capsys, tmp_path: Path, pki):
        """A key file that is not there: the key, the path and the reason, exit 2."""
        missing = tmp_path / "nope.key"
        path = collector_file(tmp_path, pki, tls_key=missing)
        code, _, err = run(capsys, str(path))
        assert code == 2
        named = f"{path}:5: collector config: tls_key {missing}: No such file or directory"
        assert named in err.splitlines(), err

    def test_key_of_another_certificate_is_refused(self, capsys, tmp_path: Path, pki):
        """A key that does not belong to the certificate is named with both files."""
        other = pki.node("other")["tls_key"]
        code, _, err = run(capsys, str(agent_file(tmp_path, pki, tls_key=other)))
        assert code == 2
        assert f"tls_key {other} is not the key of the certificate in tls_cert " in err

    def test_agent_certificate_must_name_its_node(self, capsys, tmp_path: Path, pki):
        """The collector would refuse every Hello, so the check refuses the file."""
        code, _, err = run(capsys, str(agent_file(tmp_path, pki, node="gpu-018")))
        assert code == 2
        assert "is for gpu-017, not for node gpu-018" in err

    def test_not_pem_is_refused(self, capsys, tmp_path: Path, pki):
        """A file that holds no certificate says so."""
        junk = tmp_path / "junk.pem"
        junk.write_text("hello\n")
        code, _, err = run(capsys, str(collector_file(tmp_path, pki, tls_client_ca=junk)))
        assert code == 2
        assert f"tls_client_ca {junk}: no PEM certificate in it" in err

    def test_expired_certificate_is_a_problem(self, capsys, tmp_path: Path, pki):
        """A certificate past its end is reported with the date it expired."""
        long_ago = dt.datetime(2020, 1, 1, tzinfo=dt.UTC)
        old = certs.make_node("gpu-017", pki.ca_dir, tmp_path / "old", long_ago, days=1)
        code, _, err = run(
            capsys, str(agent_file(tmp_path, pki, tls_cert=old.cert, tls_key=old.key))
        )
        assert code == 2
        assert "agent config: tls_cert: the certificate expired on 2020-01-02 00:00 UTC" in err

    def test_plaintext_on_a_public_address_needs_insecure(self, capsys, tmp_path: Path, pki):
        """Without TLS a non-loopback address fails, naming insecure; insecure = true passes."""
        no_tls = {"tls_cert": "", "tls_key": "", "tls_client_ca": ""}
        code, _, err = run(capsys, str(collector_file(tmp_path, pki, **no_tls)))
        assert code == 2
        assert "listen 0.0.0.0:7070 is not a loopback address and no TLS is configured" in err
        assert "insecure = true" in err
        path = collector_file(tmp_path, pki, **no_tls, insecure=True)
        code, out, _ = run(capsys, str(path))
        assert code == 0
        assert "(plaintext, insecure = true)" in out
        no_tls = {"tls_cert": "", "tls_key": "", "tls_ca": ""}
        code, _, err = run(capsys, str(agent_file(tmp_path, pki, **no_tls)))
        assert code == 2
        assert "collector fw.example:7070 is not a loopback address" in err


class TestTlsKeys:
    @pytest.mark.parametrize(
        ("values", "message"),
        [
            ({"tls_cert": Path("c.pem")}, "tls_key, tls_client_ca are missing"),
            (
                {
                    "tls_cert": Path("c"),
                    "tls_key": Path("k"),
                    "tls_client_ca": Path("a"),
                    "insecure": True,
                },
                "insecure = true and tls_cert, tls_key, tls_client_ca are all set",
            ),
            ({"insecure": "yes"}, "insecure must be true or false"),
            (
                {"tls_cert": 5, "tls_key": Path("k"), "tls_client_ca": Path("a")},
                "tls_cert must be a file path",
            ),
        ],
    )
    def test_collector_tls_keys_go_together(self, values, message):
        """All three TLS keys or none, never with insecure; each named in the error."""
        with pytest.raises(ConfigError, match=message):
            CollectorConfig(**values)

    def test_agent_server_name_needs_tls(self, tmp_path: Path):
        """tls_server_name without the TLS keys is an error, as is half of them."""
        with pytest.raises(AgentConfigError, match="tls_server_name needs TLS"):
            AgentConfig(tls_server_name="fw.example")
        path = toml(tmp_path / "a.toml", "agent", tls_ca="/x/ca.pem")
        with pytest.raises(AgentConfigError, match="tls_cert, tls_key are missing"):
            load_agent_config(path, {})
