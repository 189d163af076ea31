"""A development certificate authority for the agent-collector stream (``fleetwatch certs``).

Three kinds of file pairs, each a PEM certificate (mode 0644) and an unencrypted PKCS#8 EC P-256
key (mode 0600):

- ``ca.pem`` / ``ca.key``: a self-signed CA that may sign end certificates only (path length 0).
- ``NAME.pem`` / ``NAME.key``: a node's client certificate. The node name is its Common Name and
  its only DNS subject alternative name; the collector lets the agent speak for that node alone.
- ``collector-HOST.pem`` / ``.key``: the collector's server certificate, with every host name and
  IP address agents dial as subject alternative names (the first is also the Common Name).

Nothing is ever overwritten: a pair whose files exist is refused before either is written.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fleetwatch.wire.validate import NODE_NAME

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

CA_DAYS: Final = 3650
LEAF_DAYS: Final = 365
# Certificates start a little in the past, so a node whose clock lags still accepts them.
BACKDATE: Final = dt.timedelta(minutes=5)
CA_STEM: Final = "ca"
MAX_COMMON_NAME: Final = 64  # X.509's upper bound (ub-common-name)
_HOST_NAME: Final = re.compile(
    r"(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*"
)


class CertError(ValueError):
    """A certificate could not be made: bad name, missing CA, a file already there."""


@dataclass(frozen=True, slots=True)
class Written:
    """The files one command wrote."""

    cert: Path
    key: Path
    not_after: dt.datetime


@dataclass(frozen=True, slots=True)
class _Authority:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey


def make_ca(out: Path, now: dt.datetime, *, days: int = CA_DAYS) -> Written:
    """Write a new CA as ``out/ca.pem`` and ``out/ca.key``."""
    _check_days(days)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fleetwatch development CA")])
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    usage = x509.KeyUsage(
        digital_signature=False,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=True,
        crl_sign=True,
        encipher_only=False,
        decipher_only=False,
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(usage, critical=True)
        .add_extension(ski, critical=False)
        .sign(key, hashes.SHA256())
    )
    return _write_pair(out, CA_STEM, cert, key)


def make_node(
    name: str, ca_dir: Path, out: Path, now: dt.datetime, *, days: int = LEAF_DAYS
) -> Written:
    """Write node ``name``'s client certificate and key as ``out/NAME.pem`` and ``out/NAME.key``."""
    if not NODE_NAME.fullmatch(name) or len(name) > MAX_COMMON_NAME:
        msg = (
            f"node name {name!r} is not a host name of at most {MAX_COMMON_NAME} characters "
            "(letters, digits, '.', '_', '-')"
        )
        raise CertError(msg)
    _check_days(days)
    authority = _load_ca(ca_dir)
    sans: list[x509.GeneralName] = [x509.DNSName(name)]
    usage = ExtendedKeyUsageOID.CLIENT_AUTH
    cert, key = _issue(authority, name, sans, usage, now=now, days=days)
    return _write_pair(out, name, cert, key)


def make_collector(
    names: Sequence[str], ca_dir: Path, out: Path, now: dt.datetime, *, days: int = LEAF_DAYS
) -> Written:
    """Write the collector's server certificate for host ``names`` (names or IP addresses).

    The files are ``out/collector-FIRST.pem`` and ``.key``, FIRST being the first name.
    """
    if not names:
        msg = "name at least one host name or IP address agents use to reach the collector"
        raise CertError(msg)
    if len(names[0]) > MAX_COMMON_NAME:
        msg = f"the first name {names[0]!r} is longer than {MAX_COMMON_NAME} characters"
        raise CertError(msg)
    sans: list[x509.GeneralName] = []
    for host in names:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            if not _HOST_NAME.fullmatch(host):
                msg = f"{host!r} is neither a host name nor an IP address"
                raise CertError(msg) from None
            sans.append(x509.DNSName(host))
    _check_days(days)
    authority = _load_ca(ca_dir)
    usage = ExtendedKeyUsageOID.SERVER_AUTH
    cert, key = _issue(authority, names[0], sans, usage, now=now, days=days)
    return _write_pair(out, f"collector-{names[0]}", cert, key)


def _check_days(days: int) -> None:
    if days < 1:
        msg = f"validity must be at least 1 day, not {days}"
        raise CertError(msg)


def _issue(  # noqa: PLR0913 - what a certificate is made of
    authority: _Authority,
    common_name: str,
    sans: list[x509.GeneralName],
    purpose: x509.ObjectIdentifier,
    *,
    now: dt.datetime,
    days: int,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    not_after = min(now + dt.timedelta(days=days), authority.cert.not_valid_after_utc)
    usage = x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=False,
        crl_sign=False,
        encipher_only=False,
        decipher_only=False,
    )
    ca_ski = authority.cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(authority.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(usage, critical=True)
        .add_extension(x509.ExtendedKeyUsage([purpose]), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski.value),
            critical=False,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(authority.key, hashes.SHA256())
    )
    return cert, key


def _load_ca(ca_dir: Path) -> _Authority:
    cert_path, key_path = ca_dir / f"{CA_STEM}.pem", ca_dir / f"{CA_STEM}.key"
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except OSError as exc:
        msg = f"cannot read the CA: {exc.filename}: {exc.strerror} (make one with `certs ca`)"
        raise CertError(msg) from exc
    except (ValueError, TypeError) as exc:
        msg = f"{ca_dir}: ca.pem and ca.key are not a PEM certificate and unencrypted key: {exc}"
        raise CertError(msg) from exc
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        msg = f"{key_path}: not an EC key (fleetwatch certs makes EC P-256 CAs)"
        raise CertError(msg)
    try:
        cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier)
    except x509.ExtensionNotFound as exc:
        msg = f"{cert_path}: no subject key identifier; not a CA fleetwatch certs made"
        raise CertError(msg) from exc
    return _Authority(cert, key)


def _write_pair(
    out: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> Written:
    cert_path, key_path = out / f"{stem}.pem", out / f"{stem}.key"
    taken = [str(p) for p in (cert_path, key_path) if p.exists() or p.is_symlink()]
    if taken:
        msg = f"refusing to overwrite {' and '.join(taken)}; choose another --out"
        raise CertError(msg)
    try:
        out.mkdir(mode=0o755, parents=True, exist_ok=True)
    except OSError as exc:
        msg = f"cannot create {out}: {exc.strerror}"
        raise CertError(msg) from exc
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    _write_new(key_path, key_pem, 0o600)
    try:
        _write_new(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    except CertError:
        key_path.unlink()
        raise
    return Written(cert=cert_path, key=key_path, not_after=cert.not_valid_after_utc)


def _write_new(path: Path, data: bytes, mode: int) -> None:
    """Create ``path`` (never replacing a file) with exactly ``mode``, whatever the umask."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    except FileExistsError as exc:
        msg = f"refusing to overwrite {path}"
        raise CertError(msg) from exc
    except OSError as exc:
        msg = f"cannot create {path}: {exc.strerror}"
        raise CertError(msg) from exc
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), mode)
        f.write(data)
