"""``fleetwatch certs ca|node|collector``: a development CA and the certificates mTLS needs.

``certs ca --out DIR`` makes the CA; ``certs node NAME --ca DIR --out DIR`` a node's client
certificate (the agent may report for NAME only); ``certs collector HOST[,IP...] --ca DIR --out
DIR`` the collector's server certificate for the names agents dial. Files are never overwritten.
"""

from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from fleetwatch.clock import SystemClock

if TYPE_CHECKING:
    import argparse
    from typing import TextIO

    from cli.issue_certs import Written
    from fleetwatch.clock import Clock


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``certs`` and its three subcommands to the ``fleetwatch`` parser."""
    certs = sub.add_parser(
        "certs", help="make a development CA and node/collector certificates for mTLS"
    )
    kinds = certs.add_subparsers(dest="certs_command", required=True)
    ca = kinds.add_parser("ca", help="a new CA: DIR/ca.pem and DIR/ca.key")
    ca.add_argument("--out", type=Path, required=True, metavar="DIR", help="where to write")
    ca.add_argument("--days", type=int, default=3650, help="validity (default 3650)")
    node = kinds.add_parser(
        "node", help="a node's client certificate: DIR/NAME.pem and DIR/NAME.key"
    )
    node.add_argument("name", help="the node name its agent reports as (the agent's node)")
    collector = kinds.add_parser(
        "collector",
        help="the collector's server certificate: DIR/collector-HOST.pem and .key",
    )
    collector.add_argument(
        "hosts", metavar="HOST[,IP...]", help="names and addresses agents use in `collector`"
    )
    for leaf in (node, collector):
        leaf.add_argument("--ca", type=Path, required=True, metavar="DIR", help="the CA's folder")
        leaf.add_argument("--out", type=Path, required=True, metavar="DIR", help="where to write")
        leaf.add_argument("--days", type=int, default=365, help="validity (default 365)")


def run(args: argparse.Namespace) -> int:
    """Make what ``args`` asks for; 0 on success (a CertError is the caller's one-line error)."""
    return make(args, SystemClock(), sys.stdout)


def make(args: argparse.Namespace, clock: Clock, out: TextIO) -> int:
    """Make the CA or certificate ``args.certs_command`` names and say what was written."""
    from cli import issue_certs as certs  # noqa: PLC0415 - cryptography loads only for this command

    now = dt.datetime.fromtimestamp(clock.now(), dt.UTC)
    written: Written
    if args.certs_command == "ca":
        written = certs.make_ca(args.out, now, days=args.days)
    elif args.certs_command == "node":
        written = certs.make_node(args.name, args.ca, args.out, now, days=args.days)
    else:
        hosts = [h.strip() for h in args.hosts.split(",") if h.strip()]
        written = certs.make_collector(hosts, args.ca, args.out, now, days=args.days)
    print(
        f"wrote {written.cert} (valid until {written.not_after:%Y-%m-%d}) "
        f"and {written.key} (mode 0600)",
        file=out,
    )
    return 0
