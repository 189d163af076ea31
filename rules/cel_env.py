"""Rule conditions in CEL (the language Kubernetes uses), compiled once, evaluated per target.

Variables a condition sees (maps; a signal a target did not report is absent, so guard with
``has()`` where it matters):

``node``   name, reachable, connected, gpus, gpus_lost, nvlinks_down, ib_ports, ib_ports_down,
           remediations_7d, incidents_7d, seen_by_person (a lemon's counts),
           signals (the node's own, e.g. ``agent_outbox_pending``)
``gpu``    index, uuid, model, pci_bus_id, present, nvlink_count, nvlinks_down, signals
``rank``   the training-job rank on the GPU (gpu rules; empty when none runs there): job, rank,
           straggler, slowdown, straggler_steps, job_gpus, lost_gpu_hours_per_hour,
           hang_culprit, hang_hardware
``job``    one training job (job rules): id, active, world_size, ranks, ranks_missing,
           missing_nodes, nodes, gpus, step,
           step_time_s, tokens_per_s, tokens_per_s_per_gpu, mfu, ettr, goodput_tokens_per_s,
           restarts, stragglers,
           straggler_nodes, lost_gpu_hours_per_hour, drop, drop_share, drop_cause, suspects,
           fabric, fabric_nodes, checkpoint_age_s, checkpoint_cost_s, checkpoint_interval_s,
           checkpoint_overdue, summary
``link``   index, up, signals                      (nvlink rules)
``port``   device, port, state, phys_state, up, rate, signals     (ib_port rules)
``fleet``  nodes, nodes_reachable, gpus, ib_ports, ib_ports_up, drained_nodes, drains_waiting,
           drain_cap, drain_breaker_open (from the action dispatcher)

Functions, about the target being evaluated (windows are durations such as ``"10m"``):

``events(kind, window)``          how many events of ``kind`` it had
``xids(window)``                  its Xids: a list of {xid, class, action, fatal}
``increase(signal, window)``      how much a counter grew (resets handled)
``rate(signal, window)``          that growth per second
``rises(signal, window)``         how many times a counter went up (each step one, resets handled)
``share_of_ports(signal, above)`` share of the fleet's IB ports whose signal is above a value

Conditions are type-checked against these at load time; nothing is ever ``eval``'d in Python.
The variables are maps of any type to CEL, so :func:`field_problems` checks their fields
(against ``VARIABLE_FIELDS``) and the kinds ``events()`` counts (against ``EventKind``) itself,
and :meth:`RuleEnvironment.type_problem` compiles the condition again with the fields' types
(:mod:`rules.cel_types`): ``node.name + 1`` and ``when: node.gpus`` (not a bool) are refused.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Final, Protocol

from cel_expr_python import cel

from fleetwatch.model import EventKind
from rules.cel_types import VARIABLE_TYPES, ConditionTypes
from rules.durations import parse_duration
from rules.model import Scope

if TYPE_CHECKING:
    from collections.abc import Callable

MAX_PROBLEM: Final = 500  # characters of a compiler message kept in a problem
SCOPE_VARIABLES: Final[dict[Scope, tuple[str, ...]]] = {
    Scope.NODE: ("node", "fleet"),
    Scope.GPU: ("node", "gpu", "rank", "fleet"),
    Scope.NVLINK: ("node", "gpu", "link", "fleet"),
    Scope.IB_PORT: ("node", "port", "fleet"),
    Scope.JOB: ("job", "fleet"),
    Scope.FLEET: ("fleet",),
}
# The fields of each variable: the keys of the maps the collector builds
# (collector.incidents.cel_data); their types are in rules.cel_types.
VARIABLE_FIELDS: Final[dict[str, frozenset[str]]] = {
    variable: frozenset(fields) for variable, fields in VARIABLE_TYPES.items()
}
# Patterns over a condition whose string literals were replaced by "N" (see _without_strings).
_RAW_PREFIX: Final = re.compile(r"(?<![\w.])[bB]?[rR][bB]?$")
_FIELD: Final = re.compile(r"(?<![\w.])([A-Za-z_]\w*)\s*\.\s*\??\s*([A-Za-z_]\w*)(?!\w|\s*\()")
_INDEX: Final = re.compile(r'(?<![\w.])([A-Za-z_]\w*)\s*\[\s*[rRbB]*"(\d+)"\s*\]')
_EVENTS: Final = re.compile(r'(?<![\w.])events\s*\(\s*[rRbB]*"(\d+)"')
_BOUND: Final = re.compile(
    r"(?:\.\s*(?:all|exists|exists_one|map|filter)|(?<![\w.])cel\s*\.\s*bind)\s*\(\s*(\w+)\s*,",
)
_EVENT_KINDS: Final = tuple(sorted(k.value for k in EventKind))
_SIGNAL_REFS: Final = (
    re.compile(r"signals\.([A-Za-z_][A-Za-z0-9_]*)"),
    re.compile(r"""signals\[\s*["']([^"']+)["']\s*\]"""),
    re.compile(r"""(?:rate|increase|rises|share_of_ports)\(\s*["']([^"']+)["']"""),
)


class TargetContext(Protocol):
    """What the window functions ask of the target under evaluation."""

    def events(self, kind: str, window_s: float) -> int:
        """Events of ``kind`` in the last ``window_s`` seconds."""
        ...

    def xids(self, window_s: float) -> list[dict[str, Any]]:
        """Xids in the last ``window_s`` seconds, with their catalog entries."""
        ...

    def increase(self, signal: str, window_s: float) -> float:
        """How much a counter signal grew in the last ``window_s`` seconds (0 without data)."""
        ...

    def rises(self, signal: str, window_s: float) -> int:
        """How many times a counter signal went up in the last ``window_s`` seconds (0: none)."""
        ...

    def share_of_ports(self, signal: str, above: float) -> float:
        """Share (0-1) of the fleet's IB ports whose ``signal`` is above ``above``."""
        ...


class ConditionError(ValueError):
    """A condition does not compile; the message is CEL's, with a caret under the problem."""


def signal_references(condition: str) -> set[str]:
    """The signal names a condition mentions (for checking them against the catalog)."""
    return {m for pattern in _SIGNAL_REFS for m in pattern.findall(condition)}


def _without_strings(condition: str) -> tuple[str, list[str]]:
    """The condition with its N-th string literal replaced by ``"N"``, and the literals."""
    code: list[str] = []
    literals: list[str] = []
    pos, end = 0, len(condition)
    while pos < end:
        char = condition[pos]
        if char not in "'\"":
            code.append(char)
            pos += 1
            continue
        raw = _RAW_PREFIX.search(condition, 0, pos) is not None
        quote = char * 3 if condition.startswith(char * 3, pos) else char
        start = pos = pos + len(quote)
        while pos < end and not condition.startswith(quote, pos):
            pos += 2 if condition[pos] == "\\" and not raw else 1
        code.append(f'"{len(literals)}"')
        literals.append(condition[start:pos])
        pos += len(quote)
    return "".join(code), literals


def field_problems(scope: Scope, condition: str) -> list[str]:
    """Fields of the scope's variables and event kinds a condition names that do not exist.

    CEL cannot catch these (the variables are untyped maps): a misspelt field is simply absent
    at run time, and a misspelt kind is never counted. Text inside string literals is skipped.
    """
    code, literals = _without_strings(condition)
    variables = set(SCOPE_VARIABLES[scope]) - set(_BOUND.findall(code))
    references = _FIELD.findall(code)
    references += [(var, literals[int(n)]) for var, n in _INDEX.findall(code)]
    problems: list[str] = []
    for var, name in references:
        if var in variables and name not in VARIABLE_FIELDS[var]:
            fields = ", ".join(sorted(VARIABLE_FIELDS[var]))
            problems.append(f"unknown field {var}.{name}; {var} has {fields}")
    for n in _EVENTS.findall(code):
        kind = literals[int(n)]
        if kind not in _EVENT_KINDS:
            problems.append(f"unknown event kind {kind!r}; known: {', '.join(_EVENT_KINDS)}")
    return list(dict.fromkeys(problems))


class RuleEnvironment:
    """One CEL environment per scope; the window functions ask the context set for a call."""

    def __init__(self) -> None:
        """Build the environments (the functions close over this object's current context)."""
        self._context: TargetContext | None = None
        self._windows: dict[str, float] = {}
        self._types: ConditionTypes | None = None  # built when a check first needs it
        functions = self._functions()
        self._envs = {
            scope: cel.NewEnv(
                variables=dict.fromkeys(names, cel.Type.DYN),
                functions=functions,
            )
            for scope, names in SCOPE_VARIABLES.items()
        }

    def _window(self, text: str) -> float:
        seconds = self._windows.get(text)
        if seconds is None:
            seconds = self._windows[text] = parse_duration(text)
        return seconds

    def _ctx(self) -> TargetContext:
        if self._context is None:
            msg = "a window function was called outside an evaluation"
            raise RuntimeError(msg)
        return self._context

    def _functions(self) -> list[cel.FunctionDecl]:
        def decl(
            name: str,
            params: list[cel.Type],
            returns: cel.Type,
            impl: Callable[..., Any],
        ) -> cel.FunctionDecl:
            overload = cel.Overload(
                f"fleetwatch_{name}",
                return_type=returns,
                parameters=params,
                impl=impl,
            )
            return cel.FunctionDecl(name, [overload])

        def increase(signal: str, window: str) -> float:
            return float(self._ctx().increase(signal, self._window(window)))

        def rate(signal: str, window: str) -> float:
            seconds = self._window(window)
            return float(self._ctx().increase(signal, seconds)) / seconds if seconds else 0.0

        s, d = cel.Type.STRING, cel.Type.DOUBLE
        return [
            decl(
                "events", [s, s], cel.Type.INT, lambda k, w: self._ctx().events(k, self._window(w))
            ),
            decl("xids", [s], cel.Type.DYN, lambda w: self._ctx().xids(self._window(w))),
            decl("increase", [s, s], d, increase),
            decl("rate", [s, s], d, rate),
            decl("rises", [s, s], cel.Type.INT, lambda g, w: self._ctx().rises(g, self._window(w))),
            decl(
                "share_of_ports",
                [s, d],
                d,
                lambda sig, above: self._ctx().share_of_ports(sig, above),
            ),
        ]

    def compile(self, scope: Scope, condition: str) -> cel.Expression:
        """Compile and type-check a condition; ConditionError says what is wrong."""
        durations = re.findall(
            r"""(?:events|increase|rate|rises)\(\s*["'][^"']*["']\s*,\s*["']([^"']*)["']""",
            condition,
        )
        durations += re.findall(r"""xids\(\s*["']([^"']*)["']""", condition)
        for text in durations:
            try:
                self._window(text)
            except ValueError as exc:
                raise ConditionError(str(exc)) from exc
        try:
            return self._envs[scope].compile(condition)
        except RuntimeError as exc:
            # CEL quotes the condition (twice: the text and a caret line); a long one is cut.
            text = str(exc).removeprefix("INVALID_ARGUMENT: ")
            cut = text if len(text) <= MAX_PROBLEM else text[: MAX_PROBLEM - 3] + "..."
            raise ConditionError(cut) from exc

    def type_problem(self, scope: Scope, condition: str) -> str | None:
        """Why a condition that compiles cannot give true or false, or None when it can.

        A type error CEL sees once the fields have types (``node.name + 1``), or a condition of
        another type than bool (``node.gpus``, ``job.summary``).
        """
        if self._types is None:
            self._types = ConditionTypes(SCOPE_VARIABLES)
        return self._types.problem(scope, condition)

    def evaluate(
        self,
        expression: cel.Expression,
        data: dict[str, Any],
        context: TargetContext,
    ) -> tuple[bool, str | None]:
        """Run a compiled condition: (result, None), or (False, why) when it errored."""
        self._context = context
        try:
            value = expression.eval(data=data).value()
        except RuntimeError as exc:  # the runtime refuses, e.g. a function raised
            return False, str(exc)
        finally:
            self._context = None
        if isinstance(value, bool):
            return value, None
        return False, str(value)  # an error value (e.g. a missing key) or a non-boolean

    def number(
        self,
        expression: cel.Expression,
        data: dict[str, Any],
        context: TargetContext,
    ) -> float | None:
        """Run a compiled expression that gives a number; None when it gives none (or errs)."""
        self._context = context
        try:
            value = expression.eval(data=data).value()
        except RuntimeError:
            return None
        finally:
            self._context = None
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        return float(value)
