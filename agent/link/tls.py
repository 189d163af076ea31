"""The agent's gRPC credentials: mTLS from its config, or plaintext where that is allowed.

Plaintext is allowed to a loopback collector (the demo, tests) and, to any other, only when the
operator says ``insecure = true``; with several collectors, every one must be loopback. With TLS
the agent presents its node certificate, which must name the agent's ``node``, and checks each
collector's certificate against ``tls_ca``: for the host the agent connects to (each entry of
``collectors`` its own), or for ``tls_server_name`` when set, whichever collector it is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc

from agent.exceptions import ConfigError
from fleetwatch.tls import TlsMaterial, is_loopback, load_tls

if TYPE_CHECKING:
    from agent.config import AgentConfig


def tls_material(cfg: AgentConfig) -> TlsMaterial | None:
    """Read the TLS files ``cfg`` names; None for plaintext. ConfigError says what is wrong."""
    if cfg.tls_cert is None or cfg.tls_key is None or cfg.tls_ca is None:
        remote = [t for t in cfg.targets if not is_loopback(t.rpartition(":")[0])]
        if remote and not cfg.insecure:
            msg = (
                f"agent config: collector {remote[0]} is not a loopback address and no TLS "
                "is configured; set tls_cert, tls_key and tls_ca (docs/deploy.md), or "
                "insecure = true to send plaintext gRPC that anyone on the path can read or forge"
            )
            raise ConfigError(msg)
        return None
    material = load_tls(
        ("tls_cert", cfg.tls_cert),
        ("tls_key", cfg.tls_key),
        ("tls_ca", cfg.tls_ca),
        what="agent config",
        error=ConfigError,
    )
    if cfg.node not in material.names:
        # The collector would refuse every Hello: say so now, naming both sides.
        shown = ", ".join(material.names) or "no name"
        msg = (
            f"agent config: tls_cert {cfg.tls_cert} is for {shown}, not for node {cfg.node} "
            "(the collector accepts only the node its certificate names)"
        )
        raise ConfigError(msg)
    return material


def channel_credentials(cfg: AgentConfig) -> grpc.ChannelCredentials | None:
    """MTLS channel credentials with this node's certificate, or None for plaintext."""
    material = tls_material(cfg)
    if material is None:
        return None
    return grpc.ssl_channel_credentials(
        root_certificates=material.ca,
        private_key=material.key,
        certificate_chain=material.cert_chain,
    )
