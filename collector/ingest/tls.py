"""The collector's gRPC credentials: mTLS from its config, or plaintext where that is allowed.

Plaintext is allowed on a loopback address (the demo, tests) and, on any other address, only when
the operator says ``insecure = true``. With TLS every agent must present a certificate signed by
``tls_client_ca``; the session then lets it speak only for the node its certificate names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc

from collector.config import split_host_port
from collector.exceptions import ConfigError
from fleetwatch.tls import TlsMaterial, is_loopback, load_tls

if TYPE_CHECKING:
    from collector.config import CollectorConfig


def tls_material(cfg: CollectorConfig) -> TlsMaterial | None:
    """Read the TLS files ``cfg`` names; None for plaintext. ConfigError says what is wrong."""
    if cfg.tls_cert is None or cfg.tls_key is None or cfg.tls_client_ca is None:
        host, _ = split_host_port(cfg.listen, "listen")
        if not (is_loopback(host) or cfg.insecure):
            msg = (
                f"collector config: listen {cfg.listen} is not a loopback address and no TLS is "
                "configured; set tls_cert, tls_key and tls_client_ca (docs/deploy.md), or "
                "insecure = true to take plaintext gRPC from anyone who can reach the port"
            )
            raise ConfigError(msg)
        return None
    return load_tls(
        ("tls_cert", cfg.tls_cert),
        ("tls_key", cfg.tls_key),
        ("tls_client_ca", cfg.tls_client_ca),
        what="collector config",
        error=ConfigError,
    )


def server_credentials(cfg: CollectorConfig) -> grpc.ServerCredentials | None:
    """MTLS server credentials that require a client certificate, or None for plaintext."""
    material = tls_material(cfg)
    if material is None:
        return None
    return grpc.ssl_server_credentials(
        [(material.key, material.cert_chain)],
        root_certificates=material.ca,
        require_client_auth=True,
    )
