"""Strategies for hostile input, and the count of inputs each fuzz target was given.

Every property calls :func:`tried` once per input, so ``bench/fuzz.py`` can say honestly how
many inputs it threw at each target.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from hypothesis import strategies as st

TRIED: Counter[str] = Counter()
LAST = [""]  # the target given the latest input: a crash is blamed on it

# Message length a rejection may have: enough to name the key and show a bit of the value,
# never the whole of a hostile one.
MAX_MESSAGE = 2_000


def tried(target: str) -> None:
    """Count one input given to ``target``."""
    TRIED[target] += 1
    LAST[0] = target


def assert_clear(exc: object, *needles: str, limit: int | None = MAX_MESSAGE) -> None:
    """A rejection's message is short (``limit``), says something, names one of ``needles``."""
    text = str(exc)
    assert text.strip(), f"{type(exc).__name__} with an empty message"
    assert limit is None or len(text) <= limit, f"{len(text)}-character message: {text[:200]}..."
    if needles:
        assert any(n in text for n in needles), f"message names none of {needles}: {text[:300]}"


HUGE_INTS = st.sampled_from(
    [2**31, 2**32, 2**53 + 1, 2**63, 2**64, 2**64 * 4, 10**30, 10**400, -(2**63) - 1, -1, -(10**50)]
)
ABSURD_FLOATS = st.sampled_from(
    [math.nan, math.inf, -math.inf, -0.0, 1e308, -1e308, 5e-324, 1e19, -1.0, 1e-300]
)
NUMBERS = st.one_of(
    st.integers(),
    HUGE_INTS,
    st.floats(allow_nan=True, allow_infinity=True),
    ABSURD_FLOATS,
    st.booleans(),
)
WEIRD_TEXT = st.one_of(
    st.text(max_size=64),
    st.text(alphabet=st.characters(codec="utf-8"), max_size=32),
    st.sampled_from(
        [
            "",
            " ",
            "\x00",
            "²",
            "٣",
            "\u202e",
            "nan",
            "inf",
            "-1",
            "0x10",
            "1_000",
            "../../etc/passwd",
            "a" * 300,
            "x" * 5000,
            "9" * 5000,
            "🙂" * 100,
        ]
    ),
)
SCALARS = st.one_of(st.none(), NUMBERS, WEIRD_TEXT)


def nested(leaves: st.SearchStrategy[Any] = SCALARS) -> st.SearchStrategy[Any]:
    """Lists and string-keyed mappings of ``leaves``, a few levels deep."""
    return st.recursive(
        leaves,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4),
            st.dictionaries(st.text(max_size=12), inner, max_size=4),
        ),
        max_leaves=12,
    )


def deep(depth: int, opener: str = "[", closer: str = "]") -> str:
    """Text nested ``depth`` levels deep, e.g. ``[[[...]]]``."""
    return opener * depth + closer * depth


def alias_bomb(levels: int = 9, width: int = 9) -> str:
    """YAML whose value, written out in full, has ``width ** levels`` leaves (billion laughs)."""
    lines = ['a0: &a0 ["lol"]']
    for i in range(1, levels + 1):
        refs = ", ".join([f"*a{i - 1}"] * width)
        lines.append(f"a{i}: &a{i} [{refs}]")
    return "\n".join(lines) + "\n"
