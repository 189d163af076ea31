"""Load and check rule files; every problem names the file, the line and the rule.

A rule file::

    version: 1
    rules:
      - name: gpu_lost                 # unique, snake_case
        scope: gpu                     # node | gpu | nvlink | ib_port | fleet
        when: 'events("gpu_lost", "1h") > 0'   # CEL, see rules.cel_env
        for: 0s                        # how long the condition must hold before firing
        keep_firing_for: 10m           # how long it stays firing after the condition clears
        severity: critical             # info | warning | critical
        description: A GPU fell off the bus.
        runbook: https://runbooks.example/gpu-lost
        labels: {component: gpu}
        actions: [drain_node, {notify: {channel: oncall}}]
        escalate: {after: 3, within: 24h, actions: [drain_node]}
        dry_run: false                 # journal what would run, run nothing
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any, Final

import yaml

from rules.cel_env import ConditionError, RuleEnvironment, signal_references
from rules.durations import parse_duration
from rules.exceptions import RulesError
from rules.model import ACTIONS, ActionSpec, Escalation, Rule, RuleSet, Scope, Severity
from rules.signals import known

if TYPE_CHECKING:
    from pathlib import Path

RULE_NAME: Final = re.compile(r"[a-z][a-z0-9_]{0,63}")
RULE_KEYS: Final = frozenset(
    {
        "name",
        "scope",
        "when",
        "for",
        "keep_firing_for",
        "severity",
        "description",
        "runbook",
        "labels",
        "actions",
        "escalate",
        "dry_run",
    },
)
ESCALATE_KEYS: Final = frozenset({"after", "within", "actions"})
BUILTIN: Final = ("rules", "default.yaml")


@dataclass(frozen=True, slots=True)
class RuleProblem:
    """One thing wrong in a rule file."""

    source: str
    line: int
    rule: str
    message: str

    def __str__(self) -> str:
        """``file:line: rule NAME: message``."""
        who = f"rule {self.rule}: " if self.rule else ""
        return f"{self.source}:{self.line}: {who}{self.message}"


class RulesFileError(RulesError):
    """A rule file has problems; ``problems`` lists them all."""

    def __init__(self, problems: list[RuleProblem]) -> None:
        """Keep every problem; the message lists them one per line."""
        super().__init__("\n".join(str(p) for p in problems))
        self.problems = problems


class _Checker:
    """Builds rules from parsed YAML, collecting problems instead of stopping at the first."""

    def __init__(self, source: str, env: RuleEnvironment) -> None:
        self.source = source
        self.env = env
        self.problems: list[RuleProblem] = []

    def problem(self, line: int, rule: str, message: str) -> None:
        self.problems.append(RuleProblem(self.source, line, rule, message))

    def actions(self, raw: object, line: int, rule: str) -> tuple[ActionSpec, ...]:
        if not isinstance(raw, list):
            self.problem(line, rule, "actions must be a list")
            return ()
        specs: list[ActionSpec] = []
        for item in raw:
            name, params = (item, {}) if isinstance(item, str) else _single_pair(item)
            if name not in ACTIONS:
                known_actions = ", ".join(sorted(ACTIONS))
                self.problem(line, rule, f"unknown action {name!r}; known: {known_actions}")
                continue
            if not isinstance(params, dict):
                self.problem(line, rule, f"parameters of {name} must be a mapping")
                continue
            schema = ACTIONS[name]
            unknown = sorted(set(params) - set(schema))
            if unknown:
                self.problem(line, rule, f"{name} has no parameter {', '.join(unknown)}")
                continue
            checked: dict[str, Any] = {}
            for key, (kind, default) in schema.items():
                value = params.get(key, default)
                if not isinstance(value, kind):
                    self.problem(line, rule, f"{name}.{key} must be a {kind.__name__}")
                checked[key] = value
            specs.append(ActionSpec(str(name), checked))
        return tuple(specs)

    def rule(self, raw: object, line: int, lines: dict[str, int]) -> Rule | None:
        if not isinstance(raw, dict):
            self.problem(line, "", "a rule must be a mapping")
            return None
        name = raw.get("name")
        if not isinstance(name, str) or not RULE_NAME.fullmatch(name):
            self.problem(line, str(name or ""), "name must be snake_case, 1-64 characters")
            return None
        for key in sorted(set(raw) - RULE_KEYS):
            self.problem(lines.get(key, line), name, f"unknown field {key!r}")
        try:
            scope = Scope(str(raw.get("scope")))
            severity = Severity(str(raw.get("severity", "warning")))
        except ValueError as exc:
            self.problem(line, name, f"{exc}; scope is one of {', '.join(Scope)}")
            return None
        when = raw.get("when")
        if not isinstance(when, str) or not when.strip():
            self.problem(lines.get("when", line), name, "when must be a CEL condition")
            return None
        self.condition(scope, when, lines.get("when", line), name)
        timing: dict[str, float] = {}
        for key in ("for", "keep_firing_for"):
            try:
                timing[key] = parse_duration(raw.get(key, 0))
            except ValueError as exc:
                self.problem(lines.get(key, line), name, f"{key}: {exc}")
        labels = raw.get("labels", {})
        if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
            self.problem(lines.get("labels", line), name, "labels must map names to strings")
            labels = {}
        return Rule(
            name=name,
            scope=scope,
            when=when,
            severity=severity,
            for_s=timing.get("for", 0.0),
            keep_firing_for_s=timing.get("keep_firing_for", 0.0),
            description=str(raw.get("description", "")),
            runbook=str(raw.get("runbook", "")),
            labels={str(k): str(v) for k, v in labels.items()},
            actions=self.actions(raw.get("actions", []), lines.get("actions", line), name),
            escalation=self.escalation(raw.get("escalate"), lines.get("escalate", line), name),
            dry_run=raw.get("dry_run", False) is True,
            source=self.source,
            line=line,
        )

    def condition(self, scope: Scope, when: str, line: int, name: str) -> None:
        try:
            self.env.compile(scope, when)
        except ConditionError as exc:
            self.problem(line, name, f"bad condition: {exc}")
            return
        for signal in sorted(signal_references(when)):
            if not known(scope, signal):
                self.problem(line, name, f"unknown signal {signal!r} for a {scope} rule")

    def escalation(self, raw: object, line: int, name: str) -> Escalation | None:
        if raw is None:
            return None
        if not isinstance(raw, dict) or set(raw) - ESCALATE_KEYS:
            self.problem(line, name, "escalate takes after, within and actions")
            return None
        after = raw.get("after")
        if not isinstance(after, int) or isinstance(after, bool) or after < 2:  # noqa: PLR2004
            self.problem(line, name, "escalate.after must be a count of 2 or more")
            return None
        try:
            within = parse_duration(raw.get("within"))
        except ValueError as exc:
            self.problem(line, name, f"escalate.within: {exc}")
            return None
        return Escalation(after, within, self.actions(raw.get("actions", []), line, name))


def _single_pair(item: object) -> tuple[object, object]:
    if isinstance(item, dict) and len(item) == 1:
        ((name, params),) = item.items()
        return name, {} if params is None else params
    return item, {}


def _compose(text: str, source: str) -> tuple[Any, yaml.Node]:
    """Parse YAML, keeping the node tree for line numbers."""
    try:
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 1
        raise RulesFileError([RuleProblem(source, line, "", f"not valid YAML: {exc}")]) from exc
    if node is None:
        raise RulesFileError([RuleProblem(source, 1, "", "the file is empty")])
    return data, node


def _rule_lines(node: yaml.Node) -> list[tuple[int, dict[str, int]]]:
    """Line of each rule and of each of its keys, in file order."""
    if not isinstance(node, yaml.MappingNode):
        return []
    for key, value in node.value:
        if key.value == "rules" and isinstance(value, yaml.SequenceNode):
            return [
                (
                    item.start_mark.line + 1,
                    {k.value: k.start_mark.line + 1 for k, _ in item.value}
                    if isinstance(item, yaml.MappingNode)
                    else {},
                )
                for item in value.value
            ]
    return []


def parse_rules(text: str, source: str, env: RuleEnvironment | None = None) -> RuleSet:
    """Parse and check a rule file; RulesFileError lists every problem found."""
    data, node = _compose(text, source)
    if not isinstance(data, dict) or data.get("version") != 1:
        raise RulesFileError([RuleProblem(source, 1, "", "expected 'version: 1' and 'rules'")])
    raw_rules = data.get("rules")
    if not isinstance(raw_rules, list):
        raise RulesFileError([RuleProblem(source, 1, "", "'rules' must be a list")])
    checker = _Checker(source, env or RuleEnvironment())
    lines = _rule_lines(node)
    rules: list[Rule] = []
    seen: dict[str, int] = {}
    for raw, (line, key_lines) in zip(raw_rules, lines, strict=True):
        rule = checker.rule(raw, line, key_lines)
        if rule is None:
            continue
        if rule.name in seen:
            checker.problem(line, rule.name, f"defined twice (first at line {seen[rule.name]})")
            continue
        seen[rule.name] = line
        rules.append(rule)
    if checker.problems:
        raise RulesFileError(checker.problems)
    return RuleSet(tuple(rules))


def load_rules(paths: list[Path] | None = None, env: RuleEnvironment | None = None) -> RuleSet:
    """Load rule files (the built-in ``rules/default.yaml`` when none are given)."""
    env = env or RuleEnvironment()
    if not paths:
        text = resources.files(BUILTIN[0]).joinpath(BUILTIN[1]).read_text("utf-8")
        return parse_rules(text, "builtin/default.yaml", env)
    rules: list[Rule] = []
    problems: list[RuleProblem] = []
    for path in paths:
        try:
            text = path.read_text("utf-8")
        except OSError as exc:
            problems.append(RuleProblem(str(path), 0, "", f"cannot read: {exc.strerror}"))
            continue
        try:
            rules.extend(parse_rules(text, str(path), env).rules)
        except RulesFileError as exc:
            problems.extend(exc.problems)
    names: dict[str, Rule] = {}
    for rule in rules:
        if rule.name in names:
            first = names[rule.name]
            problems.append(
                RuleProblem(rule.source, rule.line, rule.name, f"also defined at {first.where}"),
            )
        names[rule.name] = rule
    if problems:
        raise RulesFileError(problems)
    return RuleSet(tuple(rules))
