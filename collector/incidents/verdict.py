"""What came of an evaluation: a transition, whether its actions may run, and its evidence.

Grouping: a firing incident of a node rule that says ``suppresses: true`` (the node's own
readings cannot be trusted: ``node_unreachable``) suppresses the GPU, NVLink and IB-port incidents
of that node that fire after it (they are journaled as suppressed and run no actions). A silence
that matches an incident silences it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from collector.model.recent_faults import counts_words, reads_counts
from rules.engine import Phase
from rules.model import Scope

if TYPE_CHECKING:
    from collector.jobs.book import JobBook
    from rules.engine import Engine, Incident, Transition
    from rules.model import Rule


@dataclass(slots=True)
class Verdict:
    """Why an incident's actions will not run (None: they will)."""

    suppressed_by: str | None = None
    silenced_by: str | None = None


@dataclass(frozen=True, slots=True)
class Outcome:
    """A transition, the rule it belongs to, and whether its actions may run."""

    transition: Transition
    rule: Rule
    verdict: Verdict


def verdict_for(engine: Engine, incident: Incident, rule: Rule, silenced_by: str | None) -> Verdict:
    """Whether a firing incident is suppressed (by a suppressing one on its node) or silenced."""
    verdict = Verdict(silenced_by=silenced_by)
    if incident.phase != Phase.FIRING or rule.scope in (Scope.NODE, Scope.JOB, Scope.FLEET):
        return verdict
    for other in engine.open_incidents():
        other_rule = engine.rules[other.rule]
        if (
            other.node == incident.node
            and other.phase == Phase.FIRING
            and other_rule.suppresses
            and not other_rule.shadow
        ):
            verdict.suppressed_by = other.id
            break
    return verdict


def evidence(rule: Rule, data: dict[str, Any], jobs: JobBook | None) -> str:
    """A short, factual line naming the target (the rule is named beside it)."""
    if "job" in data:
        return str(data["job"]["summary"])
    rank = data.get("rank")
    if rank and jobs is not None and "rank.hang_culprit" in rule.when:
        culprit = jobs.culprit_summary(rank["job"], rank["rank"])
        if culprit:
            return culprit
    if rank and jobs is not None and "rank." in rule.when:
        return jobs.straggler_summary(rank["job"], rank["rank"])
    node = data.get("node")
    if node and "remediations_7d" in node and reads_counts(rule.when):
        return counts_words(node)  # a lemon's: its drain reason names the counts too
    return target_line(rule, data)


def target_line(rule: Rule, data: dict[str, Any]) -> str:
    """The target of ``data`` in a few words: its port, link, GPU or node, else the scope."""
    if "port" in data:
        p = data["port"]
        return f"IB {p['device']}/{p['port']} {p['state']}/{p['phys_state']}"
    if "link" in data:
        return f"GPU {data['gpu']['index']} NVLink {data['link']['index']}"
    if "gpu" in data:
        g = data["gpu"]
        return f"GPU {g['index']} {g['uuid']}"
    if "node" in data:
        return f"node {data['node']['name']}"
    return rule.scope.value
