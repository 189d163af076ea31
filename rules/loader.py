"""Load and check rule files; every problem names the file, the line and the rule.

A rule file::

    version: 1
    rules:
      - name: gpu_lost                 # unique, snake_case
        scope: gpu                     # node | gpu | nvlink | ib_port | job | fleet
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
from typing import TYPE_CHECKING, Any, Final, TypeVar

import yaml

from fleetwatch.config_file import short_repr, shown_path
from rules.cel_env import ConditionError, RuleEnvironment, field_problems, signal_references
from rules.durations import parse_duration
from rules.exceptions import RulesError
from rules.model import (
    ACTIONS,
    GPU_SCOPES,
    NODE_SCOPES,
    ActionSpec,
    Escalation,
    Mode,
    Rule,
    RuleSet,
    Scope,
    Severity,
)
from rules.signals import known
from rules.yaml_lines import YamlTextError, builtin_text, compose, key_lines, line_of, read_text

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

RULE_NAME: Final = re.compile(r"[a-z][a-z0-9_]{0,63}")
# What ``reboot_node: {reason: ...}`` may add to the reboot's reason (it reaches scontrol and
# a webhook): words and the punctuation a Slurm reason of fleetwatch's may hold.
REASON_NOTE: Final = re.compile(r"[A-Za-z0-9 ._:/(),-]{1,80}")
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
        "suppresses",
        "mode",
    },
)
ESCALATE_KEYS: Final = frozenset({"after", "within", "actions", "occurrences"})
TOP_KEYS: Final = frozenset({"version", "rules"})
BUILTIN: Final = ("rules", "default.yaml")
BUILTIN_SOURCE: Final = "builtin/default.yaml"
# What a value of each type is called in problems (rule files are written by people).
_KINDS: Final[dict[type, str]] = {bool: "true or false", str: "a string", int: "a whole number"}
_Choice = TypeVar("_Choice", Scope, Severity, Mode)


@dataclass(frozen=True, slots=True)
class RuleProblem:
    """One thing wrong in a rule file."""

    source: str
    line: int
    rule: str
    message: str
    column: int = 0  # 0: not known (only YAML syntax errors have one)

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

    def typed(self, value: object, kind: type, what: str, line: int, rule: str) -> None:
        """A problem unless ``value`` is a ``kind`` (true or false is not a number)."""
        if isinstance(value, kind) and (kind is bool or not isinstance(value, bool)):
            return
        expected = _KINDS.get(kind, f"a {kind.__name__}")
        self.problem(line, rule, f"{what} must be {expected}, not {short_repr(value)}")

    def choice(
        self, kind: type[_Choice], what: str, value: object, line: int, rule: str
    ) -> _Choice | None:
        """``value`` as one of ``kind``'s members, or None (and a problem naming them all)."""
        allowed = [member.value for member in kind]
        if isinstance(value, str) and value in allowed:
            return kind(value)
        got = "" if value is None else f", not {short_repr(value)}"
        self.problem(line, rule, f"{what} must be one of {', '.join(allowed)}{got}")
        return None

    def actions(self, raw: object, what: str, line: int, rule: str) -> tuple[ActionSpec, ...]:
        if not isinstance(raw, list):
            self.problem(line, rule, f"{what} must be a list")
            return ()
        specs: list[ActionSpec] = []
        for item in raw:
            name, params = _single_pair(item)
            if name not in ACTIONS:
                known_actions = ", ".join(sorted(ACTIONS))
                shown = short_repr(name)
                self.problem(line, rule, f"unknown action {shown}; known: {known_actions}")
                continue
            if not isinstance(params, dict):
                self.problem(line, rule, f"parameters of {name} must be a mapping")
                continue
            schema = ACTIONS[name]
            unknown = sorted(_key(k) for k in set(params) - set(schema))
            if unknown:
                self.problem(line, rule, f"{name} has no parameter {', '.join(unknown)}")
                continue
            checked = {key: params.get(key, default) for key, (_, default) in schema.items()}
            for key, (kind, _) in schema.items():
                self.typed(checked[key], kind, f"{name}.{key}", line, rule)
            specs.append(ActionSpec(name, checked))
        return tuple(specs)

    def rule(self, raw: object, line: int, lines: dict[str, int]) -> Rule | None:
        if not isinstance(raw, dict):
            self.problem(line, "", "a rule must be a mapping")
            return None
        name = raw.get("name")
        if not isinstance(name, str) or not RULE_NAME.fullmatch(name):
            shown = name[:64] if isinstance(name, str) else short_repr(name) if name else ""
            self.problem(line, shown, "name must be snake_case, 1-64 characters")
            return None

        def at(key: str) -> int:
            return lines.get(key, line)

        for key in sorted(set(raw) - RULE_KEYS, key=str):
            self.problem(at(key), name, f"unknown field {short_repr(key)}")
        scope = self.choice(Scope, "scope", raw.get("scope"), at("scope"), name)
        severity = self.choice(
            Severity, "severity", raw.get("severity", "warning"), at("severity"), name
        )
        mode = self.choice(Mode, "mode", raw.get("mode", "act"), at("mode"), name)
        when = self.condition(scope, raw.get("when"), at("when"), name)
        timing: dict[str, float] = {}
        for key in ("for", "keep_firing_for"):
            try:
                timing[key] = parse_duration(raw.get(key, 0))
            except ValueError as exc:
                self.problem(at(key), name, f"{key}: {exc}")
        texts = {key: raw.get(key, "") for key in ("description", "runbook")}
        for key, value in texts.items():
            self.typed(value, str, key, at(key), name)
        labels = self.labels(raw.get("labels", {}), at("labels"), name)
        dry_run, suppresses = self.switches(raw, at, name, scope)
        actions = self.actions(raw.get("actions", []), "actions", at("actions"), name)
        escalation = self.escalation(raw.get("escalate"), at("escalate"), name, scope)
        if scope is not None:
            extra = escalation.actions if escalation else ()
            self.scoped_actions(scope, actions + extra, at("actions"), name)
        if scope is None or severity is None or when is None or mode is None:
            return None
        return Rule(
            name=name,
            scope=scope,
            when=when,
            severity=severity,
            for_s=timing.get("for", 0.0),
            keep_firing_for_s=timing.get("keep_firing_for", 0.0),
            description=str(texts["description"]),
            runbook=str(texts["runbook"]),
            labels=labels,
            actions=actions,
            escalation=escalation,
            dry_run=dry_run,
            suppresses=suppresses,
            mode=mode,
            source=self.source,
            line=line,
        )

    def switches(
        self, raw: dict[str, Any], at: Callable[[str], int], name: str, scope: Scope | None
    ) -> tuple[bool, bool]:
        """The rule's ``dry_run`` and ``suppresses`` (true or false; only node rules suppress)."""
        dry_run = raw.get("dry_run", False)
        self.typed(dry_run, bool, "dry_run", at("dry_run"), name)
        suppresses = raw.get("suppresses", False)
        self.typed(suppresses, bool, "suppresses", at("suppresses"), name)
        if suppresses is True and scope is not None and scope != Scope.NODE:
            self.problem(
                at("suppresses"), name, "suppresses is for node rules (it holds a node's others)"
            )
        return dry_run is True, suppresses is True

    def scoped_actions(
        self, scope: Scope, actions: tuple[ActionSpec, ...], line: int, rule: str
    ) -> None:
        """drain_node, reboot_node, rma_ticket need a node's incident; reset_gpu, requeue_job a GPU.

        A reboot's ``reason`` holds only what :data:`REASON_NOTE` allows.
        """
        for spec in actions:
            if spec.name in ("reboot_node", "rma_ticket") and scope not in NODE_SCOPES:
                self.problem(line, rule, f"{spec.name} needs a node, and a {scope} rule has none")
            note = spec.params.get("reason")
            if (
                spec.name == "reboot_node"
                and isinstance(note, str)
                and note
                and (note != note.strip() or REASON_NOTE.fullmatch(note) is None)
            ):
                self.problem(
                    line,
                    rule,
                    f"reboot_node.reason must be 1-80 letters, digits, spaces and "
                    f". _ : / ( ) , - (no outer spaces), not {short_repr(note)}",
                )
            if spec.name == "requeue_job" and scope not in GPU_SCOPES:
                self.problem(
                    line,
                    rule,
                    f"requeue_job needs a GPU (its rank's job), and a {scope} rule has none",
                )
            if spec.name == "drain_node" and scope not in NODE_SCOPES:
                self.problem(line, rule, f"drain_node needs a node, and a {scope} rule has none")
            if spec.name == "reset_gpu" and scope not in GPU_SCOPES:
                self.problem(line, rule, f"reset_gpu needs a GPU, and a {scope} rule has none")

    def labels(self, raw: object, line: int, rule: str) -> dict[str, str]:
        if isinstance(raw, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in raw.items()
        ):
            return dict(raw)
        self.problem(line, rule, f"labels must map names to strings, not {short_repr(raw)}")
        return {}

    def condition(self, scope: Scope | None, when: object, line: int, name: str) -> str | None:
        """The condition, checked against the scope's variables (when the scope is known)."""
        if not isinstance(when, str) or not when.strip():
            self.problem(line, name, "when must be a CEL condition")
            return None
        if scope is None:
            return when
        try:
            self.env.compile(scope, when)
        except ConditionError as exc:
            self.problem(line, name, f"bad condition: {exc}")
            return when
        for signal in sorted(signal_references(when)):
            if not known(scope, signal):
                self.problem(line, name, f"unknown signal {signal!r} for a {scope} rule")
        fields = field_problems(scope, when)
        for message in fields:
            self.problem(line, name, message)
        if not fields and (typed := self.env.type_problem(scope, when)) is not None:
            self.problem(line, name, typed)
        return when

    def escalation(
        self, raw: object, line: int, name: str, scope: Scope | None
    ) -> Escalation | None:
        if raw is None:
            return None
        if not isinstance(raw, dict) or set(raw) - ESCALATE_KEYS:
            extra = (
                sorted(_key(k) for k in set(raw) - ESCALATE_KEYS) if isinstance(raw, dict) else []
            )
            got = f" (not {', '.join(extra)})" if extra else ""
            self.problem(line, name, f"escalate takes after, within, actions and occurrences{got}")
            return None
        before = len(self.problems)
        after = raw.get("after")
        if not isinstance(after, int) or isinstance(after, bool) or after < 2:  # noqa: PLR2004
            shown = short_repr(after)
            self.problem(line, name, f"escalate.after must be a count of 2 or more, not {shown}")
        within = 0.0
        try:
            within = parse_duration(raw.get("within"))
        except ValueError as exc:
            self.problem(line, name, f"escalate.within: {exc}")
        else:
            if within <= 0:
                self.problem(line, name, "escalate.within must be longer than 0s")
        actions: tuple[ActionSpec, ...] = ()
        if raw.get("actions"):
            actions = self.actions(raw["actions"], "escalate.actions", line, name)
        else:
            self.problem(line, name, "escalate.actions must list what an escalated firing runs")
        occurrences = self.occurrences(scope, raw.get("occurrences", ""), line, name)
        if len(self.problems) > before or not isinstance(after, int):
            return None
        return Escalation(after, within, actions, occurrences)

    def occurrences(self, scope: Scope | None, raw: object, line: int, name: str) -> str:
        """``escalate.occurrences``: a CEL number that grows each time the fault happens again."""
        if raw == "":
            return ""
        if not isinstance(raw, str) or not raw.strip():
            shown = short_repr(raw)
            self.problem(line, name, f"escalate.occurrences must be a CEL number, not {shown}")
            return ""
        if scope is None:
            return raw
        # Checked as the condition it feeds: a number (an int or a double) compared with 0.
        as_double, as_int = f"({raw}) + 0.0 >= 0.0", f"({raw}) + 0 >= 0"
        try:
            self.env.compile(scope, raw)
        except ConditionError as exc:
            self.problem(line, name, f"bad escalate.occurrences: {exc}")
            return raw
        for signal in sorted(signal_references(raw)):
            if not known(scope, signal):
                self.problem(line, name, f"unknown signal {signal!r} for a {scope} rule")
        fields = field_problems(scope, raw)
        for message in fields:
            self.problem(line, name, message)
        if (
            not fields
            and (typed := self.env.type_problem(scope, as_double)) is not None
            and self.env.type_problem(scope, as_int) is not None
        ):
            self.problem(line, name, f"escalate.occurrences must give a number: {typed}")
        return raw


def _key(key: object) -> str:
    """A mapping key as a problem names it: a string as it is (cut), anything else as a repr."""
    return key[:64] if isinstance(key, str) else short_repr(key)


def _single_pair(item: object) -> tuple[object, object]:
    """An action as (name, parameters): ``name`` or ``{name: {parameters}}``."""
    if isinstance(item, dict) and len(item) == 1:
        ((name, params),) = item.items()
        return name, {} if params is None else params
    return (item if isinstance(item, str) else short_repr(item)), {}


def _rule_lines(node: yaml.Node) -> list[tuple[int, dict[str, int]]]:
    """Line of each rule and of each of its keys, in file order.

    A key given twice counts as YAML reads it: the last one wins.
    """
    if not isinstance(node, yaml.MappingNode):
        return []
    for key, value in reversed(node.value):
        if key.value == "rules" and isinstance(value, yaml.SequenceNode):
            return [
                (
                    item.start_mark.line + 1,
                    {
                        k.value: k.start_mark.line + 1
                        for k, _ in item.value
                        if isinstance(k, yaml.ScalarNode)
                    }
                    if isinstance(item, yaml.MappingNode)
                    else {},
                )
                for item in value.value
            ]
    return []


def _compose(text: str, source: str) -> tuple[Any, yaml.Node]:
    """Parse YAML, keeping the node tree for line numbers."""
    try:
        data, node = compose(text)
    except YamlTextError as exc:
        problem = RuleProblem(source, exc.line, "", exc.message, exc.column)
        raise RulesFileError([problem]) from exc
    if node is None:
        raise RulesFileError([RuleProblem(source, 1, "", "the file is empty")])
    return data, node


def parse_rules(text: str, source: str, env: RuleEnvironment | None = None) -> RuleSet:
    """Parse and check a rule file; RulesFileError lists every problem found."""
    data, node = _compose(text, source)
    top = key_lines(node)
    if not isinstance(data, dict) or data.get("version") != 1:
        line = line_of(top, ("version",))
        raise RulesFileError([RuleProblem(source, line, "", "expected 'version: 1' and 'rules'")])
    raw_rules = data.get("rules")
    if not isinstance(raw_rules, list):
        line = line_of(top, ("rules",))
        raise RulesFileError([RuleProblem(source, line, "", "'rules' must be a list")])
    checker = _Checker(source, env or RuleEnvironment())
    for key in sorted(set(data) - TOP_KEYS, key=str):
        line = line_of(top, (key,)) if isinstance(key, str) else 1
        checker.problem(
            line, "", f"unknown top-level key {short_repr(key)}; a rule file has version and rules"
        )
    lines = _rule_lines(node)
    rules: list[Rule] = []
    seen: dict[str, int] = {}
    for raw, (line, rule_keys) in zip(raw_rules, lines, strict=True):
        rule = checker.rule(raw, line, rule_keys)
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


def load_rules(
    paths: list[Path] | None = None,
    env: RuleEnvironment | None = None,
    *,
    builtin: bool = False,
) -> RuleSet:
    """Load rule files, and the built-in ``rules/default.yaml`` with them when ``builtin``.

    With no paths, the built-in rules alone. A name defined twice, across files too, is a problem.
    """
    env = env or RuleEnvironment()
    if not paths:
        return parse_rules(builtin_text(BUILTIN), BUILTIN_SOURCE, env)
    rules: list[Rule] = []
    problems: list[RuleProblem] = []
    if builtin:
        rules.extend(parse_rules(builtin_text(BUILTIN), BUILTIN_SOURCE, env).rules)
    for path in paths:
        try:
            text = read_text(path)
        except YamlTextError as exc:
            problems.append(RuleProblem(shown_path(path), exc.line, "", exc.message))
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
