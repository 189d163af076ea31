"""Real certificates for tests, made by fleetwatch's own `certs` code in a temporary folder."""

from __future__ import annotations

import datetime as dt
import shutil
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cli import issue_certs as certs

if TYPE_CHECKING:
    from pathlib import Path


@dataclass(frozen=True)
class Pki:
    """A CA in ``root/ca`` and the certificates it signed, in ``root``."""

    root: Path

    @property
    def ca_dir(self) -> Path:
        return self.root / "ca"

    @property
    def ca_cert(self) -> Path:
        return self.ca_dir / "ca.pem"

    def node(self, name: str) -> dict[str, Path]:
        """The agent's TLS keys for node ``name`` (its certificate is made on first use)."""
        cert = self.root / f"{name}.pem"
        if not cert.exists():
            certs.make_node(name, self.ca_dir, self.root, now())
        return {"tls_cert": cert, "tls_key": self.root / f"{name}.key", "tls_ca": self.ca_cert}

    def collector(self, hosts: str = "localhost,127.0.0.1") -> dict[str, Path]:
        """The collector's TLS keys for ``hosts`` (made on first use)."""
        first = hosts.split(",", maxsplit=1)[0]
        cert = self.root / f"collector-{first}.pem"
        if not cert.exists():
            certs.make_collector(hosts.split(","), self.ca_dir, self.root, now())
        return {
            "tls_cert": cert,
            "tls_key": self.root / f"collector-{first}.key",
            "tls_client_ca": self.ca_cert,
        }

    def install(self, etc_tls: Path, node: str) -> None:
        """Copy a node's and the collector's files under the names deploy/config uses."""
        etc_tls.mkdir(parents=True, exist_ok=True)
        agent, collector = self.node(node), self.collector()
        shutil.copy(self.ca_cert, etc_tls / "ca.pem")
        shutil.copy(agent["tls_cert"], etc_tls / "node.pem")
        shutil.copy(agent["tls_key"], etc_tls / "node.key")
        shutil.copy(collector["tls_cert"], etc_tls / "collector.pem")
        shutil.copy(collector["tls_key"], etc_tls / "collector.key")


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def make_pki(root: Path) -> Pki:
    """A fresh CA under ``root``."""
    certs.make_ca(root / "ca", now())
    return Pki(root)
