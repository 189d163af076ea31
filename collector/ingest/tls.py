"""The collector's gRPC credentials: mTLS from its config, or plaintext where that is allowed.

Plaintext is allowed on a loopback address (the demo, tests) and, on any other address, only when
the operator says ``insecure = true``. With TLS every agent must present a certificate signed by
``tls_client_ca``; the session then lets it speak only for the node its certificate names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc

from collector.exceptions import ConfigError
from fleetwatch.tls import TlsMaterial, is_loopback, load_tls

if TYPE_CHECKING:
    from pathlib import Path


@dataclass(frozen=True, slots=True)
class ServerTls:
    """The gRPC listener's TLS keys of ``[collector]``: all three files, or none."""

    listen: str  # host:port, as configured
    host: str  # its host part
    cert: Path | None = None  # tls_cert
    key: Path | None = None  # tls_key
    client_ca: Path | None = None  # tls_client_ca
    insecure: bool = False


def tls_material(cfg: ServerTls) -> TlsMaterial | None:
    """Read the TLS files ``cfg`` names; None for plaintext. ConfigError says what is wrong."""
    if cfg.cert is None or cfg.key is None or cfg.client_ca is None:
        if not (is_loopback(cfg.host) or cfg.insecure):
            msg = (
                f"collector config: listen {cfg.listen} is not a loopback address and no TLS is "
                "configured; set tls_cert, tls_key and tls_client_ca (docs/deploy.md), or "
                "insecure = true to take plaintext gRPC from anyone who can reach the port"
            )
            raise ConfigError(msg)
        return None
    return load_tls(
        ("tls_cert", cfg.cert),
        ("tls_key", cfg.key),
        ("tls_client_ca", cfg.client_ca),
        what="collector config",
        error=ConfigError,
    )


def server_credentials(cfg: ServerTls) -> grpc.ServerCredentials | None:
    """MTLS server credentials that require a client certificate, or None for plaintext."""
    material = tls_material(cfg)
    if material is None:
        return None
    return grpc.ssl_server_credentials(
        [(material.key, material.cert_chain)],
        root_certificates=material.ca,
        require_client_auth=True,
    )
