"""``[collector.alertmanager]``: what it takes, what it refuses (naming the key), its secrets."""

from pathlib import Path

import pytest

from collector.actions.alertmanager_config import (
    ALERTMANAGER_KEYS,
    AlertmanagerConfig,
    parse_alertmanager,
)
from collector.config import load_collector_config
from collector.exceptions import ConfigError
from rules.model import Severity


class TestParse:
    def test_defaults(self):
        """Only urls: a resend every minute, warning and above, 5 s timeout, no labels."""
        cfg = parse_alertmanager({"urls": ["http://127.0.0.1:9093/"]})
        assert cfg == AlertmanagerConfig(urls=("http://127.0.0.1:9093",))
        assert (cfg.resend_interval_s, cfg.min_severity, cfg.timeout_s) == (
            60.0,
            Severity.WARNING,
            5.0,
        )
        assert cfg.enabled
        assert not AlertmanagerConfig().enabled

    def test_every_key(self, tmp_path: Path):
        """Each key lands in its field."""
        cfg = parse_alertmanager(
            {
                "urls": ["https://am-1.example:9093", "https://am-2.example:9093/prefix"],
                "resend_interval": 30,
                "min_severity": "critical",
                "timeout": 2.5,
                "labels": {"cluster": "a"},
                "external_url": "https://fleetwatch.example:9470",
                "ca_file": str(tmp_path / "ca.pem"),
                "bearer_token_file": str(tmp_path / "token"),
            }
        )
        assert cfg.urls[1] == "https://am-2.example:9093/prefix"
        assert (cfg.resend_interval_s, cfg.min_severity, cfg.timeout_s) == (
            30.0,
            Severity.CRITICAL,
            2.5,
        )
        assert (cfg.labels, cfg.external_url) == (
            {"cluster": "a"},
            "https://fleetwatch.example:9470",
        )
        assert (cfg.ca_file, cfg.bearer_token_file) == (tmp_path / "ca.pem", tmp_path / "token")
        assert set(ALERTMANAGER_KEYS) == {
            "urls",
            "resend_interval",
            "min_severity",
            "timeout",
            "labels",
            "external_url",
            "ca_file",
            "bearer_token_file",
            "bearer_token_env",
        }

    @pytest.mark.parametrize(
        ("table", "named"),
        [
            ({"url": "http://a:9093"}, "alertmanager has no key(s) url; it takes urls,"),
            ({"urls": "http://a:9093"}, "alertmanager.urls must be a list"),
            ({"urls": ["ftp://a"]}, "alertmanager.urls[0] must start with http:// or https://"),
            ({"urls": ["http://:9093"]}, "alertmanager.urls[0] has no host"),
            ({"urls": ["http://u:p@a:9093"]}, "alertmanager.urls[0] must not carry user:password"),
            ({"urls": ["http://a:9093?x=1"]}, "alertmanager.urls[0] must not have a query"),
            ({"urls": ["http://a:99999"]}, "alertmanager.urls[0] has an invalid port"),
            ({"urls": ["http://a", "http://a/"]}, "alertmanager.urls names one Alertmanager twice"),
            ({"resend_interval": 0}, "alertmanager.resend_interval must be"),
            ({"timeout": "5s"}, "alertmanager.timeout must be"),
            ({"min_severity": "page"}, "alertmanager.min_severity must be one of info, warning"),
            ({"labels": {"a-b": "x"}}, "alertmanager.labels: a-b is not a label name"),
            ({"labels": {"node": "x"}}, "alertmanager.labels: node is set by fleetwatch itself"),
            ({"labels": {"cluster": ""}}, "alertmanager.labels.cluster must be a non-empty"),
            ({"labels": ["cluster"]}, "alertmanager.labels must be a table"),
            ({"external_url": "fleetwatch:9470"}, "alertmanager.external_url must start with"),
            ({"ca_file": 7}, "alertmanager.ca_file must be a non-empty string"),
            (
                {"bearer_token_file": "/t", "bearer_token_env": "T"},
                "takes alertmanager.bearer_token_file or alertmanager.bearer_token_env, not both",
            ),
            ({"bearer_token_env": "NOT A NAME"}, "alertmanager.bearer_token_env must name"),
        ],
    )
    def test_refused_naming_the_key(self, table, named):
        """A wrong value stops the start with a message naming the key (and its table)."""
        with pytest.raises(ConfigError, match=r"^(collector )?config: ") as caught:
            parse_alertmanager(table)
        assert named in str(caught.value)

    def test_the_collector_file_takes_the_table(self, tmp_path: Path):
        """``[collector.alertmanager]`` in a collector file; absent, nothing is sent."""
        path = tmp_path / "collector.toml"
        path.write_text(
            '[collector]\n[collector.alertmanager]\nurls = ["http://am:9093"]\n'
            'labels = { cluster = "a" }\n'
        )
        cfg = load_collector_config(path, {})
        assert cfg.alertmanager.urls == ("http://am:9093",)
        assert cfg.alertmanager.labels == {"cluster": "a"}
        path.write_text("[collector]\n")
        assert not load_collector_config(path, {}).alertmanager.enabled

    def test_forwards_by_severity(self):
        """min_severity and above are sent; an unknown severity is not."""
        cfg = AlertmanagerConfig(min_severity=Severity.WARNING)
        assert [cfg.forwards(s) for s in ("info", "warning", "critical", "page")] == [
            False,
            True,
            True,
            False,
        ]


class TestEndpoints:
    def test_token_from_a_file_or_the_environment(self, tmp_path: Path):
        """The token is read when the endpoints are built; one endpoint per URL."""
        token = tmp_path / "token"
        token.write_text("s3cret\n")
        cfg = parse_alertmanager(
            {"urls": ["http://a:9093", "http://b:9093"], "bearer_token_file": str(token)}
        )
        assert [e.url for e in cfg.endpoints({})] == ["http://a:9093", "http://b:9093"]
        by_env = parse_alertmanager({"urls": ["http://a:9093"], "bearer_token_env": "AM_TOKEN"})
        assert len(by_env.endpoints({"AM_TOKEN": "s3cret"})) == 1

    @pytest.mark.parametrize(
        ("keys", "environ", "named"),
        [
            ({"bearer_token_file": "missing"}, {}, "alertmanager.bearer_token_file"),
            ({"bearer_token_env": "AM_TOKEN"}, {}, "alertmanager.bearer_token_env"),
            ({"bearer_token_env": "AM_TOKEN"}, {"AM_TOKEN": "two words"}, "one word"),
            ({"ca_file": "missing.pem"}, {}, "alertmanager.ca_file"),
        ],
    )
    def test_unreadable_secrets_name_their_key(self, tmp_path: Path, keys, environ, named):
        """A token or CA that cannot be used stops the start (or fails the reload)."""
        table = {"urls": ["https://a:9093"]} | {
            k: str(tmp_path / v) if k.endswith("file") else v for k, v in keys.items()
        }
        with pytest.raises(ConfigError, match=named):
            parse_alertmanager(table).endpoints(environ)
