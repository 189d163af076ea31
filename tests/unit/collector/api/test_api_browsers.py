"""The Host, Origin and Content-Type checks the API runs on what a browser could send."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from collector.api.browsers import (
    HostNames,
    check_allowed_hosts,
    content_type_refusal,
    split_authority,
)
from collector.config import load_collector_config
from collector.exceptions import ConfigError

if TYPE_CHECKING:
    from pathlib import Path

NAMES = HostNames.build(
    listen_host="127.0.0.1", allowed=("fleet.example.com",), local_names=("ctl-1", "ctl-1.dc.")
)


class TestSplitAuthority:
    @pytest.mark.parametrize(
        ("header", "expected"),
        [
            ("localhost", ("localhost", None)),
            ("LocalHost:9470", ("localhost", 9470)),
            ("ctl-1.dc.:80", ("ctl-1.dc", 80)),
            ("[::1]:9470", ("::1", 9470)),
            ("[::1]", ("::1", None)),
            ("10.0.0.5:9470", ("10.0.0.5", 9470)),
        ],
    )
    def test_names_and_ports(self, header, expected):
        assert split_authority(header) == expected

    @pytest.mark.parametrize(
        "header", ["", "a:b", "a:123456", "::1", "[::1", "[evil]:80", "a b", "a/b", "[::1]x"]
    )
    def test_malformed(self, header):
        assert split_authority(header) is None


class TestHost:
    @pytest.mark.parametrize(
        "host",
        [
            None,
            "127.0.0.1:9470",
            "10.0.0.5",
            "[::1]:9470",
            "localhost:9470",
            "grafana.localhost",
            "CTL-1:9470",
            "ctl-1.dc",
            "fleet.example.com",
        ],
    )
    def test_the_collectors_names_pass(self, host):
        """IP addresses, localhost, the host's names, the configured ones, and no Host."""
        assert NAMES.host_refusal(host) is None

    @pytest.mark.parametrize(
        "host", ["evil.example:9470", "ctl-1.evil.example", "localhost.evil.example", "", "a b"]
    )
    def test_other_names_are_refused(self, host):
        """A rebound name (or garbage) is 403, reason bad_host, naming the key that admits it."""
        refusal = NAMES.host_refusal(host)
        assert refusal is not None
        assert (refusal.status, refusal.reason) == (403, "bad_host")
        assert "http_allowed_hosts" in refusal.message

    def test_a_star_admits_any_host(self):
        names = HostNames.build(listen_host="0.0.0.0", allowed=("*",))  # noqa: S104
        assert names.host_refusal("anything.example") is None
        # "*" opens Host, not Origin: a page of another origin is still refused
        assert names.origin_refusal("https://other.example", "anything.example") is not None

    def test_the_listen_name_is_one_of_ours(self):
        """``http = "collector.dc:9470"``: that name is answered without being listed."""
        names = HostNames.build(listen_host="collector.dc")
        assert names.host_refusal("collector.dc:9470") is None
        assert names.host_refusal("other.dc:9470") is not None


class TestOrigin:
    @pytest.mark.parametrize(
        ("origin", "host"),
        [
            (None, "127.0.0.1:9470"),
            ("http://127.0.0.1:9470", "127.0.0.1:9470"),
            ("http://LOCALHOST:9470", "localhost:9470"),
            ("https://ctl-1", "ctl-1"),
            ("http://ctl-1:80", "ctl-1"),
            ("http://[::1]:9470", "[::1]:9470"),
            ("https://fleet.example.com", "127.0.0.1:9470"),  # a proxy that rewrote Host
        ],
    )
    def test_no_origin_or_our_own_passes(self, origin, host):
        assert NAMES.origin_refusal(origin, host) is None

    @pytest.mark.parametrize(
        ("origin", "host"),
        [
            ("https://evil.example", "127.0.0.1:9470"),
            ("http://127.0.0.1:8080", "127.0.0.1:9470"),  # another port is another origin
            ("https://127.0.0.1:9470", "127.0.0.1"),  # https defaults to 443, not 80
            ("null", "127.0.0.1:9470"),
            ("file://", "127.0.0.1:9470"),
            ("http://127.0.0.1:99999", "127.0.0.1:9470"),
            ("http://127.0.0.1:9470/path", "127.0.0.1:9470"),
            ("http://127.0.0.1:9470", None),
        ],
    )
    def test_another_origin_is_refused(self, origin, host):
        refusal = NAMES.origin_refusal(origin, host)
        assert refusal is not None
        assert (refusal.status, refusal.reason) == (403, "cross_origin")


class TestContentType:
    @pytest.mark.parametrize(
        ("method", "ctype", "length"),
        [
            ("POST", "application/json", 2),
            ("POST", "application/json; charset=utf-8", 0),
            ("DELETE", None, 0),
            ("DELETE", "application/json", 2),
        ],
    )
    def test_json_passes(self, method, ctype, length):
        assert content_type_refusal(method, ctype, length) is None

    @pytest.mark.parametrize(
        ("method", "ctype", "length"),
        [
            ("POST", None, 0),
            ("POST", "text/plain", 2),
            ("POST", "application/x-www-form-urlencoded", 2),
            ("POST", "application/jsonp", 2),
            ("DELETE", "text/plain", 2),
        ],
    )
    def test_anything_else_is_415(self, method, ctype, length):
        refusal = content_type_refusal(method, ctype, length)
        assert refusal is not None
        assert (refusal.status, refusal.reason) == (415, "not_json")


class TestAllowedHostsKey:
    def test_a_toml_list_becomes_lower_case_names(self, tmp_path: Path):
        path = tmp_path / "collector.toml"
        path.write_text('[collector]\nhttp_allowed_hosts = ["Fleet.Example.com.", "10.1.2.3"]\n')
        cfg = load_collector_config(path, {})
        assert cfg.http_allowed_hosts == ("fleet.example.com", "10.1.2.3")

    @pytest.mark.parametrize(
        ("value", "says"),
        [
            ("fleet.example.com", "must be a list of host names"),
            (["https://fleet.example.com"], "without scheme or port"),
            (["fleet.example.com:443"], "without scheme or port"),
            ([""], "is not a host name"),
            ([7], "is not a host name"),
        ],
    )
    def test_a_bad_value_names_the_key(self, value, says):
        with pytest.raises(ValueError, match=says):
            check_allowed_hosts(value)

    def test_the_config_says_which_key(self, tmp_path: Path):
        path = tmp_path / "collector.toml"
        path.write_text('[collector]\nhttp_allowed_hosts = ["a b"]\n')
        with pytest.raises(ConfigError, match="collector config: http_allowed_hosts: 'a b'"):
            load_collector_config(path, {})
