"""Remembered answers of rule conditions that depend on nothing but the values they name.

A busy GPU's temperature moves every poll, and each move sends the GPU through the heat rules:
thousands of CEL evaluations a second at fleet size, nearly all with inputs seen a moment ago
on this GPU or another (a healthy node's maps look alike: the same zeros, the same limits).
Handing CEL its maps was most of an evaluation's cost. A condition that reads only fields it
names (no macro over a map, no computed key, no map or list literal, no map compared whole) and
windows by literal arguments (``events("sxid", "1h")``, ``increase(...)``, ``rate(...)``,
``rises(...)``, ``xids("10m")`` and a macro over what it returns) is a pure function of those
fields and those windows' values, so its answer is kept under the tuple of them and used again
while the same values come back: a healthy node's windows are all zero, and asking them is
cheap beside CEL.

The key keeps each value's type (CEL tells ``1`` from ``1.0`` and ``true`` from ``1``; Python's
hashing does not) and marks a field that is absent (``has()`` reads absence). A variable's map
and its ``signals`` map are cut to the names the condition says. A value that cannot be part
of a key (a deeper map, a list) means no memo for that evaluation: CEL answers it.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Final

from rules.cel_env import VARIABLE_FIELDS, signal_references
from rules.durations import parse_duration

if TYPE_CHECKING:
    from collections.abc import Hashable

    from rules.cel_env import TargetContext

MEMO_LIMIT: Final = 8192  # answers kept per rule; all of them dropped when it is reached
VARIABLES: Final = ("node", "gpu", "rank", "link", "port", "job", "fleet")
_ABSENT: Final = object()  # a field the map does not have
_NO_SIGNALS: Final = object()  # a variable with no signals map at all
_WORD: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_VARIABLE = r"\b(?:node|gpu|rank|link|port|job|fleet)\b"
_LITERAL = r"""(["'])([^"'\\]*)\{n}"""
# A window asked with literal arguments: its value goes into the key.
_CALL: Final = re.compile(
    r"\b(events|increase|rate|rises)\(\s*"
    + _LITERAL.format(n=2)
    + r"\s*,\s*"
    + _LITERAL.format(n=4)
    + r"\s*\)|\b(xids)\(\s*"
    + _LITERAL.format(n=7)
    + r"\s*\)"
)
_CALL_MACRO: Final = re.compile(r"__window__\s*\.\s*(?:all|exists|exists_one|filter|map)\s*\(")
# What makes a condition read more than the fields it names (checked once the windows asked
# with literal arguments are taken out: any window left has computed arguments, or is the fleet's).
_IMPURE: Final = re.compile(
    r"\b(?:events|xids|increase|rate|rises|share_of_ports|size)\s*\("  # these; size() of a map
    r"|\.\s*(?:all|exists|exists_one|filter|map|size)\s*\("  # macros that walk a map
    r"|[\w)\]]\s*\["  # an index: a key that may be computed
    r"|\{"  # a map literal: a map compared whole
    r"|\bcel\s*\.\s*bind\b"  # a map under another name
    r"|\bin\b"  # `x in m`: a key test on a map may name no field
    rf"|(?:==|!=)\s*{_VARIABLE}\s*(?:$|[^.\s])|{_VARIABLE}\s*(?:==|!=)"  # a variable whole
    r"|(?:==|!=)\s*[\w.]*\bsignals\b\s*(?:$|[^.\s])|\bsignals\s*(?:==|!=)"  # signals whole
)


def memo_fields(condition: str) -> tuple[str, ...] | None:
    """The names a pure condition reads, sorted; None when its answer may depend on more."""
    if _IMPURE.search(_CALL_MACRO.sub("__window__(", _CALL.sub("__window__", condition))):
        return None
    return tuple(sorted(set(_WORD.findall(condition))))


# A window in a key: (function, its signal or event kind ("" for xids), its seconds).
Window = tuple[str, str, float]
# (variable, its fields read, the signals of its ``signals`` map read, or None for no map)
Plan = tuple[tuple[str, tuple[str, ...], tuple[str, ...] | None], ...]


def memo_windows(condition: str) -> tuple[Window, ...]:
    """The windows a pure condition asks, with literal arguments, in order of appearance."""
    out: list[Window] = []
    for match in _CALL.finditer(condition):
        if match.group(6):  # xids(window)
            out.append(("xids", "", parse_duration(match.group(8))))
        else:
            function = "increase" if match.group(1) == "rate" else match.group(1)
            out.append((function, match.group(3), parse_duration(match.group(5))))
    return tuple(dict.fromkeys(out))


def memo_plan(condition: str) -> Plan | None:
    """What to read of each variable for a pure condition's key; None when it is not pure."""
    words = memo_fields(condition)
    if words is None:
        return None
    named = set(words)
    signals = tuple(sorted(signal_references(_CALL.sub("", condition))))
    return tuple(
        (
            variable,
            tuple(sorted((named & VARIABLE_FIELDS.get(variable, named)) - {"signals"})),
            signals if "signals" in named else None,
        )
        for variable in VARIABLES
        if variable in named
    )


def window_values(windows: tuple[Window, ...], context: TargetContext) -> list[object]:
    """What each window asks of ``context``: the values CEL's functions would see."""
    values: list[object] = []
    for function, name, seconds in windows:
        if function == "events":
            values.append(context.events(name, seconds))
        elif function == "increase":  # rate() is increase() over the window's seconds
            values.append(float(context.increase(name, seconds)))
        elif function == "rises":  # not increase(): one step of 2 and two steps of 1 differ
            values.append(int(context.rises(name, seconds)))
        else:
            # The evaluator's context keys the Xids in a window by two numbers; a list of a
            # thousand entries (a flood) as part of every key cost memory and time per event.
            keyed = getattr(context, "xids_key", None)
            if keyed is not None:
                values.append(keyed(seconds))
            else:
                values.append(
                    tuple(tuple(sorted(entry.items())) for entry in context.xids(seconds))
                )
    return values


def memo_key(data: dict[str, Any], plan: Plan, windows: list[object] | None = None) -> Hashable:
    """The key of a pure condition's inputs in ``data``: the values it names, then their types.

    A value that cannot be a key (a map or a list) makes the key unhashable: the caller takes
    the ``TypeError`` as "no memo for this evaluation".
    """
    values: list[object] = list(windows or ())
    for variable, fields, signals in plan:
        mapping = data.get(variable)
        if not isinstance(mapping, dict):
            values.append(mapping)  # absent (None), or not a map: kept as it is
            continue
        get = mapping.get
        values += [get(name, _ABSENT) for name in fields]
        if signals is not None:
            read = get("signals")
            if isinstance(read, dict):
                values += [read.get(name, _ABSENT) for name in signals]
            else:
                values.append(_NO_SIGNALS if read is None else read)
    return (*values, *map(type, values))


class ConditionMemo:
    """The remembered (holds, error) answers of one rule set's pure conditions."""

    def __init__(self, conditions: dict[str, str]) -> None:
        """``conditions``: each rule's ``when``, by rule name."""
        self._plans: dict[str, Plan] = {}
        self._windows: dict[str, tuple[Window, ...]] = {}
        for name, condition in conditions.items():
            plan = memo_plan(condition)
            if plan is not None:
                self._plans[name] = plan
                self._windows[name] = memo_windows(condition)
        self._answers: dict[str, dict[Hashable, tuple[bool, str | None]]] = {
            name: {} for name in self._plans
        }
        self.hits = 0
        self.misses = 0

    def pure(self, rule: str) -> bool:
        """Whether ``rule``'s answers are remembered."""
        return rule in self._plans

    def key(
        self, rule: str, data: dict[str, Any], context: TargetContext | None = None
    ) -> Hashable | None:
        """The key ``data`` (and the target's windows) have for ``rule``; None when none.

        None when the rule is not pure, a value cannot be part of a key, or the rule asks a
        window and no ``context`` was given.
        """
        plan = self._plans.get(rule)
        if plan is None:
            return None
        windows = self._windows[rule]
        if windows and context is None:
            return None
        key = memo_key(data, plan, window_values(windows, context) if context else None)
        try:
            hash(key)
        except TypeError:  # a map or a list among the values: no memo this time
            return None
        return key

    def get(self, rule: str, key: Hashable) -> tuple[bool, str | None] | None:
        """The answer remembered for ``key``, or None."""
        found = self._answers[rule].get(key)
        if found is None:
            self.misses += 1
        else:
            self.hits += 1
        return found

    def put(self, rule: str, key: Hashable, answer: tuple[bool, str | None]) -> None:
        """Remember ``answer`` for ``key`` (the rule's answers start over at ``MEMO_LIMIT``)."""
        answers = self._answers[rule]
        if len(answers) >= MEMO_LIMIT:
            answers.clear()
        answers[key] = answer
