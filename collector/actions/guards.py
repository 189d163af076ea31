"""What actions hand to other programs: fleetwatch's own words and checked names, nothing else.

A drain reason (it becomes an ``scontrol`` argument and a webhook field), a webhook's idempotency
key (an HTTP header) and the GPU a reset names are built here from fixed strings and from names
the wire contract checked when the agent said hello: the node name, target keys made of GPU
indexes, NVLink numbers and the IB device names the Hello declared, snake_case rule names, and
incident ids made of those. Every part is checked again against a strict pattern, so that no bug
upstream can slip an event's detail, a kernel log line, a sample's text or a label a job chose
into a command line or a header. Telemetry text reaches receivers only as JSON data (a
notification's ``evidence``).

A part that fails its pattern raises :class:`UnsafeArgumentError` naming it; the dispatcher
journals the action as ``refused`` and runs nothing.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Final

from collector.actions.slurm import is_single_node_name
from collector.exceptions import CollectorError
from fleetwatch.wire.validate import NODE_NAME
from rules.loader import REASON_NOTE, RULE_NAME

__all__ = [
    "REASON_PREFIX",
    "TargetRef",
    "UnsafeArgumentError",
    "check_node",
    "delivery_key",
    "drain_reason",
    "parse_target",
]

REASON_PREFIX: Final = "fleetwatch:"
# A target key below its node: a GPU, one of its NVLinks, or an IB port
# (collector.model.target_keys).
_BELOW_NODE = re.compile(
    r"/gpu/(?P<gpu>\d{1,3})(?:/nvlink/(?P<link>\d{1,3}))?"
    r"|/ib/(?P<device>[A-Za-z0-9][A-Za-z0-9_.-]{0,63})/(?P<port>\d{1,3})"
)
# Incident ids are ``rule:target:milliseconds``; job targets add what a job id may hold.
_INCIDENT_ID: Final = re.compile(
    r"[a-z][a-z0-9_]{0,63}:[A-Za-z0-9][A-Za-z0-9._:/@+=-]{0,400}:\d{1,20}"
)
# What may go into an HTTP header as it is; anything else is sent as a digest.
_HEADER_KEY = re.compile(r"[A-Za-z0-9._:/-]{1,200}")
_ACTION = re.compile(r"[a-z][a-z_]{0,63}")
_SHOWN: Final = 80


class UnsafeArgumentError(CollectorError):
    """A name or id that would reach a command line or a header failed its strict pattern.

    Attributes:
        what: which argument (``node``, ``target``, ``rule``, ``incident id``, ``action``).
    """

    def __init__(self, what: str, value: str, expected: str) -> None:
        """Name the argument, show (a bounded repr of) its value and what it should look like."""
        super().__init__(f"{what} {value[:_SHOWN]!r} is not {expected}")
        self.what = what


@dataclass(frozen=True, slots=True)
class TargetRef:
    """A target key taken apart: the node, and the GPU (and link) or IB port below it."""

    node: str
    gpu: int | None = None
    link: int | None = None
    device: str | None = None
    port: int | None = None

    def words(self) -> str:
        """``GPU 3``, ``GPU 3 NVLink 7``, ``IB mlx5_0/1`` or ``node NAME``: for a reason."""
        if self.gpu is not None:
            link = f" NVLink {self.link}" if self.link is not None else ""
            return f"GPU {self.gpu}{link}"
        if self.device is not None:
            return f"IB {self.device}/{self.port}"
        return f"node {self.node}"


def check_node(node: str) -> str:
    """Return ``node`` if it is one host name (as the Hello check wants); raise otherwise.

    A name a scheduler reads as many nodes is refused too, whichever drainer would get it:
    Slurm's ``ALL`` or ``DEFAULT`` in any case (a webhook's drain endpoint often hands the
    node to ``scontrol`` as it is).
    """
    if NODE_NAME.fullmatch(node) is None:
        raise UnsafeArgumentError("node", node, "a host name")
    if not is_single_node_name(node):
        raise UnsafeArgumentError("node", node, "a single node's name (Slurm reserves it)")
    return node


def parse_target(node: str, target: str) -> TargetRef:
    """Take the target key ``target`` of ``node`` apart; raise unless it is one of ``node``'s."""
    check_node(node)
    if target == node:
        return TargetRef(node)
    rest = target.removeprefix(node)
    match = _BELOW_NODE.fullmatch(rest) if rest != target else None
    if match is None:
        raise UnsafeArgumentError("target", target, f"a GPU, NVLink or IB port key of {node}")
    gpu, link, device, port = match.group("gpu", "link", "device", "port")
    return TargetRef(
        node,
        gpu=None if gpu is None else int(gpu),
        link=None if link is None else int(link),
        device=device,
        port=None if port is None else int(port),
    )


def _check_incident(incident_id: str) -> str:
    if _INCIDENT_ID.fullmatch(incident_id) is None:
        raise UnsafeArgumentError("incident id", incident_id, "rule:target:milliseconds")
    return incident_id


def drain_reason(rule: str, node: str, target: str, incident_id: str, *, note: str = "") -> str:
    """``fleetwatch: <rule>: <what> (incident <id>)``, from checked parts only.

    The incident's evidence is left out on purpose: it may quote telemetry (an IB port's state
    text, a job's summary). People find it in the journal and the notification, by the id.
    ``note``: words the rule file adds (``reboot_node: {reason: ...}``), after ``<what>``; the
    loader checked them (:data:`rules.loader.REASON_NOTE`), and so does this.
    """
    if RULE_NAME.fullmatch(rule) is None:
        raise UnsafeArgumentError("rule", rule, "a snake_case rule name")
    if note and REASON_NOTE.fullmatch(note) is None:
        raise UnsafeArgumentError(
            "reason", note, "1-80 letters, digits, spaces and . _ : / ( ) , -"
        )
    what = parse_target(node, target).words() + (f": {note}" if note else "")
    return f"{REASON_PREFIX} {rule}: {what} (incident {_check_incident(incident_id)})"


def delivery_key(action: str, incident_id: str) -> str:
    """The idempotency key of an action's webhook (a header): ``<action>:<incident id>``.

    A key with characters a header should not carry from a job's label (``@``, ``+``, ``=``),
    or too long for one, is sent as ``<action>:sha256:<hex>`` of it instead: the same action of
    the same incident always gets the same key.
    """
    if _ACTION.fullmatch(action) is None:
        raise UnsafeArgumentError("action", action, "a snake_case action name")
    key = f"{action}:{_check_incident(incident_id)}"
    if _HEADER_KEY.fullmatch(key) is not None:
        return key
    return f"{action}:sha256:{hashlib.sha256(key.encode()).hexdigest()[:40]}"
