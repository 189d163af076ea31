"""What a rule's condition reads, from its text: the names it says, its windows, its reach.

The evaluator reads these once per rule set to decide which samples matter (a sample of a signal
no condition names cannot change an answer), which rules a changed signal sends a target through,
how much of a target's data to hand CEL, and which rules see beyond their own target.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Final

from rules.durations import parse_duration

if TYPE_CHECKING:
    from rules.model import Rule, RuleSet

# Samples that change what the rules see under another name (gpu.present, nvlinks_down, a port's
# state and up): they mark their target whatever the conditions say.
MODEL_SIGNALS: Final = frozenset({"gpu_present", "nvlink_up", "ib_state", "ib_phys_state"})
# A condition that walks a signals map (size(), a macro over it) reads every signal in it.
_WALKS_SIGNALS: Final = re.compile(
    r"signals\s*(\)|,|\.\s*(all|exists|exists_one|filter|map)\s*\()|in\s+[\w.]*signals\b"
)
_WORD: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_INDEXES_SIGNALS: Final = re.compile(r"signals\s*\[")
# A condition that reads these sees more than its own target: the sweep evaluates it everywhere.
_READS_FLEET: Final = re.compile(r"\b(fleet|share_of_ports)\b")
# A window function call with literal arguments: what a condition of windows alone is made of.
_WINDOW_CALL: Final = re.compile(
    r"""\b(?:rate|increase|rises|events|xids)\(\s*["'][^"']*["']\s*(?:,\s*["'][^"']*["']\s*)?\)"""
)
# What may remain of such a condition once its window calls are taken out: numbers, operators.
_ONLY_ARITHMETIC: Final = re.compile(r"[\s\d.eE<>=!&|()+\-*/%]*")
# A counter window: the signal and the window of ``increase(...)``, ``rate(...)`` or
# ``rises(...)``.
_COUNTER_WINDOW: Final = re.compile(
    r"""(?:increase|rate|rises)\(\s*["']([^"']+)["']\s*,\s*["']([^"']+)["']"""
)


def rule_texts(rule: Rule) -> tuple[str, str]:
    """What a rule's answer is computed from: its condition and its occurrence count ("")."""
    counted = rule.escalation.occurrences if rule.escalation is not None else ""
    return rule.when, counted or ""


def rule_words(rule: Rule) -> frozenset[str]:
    """Every word of a rule's condition and of its occurrence count: the signals it can read."""
    return frozenset(word for text in rule_texts(rule) for word in _WORD.findall(text))


def reads_fleet(rule: Rule) -> bool:
    """Whether the rule's condition reads beyond its target (``fleet``, ``share_of_ports()``)."""
    return _READS_FLEET.search(rule.when) is not None


def reads_named_signals(rule: Rule) -> bool:
    """Whether the rule reads signals only by name (``x.signals.name``).

    Never the whole map, and never by a computed key: then a signals map can be cut to the names
    the rule says.
    """
    return not any(
        _WALKS_SIGNALS.search(text) or _INDEXES_SIGNALS.search(text) for text in rule_texts(rule)
    )


def reads_windows_only(rule: Rule) -> bool:
    """Whether the rule's condition reads nothing but window functions of its target.

    Such a condition answers the same on every target whose windows are still (no event and no
    counter step inside them): ``rate("nvlink_crc_errors", "5m") > 100.0`` is one.
    """
    rest = _WINDOW_CALL.sub(" 0 ", rule.when)
    return rest != rule.when and _ONLY_ARITHMETIC.fullmatch(rest) is not None


def watched_signals(rules: RuleSet) -> frozenset[str] | None:
    """The signals whose samples can change a condition: every word of every rule's condition.

    With the model's own signals; a sample of any other cannot change what a rule sees. None
    (watch them all) when a condition walks a signals map.
    """
    words: set[str] = set(MODEL_SIGNALS)
    for rule in rules.rules:
        for text in rule_texts(rule):
            if _WALKS_SIGNALS.search(text):
                return None
            words.update(_WORD.findall(text))
    return frozenset(words)


def sample_windows(rules: RuleSet) -> dict[str, float]:
    """The longest window each counter signal is asked over, by any rule."""
    windows: dict[str, float] = {}
    for rule in rules.rules:
        for signal, window in _COUNTER_WINDOW.findall(" ".join(rule_texts(rule))):
            windows[signal] = max(windows.get(signal, 0.0), parse_duration(window))
    return windows
