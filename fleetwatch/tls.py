"""mTLS material for the agent-collector stream, read and checked the same way by both daemons.

A daemon reads its certificate (chain), its private key and the CA it trusts for the other side
once, at start: every file must be readable PEM, the key must belong to the certificate, and
problems raise the caller's error naming the config key and the file. ``fleetwatch config check``
runs the same code and also says when a certificate has expired or is not yet valid.

Rotation is a restart: the files are read only when the daemon starts.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import PurePath
from typing import TYPE_CHECKING

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import NameOID

if TYPE_CHECKING:
    from pathlib import Path


@dataclass(frozen=True, slots=True)
class TlsMaterial:
    """One side's PEM bytes as gRPC takes them, and the leaf certificate's validity window."""

    cert_chain: bytes
    key: bytes
    ca: bytes
    not_before: dt.datetime
    not_after: dt.datetime
    names: tuple[str, ...] = ()  # the identity gRPC reports for the certificate (see below)

    def validity_problem(self, now_unix: float, key: str) -> str | None:
        """Say why the certificate is unusable at ``now_unix`` (expired, not yet valid), or None."""
        now = dt.datetime.fromtimestamp(now_unix, dt.UTC)
        if now >= self.not_after:
            return f"{key}: the certificate expired on {self.not_after:%Y-%m-%d %H:%M} UTC"
        if now < self.not_before:
            return (
                f"{key}: the certificate is not valid before {self.not_before:%Y-%m-%d %H:%M} UTC"
            )
        return None


def check_tls_keys(
    values: dict[str, object], *, insecure: object, what: str, error: type[Exception]
) -> None:
    """Raise ``error`` unless the TLS path keys are all set or all unset, and not with insecure.

    ``values`` maps each TLS key to its value (a Path, or None when unset).
    """
    if not isinstance(insecure, bool):
        msg = f"{what}: insecure must be true or false, got {insecure!r}"
        raise error(msg)
    for key, value in values.items():
        if value is not None and not isinstance(value, PurePath):
            msg = f"{what}: {key} must be a file path, got {value!r}"
            raise error(msg)
    missing = [k for k, v in values.items() if v is None]
    if missing and len(missing) < len(values):
        verb = "is" if len(missing) == 1 else "are"
        msg = f"{what}: {', '.join(values)} go together; {', '.join(missing)} {verb} missing"
        raise error(msg)
    if insecure and not missing:
        msg = f"{what}: insecure = true and {', '.join(values)} are all set; choose one"
        raise error(msg)


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1); names are not resolved."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def load_tls(
    cert: tuple[str, Path],
    key: tuple[str, Path],
    ca: tuple[str, Path],
    *,
    what: str,
    error: type[Exception],
) -> TlsMaterial:
    """Read and check (config key, path) of the certificate, its key and the trusted CA.

    ``what`` starts every message (``"collector config"``); problems raise ``error``.
    """
    cert_pem = _read(cert, what, error)
    key_pem = _read(key, what, error)
    ca_pem = _read(ca, what, error)
    chain = _certificates(cert_pem, cert, what, error)
    _certificates(ca_pem, ca, what, error)
    try:
        private = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as exc:
        msg = f"{what}: {key[0]} {key[1]}: not an unencrypted PEM private key ({exc})"
        raise error(msg) from exc
    leaf = chain[0]
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    der = serialization.Encoding.DER
    if private.public_key().public_bytes(der, public) != leaf.public_key().public_bytes(
        der, public
    ):
        msg = f"{what}: {key[0]} {key[1]} is not the key of the certificate in {cert[0]} {cert[1]}"
        raise error(msg)
    return TlsMaterial(
        cert_chain=cert_pem,
        key=key_pem,
        ca=ca_pem,
        not_before=leaf.not_valid_before_utc,
        not_after=leaf.not_valid_after_utc,
        names=certificate_names(leaf),
    )


def certificate_names(cert: x509.Certificate) -> tuple[str, ...]:
    """The names a peer with ``cert`` is known by, as gRPC's ``peer_identities()`` gives them.

    Its DNS names and IP addresses when it has subject alternative names, else its Common Name.
    """
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        sans = x509.SubjectAlternativeName([])
    names = [*sans.get_values_for_type(x509.DNSName)]
    names += [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)]
    if len(sans) == 0:
        names = [
            str(attr.value) for attr in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        ]
    return tuple(names)


def _read(item: tuple[str, Path], what: str, error: type[Exception]) -> bytes:
    name, path = item
    try:
        return path.read_bytes()
    except OSError as exc:
        msg = f"{what}: {name} {path}: {exc.strerror}"
        raise error(msg) from exc


def _certificates(
    pem: bytes, item: tuple[str, Path], what: str, error: type[Exception]
) -> list[x509.Certificate]:
    try:
        return x509.load_pem_x509_certificates(pem)
    except ValueError as exc:
        msg = f"{what}: {item[0]} {item[1]}: no PEM certificate in it"
        raise error(msg) from exc
