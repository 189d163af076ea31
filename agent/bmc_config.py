"""The agent's ``[agent.bmc]`` table: its checks, and the BMC source it opens.

Credentials come from files (like the collector's secrets and the agent's TLS keys), never from
the config text or the command line: ``username_file`` and ``password_file``, read once at
start. IPMI hands ``ipmitool`` the password file itself (``-f``), so the password is never in any
process's arguments. Messages name the key and the file, never what it holds.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Final

from agent.exceptions import ConfigError
from fleetwatch.config_file import check_number, check_text, short_repr, shown_path, to_path

if TYPE_CHECKING:
    from pathlib import Path

    from agent.sources.bmc import BmcSource

WHAT: Final = "agent config [agent.bmc]"
PROTOCOLS: Final = ("redfish", "ipmi")
DEFAULT_PORTS: Final = {"redfish": 443, "ipmi": 623}
MAX_PSUS: Final = 64
CIPHER_SUITES: Final = range(18)  # IPMI 2.0's RMCP+ suites (ipmitool -C)
_PATHS: Final = ("username_file", "password_file", "tls_ca")


@dataclass(frozen=True, slots=True)
class BmcConfig:
    """Which BMC to read, how, and with which credentials' files. Times in seconds."""

    protocol: str
    address: str  # host or host:port (Redfish 443, IPMI 623)
    username_file: Path
    password_file: Path
    interval: float = 30.0
    timeout: float = 20.0  # one whole read (every request of it) at most
    tls_ca: Path | None = None  # the CA (or the BMC's own certificate) Redfish TLS trusts
    tls_insecure: bool = False  # no TLS verification at all: the operator must ask for it
    psus_needed: int = 0  # working supplies the node needs; 0: the BMC's word, or all but one
    ipmitool: str = "ipmitool"
    # IPMI: the RMCP+ cipher suite (ipmitool -C). 17 (HMAC-SHA256, AES) as ipmitool; 3 (SHA1)
    # for older BMCs that offer nothing better.
    cipher_suite: int = 17

    def __post_init__(self) -> None:
        """Refuse values that cannot work, naming the key."""
        if self.protocol not in PROTOCOLS:
            msg = f'{WHAT}: protocol must be "redfish" or "ipmi", got {short_repr(self.protocol)}'
            raise ConfigError(msg)
        check_text(self.address, "address", WHAT, ConfigError)
        split_address(self.address, self.protocol)
        for key in ("interval", "timeout"):
            check_number(getattr(self, key), f"[agent.bmc] {key}", ConfigError)
        needed: object = self.psus_needed
        if isinstance(needed, bool) or not isinstance(needed, int) or not 0 <= needed <= MAX_PSUS:
            msg = f"{WHAT}: psus_needed must be 0 to {MAX_PSUS}, got {short_repr(needed)}"
            raise ConfigError(msg)
        insecure: object = self.tls_insecure  # TOML may give anything
        if not isinstance(insecure, bool):
            msg = f"{WHAT}: tls_insecure must be true or false, got {short_repr(insecure)}"
            raise ConfigError(msg)
        if self.tls_ca is not None and self.tls_insecure:
            msg = f"{WHAT}: takes tls_ca or tls_insecure = true, not both"
            raise ConfigError(msg)
        check_text(self.ipmitool, "ipmitool", WHAT, ConfigError)
        suite: object = self.cipher_suite
        if isinstance(suite, bool) or suite not in CIPHER_SUITES:
            msg = f"{WHAT}: cipher_suite must be 0 to 17, got {short_repr(suite)}"
            raise ConfigError(msg)


def parse_bmc(raw: object) -> BmcConfig:
    """The ``[agent.bmc]`` table as a :class:`BmcConfig`; ConfigError naming what is wrong."""
    if not isinstance(raw, dict):
        msg = f"agent config: bmc must be a table ([agent.bmc]), got {short_repr(raw)}"
        raise ConfigError(msg)
    known = {f.name for f in fields(BmcConfig)}
    unknown = sorted(str(k)[:40] for k in raw if k not in known)
    if unknown:
        msg = f"{WHAT}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        raise ConfigError(msg)
    values: dict[str, Any] = dict(raw)
    for key in ("protocol", "address", "username_file", "password_file"):
        if key not in values:
            msg = f"{WHAT}: {key} is missing"
            raise ConfigError(msg)
    for key in _PATHS:
        if values.get(key) is not None:
            values[key] = to_path(values[key], key, WHAT, ConfigError)
    return BmcConfig(**values)


def split_address(address: str, protocol: str) -> tuple[str, int]:
    """``host`` or ``host:port`` (``[v6]:port``) with the protocol's default port."""
    host, port = address, DEFAULT_PORTS.get(protocol, 443)
    if address.startswith("["):
        host, _, rest = address[1:].partition("]")
        if rest.startswith(":"):
            port = _port(rest[1:], address)
    elif address.count(":") == 1:
        host, _, text = address.partition(":")
        port = _port(text, address)
    if not host or any(c.isspace() or c in "/@?#" for c in host):
        msg = f"{WHAT}: address {short_repr(address)} is not a host or host:port"
        raise ConfigError(msg)
    return host, port


def _port(text: str, address: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:  # noqa: PLR2004 - TCP's ports
        msg = f"{WHAT}: address {short_repr(address)} has no valid port"
        raise ConfigError(msg)
    return int(text)


def read_credential(path: Path, key: str) -> str:
    """A credential from its file (whitespace around it dropped); ConfigError naming the key."""
    try:
        value = path.read_text("utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        why = getattr(exc, "strerror", None) or "not UTF-8 text"
        msg = f"{WHAT}: {key} {shown_path(path)}: {why}"
        raise ConfigError(msg) from exc
    if not value:
        msg = f"{WHAT}: {key} {shown_path(path)} is empty"
        raise ConfigError(msg)
    return value


def open_bmc(cfg: BmcConfig | None) -> BmcSource | None:
    """The BMC source ``cfg`` asks for (None: none), its credentials read from their files."""
    if cfg is None:
        return None
    host, port = split_address(cfg.address, cfg.protocol)
    username = read_credential(cfg.username_file, "username_file")
    password = read_credential(cfg.password_file, "password_file")
    if cfg.protocol == "ipmi":
        from agent.sources.bmc_ipmi import IpmiBmc  # noqa: PLC0415 - only where IPMI is used

        del password  # read to check it is there; ipmitool reads the file itself
        return IpmiBmc(
            host,
            port,
            username,
            cfg.password_file,
            program=cfg.ipmitool,
            cipher_suite=cfg.cipher_suite,
            timeout_s=cfg.timeout,
        )
    from agent.sources.bmc_redfish import HttpsTransport, RedfishBmc  # noqa: PLC0415

    try:
        transport = HttpsTransport(
            host,
            port,
            username,
            password,
            ca_file=cfg.tls_ca,
            insecure=cfg.tls_insecure,
            timeout_s=cfg.timeout,
        )
    except (OSError, ssl.SSLError) as exc:  # the CA file: missing, or no certificate in it
        shown = shown_path(cfg.tls_ca) if cfg.tls_ca else "the system's CAs"
        msg = f"{WHAT}: tls_ca {shown}: cannot load: {exc}"
        raise ConfigError(msg) from exc
    return RedfishBmc(transport, cfg.address)
