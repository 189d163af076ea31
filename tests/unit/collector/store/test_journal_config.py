"""The journal keys of [collector]: a PostgreSQL connection string, its password, the name."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from collector.config import CollectorConfig, load_collector_config
from collector.exceptions import ConfigError

if TYPE_CHECKING:
    from pathlib import Path


def write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "collector.toml"
    path.write_text(f"[collector]\n{body}\n")
    return path


class TestJournalKeys:
    def test_dsn_selects_postgresql_and_password_comes_from_a_file(self, tmp_path: Path):
        (tmp_path / "pw").write_text("s3cret\n")
        cfg = load_collector_config(
            write(
                tmp_path,
                'journal_dsn = "postgresql://fw@db.example:5432/fleetwatch"\n'
                f'journal_password_file = "{tmp_path / "pw"}"\nname = "collector-a"',
            ),
            {},
        )
        assert cfg.journal_dsn == "postgresql://fw@db.example:5432/fleetwatch"
        assert cfg.journal_config().password({}) == "s3cret"
        assert cfg.collector_name() == "collector-a"

    def test_password_from_the_environment(self):
        cfg = CollectorConfig(journal_dsn="host=db dbname=fw", journal_password_env="FW_PG")  # noqa: S106
        assert cfg.journal_config().password({"FW_PG": "pw"}) == "pw"
        with pytest.raises(ConfigError, match="FW_PG"):
            cfg.journal_config().password({})

    @pytest.mark.parametrize(
        ("body", "message"),
        [
            ('journal_dsn = "postgresql://fw:hunter2@db/fw"', "must not hold the password"),
            ('journal_dsn = "host=db password=hunter2"', "must not hold the password"),
            ('journal_dsn = "host=db dbname"', "not a valid PostgreSQL connection string"),
            ('journal_dsn = ""', "journal_dsn must be a PostgreSQL connection string"),
            ("journal_dsn = 5", "journal_dsn must be a PostgreSQL connection string"),
            ('journal_password_env = "X"', "journal_dsn is not"),
            (
                'journal_dsn = "host=db"\njournal_password_env = "X"\njournal_password_file = "/p"',
                "not both",
            ),
            ('journal_dsn = "host=db"\njournal_password_env = "1x"', "environment variable"),
            ('name = "has space"', "name must be"),
            ("name = 3", "name must be"),
        ],
    )
    def test_bad_values_name_the_key_and_never_echo_a_password(
        self, tmp_path: Path, body: str, message: str
    ):
        with pytest.raises(ConfigError, match=message) as err:
            load_collector_config(write(tmp_path, body), {})
        assert "hunter2" not in str(err.value)

    def test_default_name_is_host_and_grpc_port(self):
        name = CollectorConfig(listen="127.0.0.1:7171").collector_name()
        assert name.endswith(":7171")
        assert len(name) > len(":7171")
