"""The [agent.bmc] table: checks, credentials from files, and the source it opens."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from agent.bmc_config import open_bmc, split_address
from agent.config import load_agent_config
from agent.exceptions import ConfigError
from agent.sources.bmc_ipmi import IpmiBmc
from agent.sources.bmc_redfish import RedfishBmc
from cli.main import main

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path


def config_file(tmp_path: Path, table: str) -> Path:
    (tmp_path / "user").write_text("fleetwatch\n")
    (tmp_path / "password").write_text("s3cret-bmc\n")
    (tmp_path / "password").chmod(0o600)
    path = tmp_path / "agent.toml"
    path.write_text(
        '[agent]\ncollector = "127.0.0.1:7070"\n[agent.bmc]\n'
        f'username_file = "{tmp_path / "user"}"\npassword_file = "{tmp_path / "password"}"\n'
        + table
    )
    return path


class TestTable:
    def test_a_redfish_bmc_opens_with_its_files_credentials(self, tmp_path: Path):
        cfg = load_agent_config(
            config_file(tmp_path, 'protocol = "redfish"\naddress = "10.0.0.5:8443"\n'), {}
        )
        assert cfg.bmc is not None
        assert (cfg.bmc.interval, cfg.bmc.timeout, cfg.bmc.tls_insecure) == (30.0, 20.0, False)
        source = open_bmc(cfg.bmc)
        assert isinstance(source, RedfishBmc)
        assert source.address == "10.0.0.5:8443"

    def test_ipmi_hands_ipmitool_the_password_file_not_the_password(self, tmp_path: Path):
        ran: list[list[str]] = []

        def record(argv: Sequence[str], _timeout: float) -> str:
            ran.append(list(argv))
            return ""

        cfg = load_agent_config(
            config_file(tmp_path, 'protocol = "ipmi"\naddress = "bmc-17"\n'), {}
        )
        assert cfg.bmc is not None
        source = open_bmc(cfg.bmc)
        assert isinstance(source, IpmiBmc)
        fake = IpmiBmc(
            "bmc-17",
            623,
            "fleetwatch",
            cfg.bmc.password_file,
            run=record,
        )
        fake.read()
        assert all("s3cret-bmc" not in arg for argv in ran for arg in argv)
        assert ran[0][ran[0].index("-f") + 1] == str(tmp_path / "password")
        assert ran[0][:9] == ["ipmitool", "-I", "lanplus", "-C", "17", "-L", "USER", "-H", "bmc-17"]

    @pytest.mark.parametrize(
        ("table", "message"),
        [
            ('protocol = "snmp"\naddress = "h"\n', 'protocol must be "redfish" or "ipmi"'),
            ('protocol = "redfish"\n', "address is missing"),
            ('protocol = "redfish"\naddress = "h:99999"\n', "has no valid port"),
            ('protocol = "redfish"\naddress = "user@h"\n', "is not a host or host:port"),
            ('protocol = "redfish"\naddress = "h"\ninterval = 0\n', "interval must be a number"),
            ('protocol = "redfish"\naddress = "h"\npassword = "x"\n', "unknown key(s) password"),
            (
                'protocol = "redfish"\naddress = "h"\ntls_insecure = true\ntls_ca = "/x.pem"\n',
                "takes tls_ca or tls_insecure = true, not both",
            ),
            ('protocol = "redfish"\naddress = "h"\ntls_insecure = "yes"\n', "true or false"),
            ('protocol = "ipmi"\naddress = "h"\npsus_needed = -1\n', "psus_needed must be 0 to"),
            ('protocol = "ipmi"\naddress = "h"\ncipher_suite = 18\n', "cipher_suite must be 0"),
        ],
    )
    def test_bad_settings_are_refused_naming_the_key(self, tmp_path: Path, table, message):
        with pytest.raises(ConfigError, match=r"\[agent\.bmc\]") as caught:
            load_agent_config(config_file(tmp_path, table), {})
        assert message in str(caught.value)

    def test_a_missing_or_empty_credential_file_is_named_not_shown(self, tmp_path: Path):
        path = config_file(tmp_path, 'protocol = "redfish"\naddress = "h"\n')
        cfg = load_agent_config(path, {})
        (tmp_path / "password").write_text("\n")
        with pytest.raises(ConfigError, match=r"password_file .*password is empty"):
            open_bmc(cfg.bmc)
        (tmp_path / "user").unlink()
        with pytest.raises(ConfigError, match="username_file"):
            open_bmc(cfg.bmc)

    def test_a_ca_file_that_holds_no_certificate_is_a_config_error(self, tmp_path: Path):
        (tmp_path / "ca.pem").write_text("not a certificate\n")
        table = f'protocol = "redfish"\naddress = "h"\ntls_ca = "{tmp_path / "ca.pem"}"\n'
        cfg = load_agent_config(config_file(tmp_path, table), {})
        with pytest.raises(ConfigError, match=r"tls_ca .* cannot load"):
            open_bmc(cfg.bmc)

    def test_addresses(self):
        assert split_address("bmc", "ipmi") == ("bmc", 623)
        assert split_address("[fd00::5]:8443", "redfish") == ("fd00::5", 8443)
        assert split_address("10.0.0.1", "redfish") == ("10.0.0.1", 443)


class TestConfigCheck:
    def test_the_check_reads_the_credentials_and_warns_of_an_open_password_file(
        self, tmp_path: Path, capsys
    ):
        path = config_file(tmp_path, 'protocol = "redfish"\naddress = "10.0.0.5"\n')
        assert main(["config", "check", str(path)]) == 0
        out = capsys.readouterr().out
        assert "BMC redfish 10.0.0.5" in out
        (tmp_path / "password").chmod(0o644)
        main(["config", "check", str(path)])
        captured = capsys.readouterr()
        assert "[agent.bmc] password_file" in captured.out + captured.err
        assert "s3cret" not in captured.out + captured.err
        (tmp_path / "user").unlink()
        assert main(["config", "check", str(path)]) != 0
        assert "username_file" in capsys.readouterr().err
