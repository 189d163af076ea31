"""Rules as data: what a rule file says, once loaded and checked."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final


class Scope(StrEnum):
    """What a rule watches: one incident per rule and target of this kind."""

    NODE = "node"
    GPU = "gpu"
    NVLINK = "nvlink"
    IB_PORT = "ib_port"
    JOB = "job"
    FLEET = "fleet"


class Mode(StrEnum):
    """Whether a rule's actions run (``act``) or are only journaled as they would have run."""

    ACT = "act"
    SHADOW = "shadow"


class Severity(StrEnum):
    """How bad a firing incident is."""

    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"


# The scopes whose incidents name a node (drain_node, reboot_node, rma_ticket) and a GPU
# (reset_gpu, and requeue_job: the job of the rank on that GPU).
NODE_SCOPES: Final = frozenset({Scope.NODE, Scope.GPU, Scope.NVLINK, Scope.IB_PORT})
GPU_SCOPES: Final = frozenset({Scope.GPU, Scope.NVLINK})

# Actions a rule may ask for, with the parameters each takes (name -> type, default).
ACTIONS: Final[dict[str, dict[str, tuple[type, Any]]]] = {
    "drain_node": {"resume_on_resolve": (bool, False)},
    "reset_gpu": {"drain_first": (bool, False)},
    "requeue_job": {"exclude_node": (bool, True)},
    "notify": {"channel": (str, "default")},
    # words added to the reboot's reason ("" none): rules.loader.REASON_NOTE says which
    "reboot_node": {"reason": (str, "")},
    "rma_ticket": {},
}


@dataclass(frozen=True, slots=True)
class ActionSpec:
    """One action of a rule, with its (checked) parameters."""

    name: str
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Escalation:
    """When the same rule fires on the same target again and again, do more.

    From the ``after``-th occurrence within ``within_s``, ``actions`` run instead of the rule's
    own. Each firing is an occurrence, and so is each growth of ``occurrences`` (a CEL number,
    e.g. a counter or an event count; "" for none) while the incident fires.
    """

    after: int
    within_s: float
    actions: tuple[ActionSpec, ...]
    occurrences: str = ""


@dataclass(frozen=True, slots=True)
class Rule:
    """A named condition over one scope, and what to do while it holds."""

    name: str
    scope: Scope
    when: str
    severity: Severity = Severity.WARNING
    for_s: float = 0.0
    keep_firing_for_s: float = 0.0
    description: str = ""
    runbook: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    actions: tuple[ActionSpec, ...] = ()
    escalation: Escalation | None = None
    dry_run: bool = False
    # While it fires, the node's GPU, NVLink and IB-port incidents that fire are suppressed: it
    # says the node's own readings cannot be trusted (node_unreachable). Node rules only.
    suppresses: bool = False
    # shadow: it fires and journals each action as it would have run ("shadow"), acts on nothing
    # (no drain, reset, requeue or notification) and suppresses nothing: a new rule proven live.
    mode: Mode = Mode.ACT
    source: str = ""
    line: int = 0

    @property
    def shadow(self) -> bool:
        """Whether the rule runs in shadow mode."""
        return self.mode == Mode.SHADOW

    @property
    def where(self) -> str:
        """``file:line`` of the rule, for messages."""
        return f"{self.source}:{self.line}" if self.source else self.name


@dataclass(frozen=True, slots=True)
class RuleSet:
    """The rules of one or more files, by name (names are unique)."""

    rules: tuple[Rule, ...] = ()

    def by_scope(self, scope: Scope) -> tuple[Rule, ...]:
        """The rules watching ``scope``."""
        return tuple(r for r in self.rules if r.scope == scope)

    def get(self, name: str) -> Rule | None:
        """The rule called ``name``."""
        return next((r for r in self.rules if r.name == name), None)
