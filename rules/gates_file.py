"""Read and check a pre-flight gates file (``rules/preflight_gates.yaml``) into a ``GateBook``.

The file is checked like the rule files: every problem names the file, the line and the key
path, and all problems are reported at once (:class:`GatesFileError`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from fleetwatch.config_file import short_repr, shown_path
from fleetwatch.preflight.vocabulary import Check
from rules.gates import (
    GPU_MODELS,
    NICS,
    TEXT_KINDS,
    UNITS,
    Gate,
    GateBook,
    GateKind,
    OutlierRule,
    shown_number,
)
from rules.yaml_lines import (
    KeyPath,
    YamlTextError,
    builtin_text,
    compose,
    key_lines,
    line_of,
    read_text,
)

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

BUILTIN: Final = ("rules", "preflight_gates.yaml")
BUILTIN_SOURCE: Final = "builtin/preflight_gates.yaml"
MAX_NUMBER: Final = 1e9
_NAMED_KINDS: Final = frozenset(
    {GateKind.GPU_MODEL, GateKind.LINK_AT_MAX, GateKind.SAME_ON_ALL_NODES, GateKind.RECORDED}
)
_GATE_KEYS: Final = frozenset(
    {
        "fail_below",
        "warn_below",
        "fail_above",
        "warn_above",
        "expect",
        "kind",
        "unit",
        "source",
        "note",
        "outlier",
    }
)
_OUTLIER_KEYS: Final = frozenset({"direction", "min_values", "warn_z", "fail_z", "min_deviation"})
_TOP_KEYS: Final = frozenset({"version", "outlier", "gates", "models", "nics", "profiles"})
_DIRECTIONS: Final = ("low", "high", "both")


class GatesFileError(ValueError):
    """A gates file has problems; ``problems`` lists them all, one per line in the message."""

    def __init__(self, problems: list[GateProblem]) -> None:
        """Keep every problem."""
        super().__init__("\n".join(str(p) for p in problems))
        self.problems = problems


@dataclass(frozen=True, slots=True)
class GateProblem:
    """One thing wrong in a gates file: ``file:line: key.path: message``."""

    source: str
    line: int
    where: str
    message: str

    def __str__(self) -> str:
        """``file:line: where: message``."""
        who = f"{self.where}: " if self.where else ""
        return f"{self.source}:{self.line}: {who}{self.message}"


class _Checker:
    """Builds gates from parsed YAML, collecting problems instead of stopping at the first."""

    def __init__(self, source: str, lines: dict[KeyPath, int]) -> None:
        self.source = source
        self.lines = lines
        self.problems: list[GateProblem] = []

    def line(self, path: KeyPath) -> int:
        return line_of(self.lines, path)

    def problem(self, path: KeyPath, message: str) -> None:
        self.problems.append(GateProblem(self.source, self.line(path), ".".join(path), message))

    def number(self, raw: object, path: KeyPath) -> float | None:
        if isinstance(raw, bool) or not isinstance(raw, int | float):
            self.problem(path, f"must be a number, not {short_repr(raw)}")
            return None
        value = float(raw)
        if not math.isfinite(value) or not 0 <= value <= MAX_NUMBER:
            self.problem(path, f"must be a number from 0 to {MAX_NUMBER:g}, not {short_repr(raw)}")
            return None
        return value

    def text(self, raw: object, path: KeyPath, *, required: bool) -> str:
        if raw is None and not required:
            return ""
        if not isinstance(raw, str) or (required and not raw.strip()):
            self.problem(path, f"must be a non-empty string, not {short_repr(raw)}")
            return ""
        return raw

    def mapping(self, raw: object, path: KeyPath) -> dict[Any, Any]:
        if raw is None:
            return {}
        if not isinstance(raw, dict):
            self.problem(path, f"must be a mapping, not {short_repr(raw)}")
            return {}
        return raw

    def outlier(self, raw: object, path: KeyPath) -> OutlierRule:
        table = self.mapping(raw, path)
        for key in sorted(set(table) - _OUTLIER_KEYS, key=str):
            known = ", ".join(sorted(_OUTLIER_KEYS))
            self.problem((*path, str(key)), f"unknown key {short_repr(key)}; known: {known}")
        rule = OutlierRule()
        direction = table.get("direction", rule.direction)
        if direction not in _DIRECTIONS:
            self.problem((*path, "direction"), f"must be low, high or both, not {direction!r}")
            direction = rule.direction
        numbers: dict[str, float | None] = {}
        for key in ("min_values", "warn_z", "fail_z", "min_deviation"):
            default = getattr(rule, key)
            raw_value = table.get(key, default)
            if raw_value is None and key == "fail_z":
                numbers[key] = None
                continue
            numbers[key] = self.number(raw_value, (*path, key))
            if numbers[key] is None:
                numbers[key] = default
        min_values = numbers["min_values"]
        if min_values is not None and (min_values != int(min_values) or min_values < 3):  # noqa: PLR2004
            self.problem((*path, "min_values"), f"must be a whole number >= 3, not {min_values:g}")
            min_values = rule.min_values
        fail_z, warn_z = numbers["fail_z"], numbers["warn_z"] or rule.warn_z
        if fail_z is not None and fail_z < warn_z:
            self.problem((*path, "fail_z"), f"must not be below warn_z {warn_z:g}, not {fail_z:g}")
        return OutlierRule(
            direction=str(direction),
            min_values=int(min_values or rule.min_values),
            warn_z=numbers["warn_z"] or rule.warn_z,
            fail_z=numbers["fail_z"],
            min_deviation=numbers["min_deviation"] or 0.0,
        )

    def gates(
        self, raw: Mapping[Any, Any], path: KeyPath, scope: str, extra: frozenset[str]
    ) -> dict[Check, Gate]:
        out: dict[Check, Gate] = {}
        known = [c.value for c in Check]
        for key, spec in raw.items():
            if key in extra:
                continue
            where = (*path, str(key))
            if key not in known:
                self.problem(where, f"unknown check {short_repr(key)}; checks: {', '.join(known)}")
                continue
            gate = self.gate(Check(key), spec, where, scope)
            if gate is not None:
                out[Check(key)] = gate
        return out

    def gate(self, check: Check, raw: object, path: KeyPath, scope: str) -> Gate | None:
        if not isinstance(raw, dict):
            self.problem(path, f"a gate must be a mapping, not {short_repr(raw)}")
            return None
        before = len(self.problems)
        for key in sorted(set(raw) - _GATE_KEYS, key=str):
            known = ", ".join(sorted(_GATE_KEYS))
            self.problem((*path, str(key)), f"unknown key {short_repr(key)}; known: {known}")
        kind = self._kind(check, raw, path)
        source = self.text(raw.get("source"), (*path, "source"), required=True)
        note = self.text(raw.get("note"), (*path, "note"), required=False)
        unit = self.text(raw.get("unit"), (*path, "unit"), required=False)
        want = UNITS.get(check)
        if want is not None and unit != want:
            self.problem((*path, "unit"), f"{check} is measured in {want}, not {unit!r}")
        compare, own_rule = self._compare(raw.get("outlier", True), (*path, "outlier"))
        fail = warn = None
        if kind in {GateKind.AT_LEAST, GateKind.AT_MOST}:
            suffix = "below" if kind is GateKind.AT_LEAST else "above"
            fail = self.number(raw[f"fail_{suffix}"], (*path, f"fail_{suffix}"))
            if f"warn_{suffix}" in raw:
                warn = self.number(raw[f"warn_{suffix}"], (*path, f"warn_{suffix}"))
            wrong_side = (
                warn is not None
                and fail is not None
                and (warn < fail if kind is GateKind.AT_LEAST else warn > fail)
            )
            if wrong_side:
                self.problem(
                    (*path, f"warn_{suffix}"),
                    f"the warn bar {shown_number(warn)} must not be on the failing side of "
                    f"fail_{suffix} {shown_number(fail)}",
                )
        elif kind is GateKind.EQUALS:
            fail = self.number(raw["expect"], (*path, "expect"))
        if kind is None or len(self.problems) > before:
            return None
        line = self.line(path)
        return Gate(
            check, kind, scope, source, unit, fail, warn, note, compare is True, line, own_rule
        )

    def _compare(self, raw: object, path: KeyPath) -> tuple[bool, OutlierRule | None]:
        """A gate's ``outlier``: compared or not, and its own rule (None: the file's)."""
        if isinstance(raw, dict):  # this check's own outlier rule
            return True, self.outlier(raw, path)
        if not isinstance(raw, bool):
            self.problem(
                path, f"must be true, false or an outlier rule (a mapping), not {short_repr(raw)}"
            )
            return True, None
        return raw, None

    def _kind(self, check: Check, raw: Mapping[Any, Any], path: KeyPath) -> GateKind | None:
        forms = [
            form
            for form, present in (
                (GateKind.AT_LEAST, "fail_below" in raw),
                (GateKind.AT_MOST, "fail_above" in raw),
                (GateKind.EQUALS, "expect" in raw),
                (None, "kind" in raw),
            )
            if present
        ]
        stray = {"warn_below"} if "fail_below" not in raw else set()
        stray |= {"warn_above"} if "fail_above" not in raw else set()
        for key in sorted(stray & set(raw)):
            self.problem((*path, key), f"{key} needs its fail bar too")
        if len(forms) != 1:
            self.problem(
                path,
                "a gate has exactly one of fail_below, fail_above, expect or kind"
                + (f" (found {len(forms)})" if forms else ""),
            )
            return None
        kind = forms[0]
        if kind is None:
            named = raw["kind"]
            allowed = sorted(k.value for k in _NAMED_KINDS)
            if named not in allowed:
                shown = short_repr(named)
                self.problem((*path, "kind"), f"must be one of {', '.join(allowed)}, not {shown}")
                return None
            kind = GateKind(named)
        text_kind = TEXT_KINDS.get(check)
        if text_kind is not None and kind is not text_kind:
            self.problem(path, f"{check} is a text; its gate is kind: {text_kind}")
            return None
        if text_kind is None and kind in _NAMED_KINDS - {GateKind.RECORDED}:
            self.problem(path, f"{check} is a number; kind {kind} does not judge numbers")
            return None
        return kind


def _models(checker: _Checker, raw: object) -> dict[str, dict[Check, Gate]]:
    models: dict[str, dict[Check, Gate]] = {}
    for name, table in checker.mapping(raw, ("models",)).items():
        path = ("models", str(name))
        if name not in GPU_MODELS:
            known = ", ".join(GPU_MODELS)
            checker.problem(path, f"unknown GPU model {short_repr(name)}; models: {known}")
            continue
        models[name] = checker.gates(checker.mapping(table, path), path, name, frozenset())
    return models


def _nics(checker: _Checker, raw: object) -> tuple[dict[str, dict[Check, Gate]], dict[str, float]]:
    nics: dict[str, dict[Check, Gate]] = {}
    rates: dict[str, float] = {}
    for name, value in checker.mapping(raw, ("nics",)).items():
        path = ("nics", str(name))
        if name not in NICS:
            checker.problem(path, f"unknown NIC {short_repr(name)}; NICs: {', '.join(NICS)}")
            continue
        table = checker.mapping(value, path)
        rate = checker.number(table.get("line_rate_gbps"), (*path, "line_rate_gbps"))
        if rate is not None:
            rates[name] = rate
        nics[name] = checker.gates(table, path, name, frozenset({"line_rate_gbps"}))
    return nics, rates


def _profiles(checker: _Checker, raw: object) -> dict[str, dict[Check, Gate]]:
    profiles: dict[str, dict[Check, Gate]] = {}
    for name, value in checker.mapping(raw, ("profiles",)).items():
        path = ("profiles", str(name))
        table = checker.mapping(value, path)
        checker.text(table.get("description"), (*path, "description"), required=False)
        scope = f"profile {name}"
        profiles[str(name)] = checker.gates(table, path, scope, frozenset({"description"}))
    return profiles


def parse_gates(text: str, source: str) -> GateBook:
    """Parse and check a gates file; :class:`GatesFileError` lists every problem found."""
    try:
        data, node = compose(text)
    except YamlTextError as exc:
        raise GatesFileError([GateProblem(source, exc.line, "", exc.message)]) from exc
    checker = _Checker(source, key_lines(node))
    if not isinstance(data, dict) or data.get("version") != 1:
        checker.problem(("version",), "expected a mapping with 'version: 1'")
        raise GatesFileError(checker.problems)
    for key in sorted(set(data) - _TOP_KEYS, key=str):
        known = ", ".join(sorted(_TOP_KEYS))
        checker.problem((str(key),), f"unknown top-level key {short_repr(key)}; known: {known}")
    outlier = checker.outlier(data.get("outlier"), ("outlier",))
    common = checker.gates(
        checker.mapping(data.get("gates"), ("gates",)), ("gates",), "common", frozenset()
    )
    models = _models(checker, data.get("models"))
    nics, rates = _nics(checker, data.get("nics"))
    profiles = _profiles(checker, data.get("profiles"))
    if checker.problems:
        raise GatesFileError(checker.problems)
    return GateBook(source, common, models, nics, rates, profiles, outlier)


def load_gates(path: Path | None = None, profile: str | None = None) -> GateBook:
    """Load a gates file (None: the built-in ``rules/preflight_gates.yaml``).

    ``profile`` (e.g. ``"cpu"``) puts that profile's gates first. Raises
    :class:`GatesFileError` naming the file, line and key of every problem.
    """
    if path is None:
        text = builtin_text(BUILTIN)
        source = BUILTIN_SOURCE
    else:
        source = shown_path(path)
        try:
            text = read_text(path)
        except YamlTextError as exc:
            raise GatesFileError([GateProblem(source, exc.line, "", exc.message)]) from exc
    book = parse_gates(text, source)
    if profile is None:
        return book
    try:
        return book.with_profile(profile)
    except KeyError as exc:
        raise GatesFileError([GateProblem(source, 1, "profiles", str(exc.args[0]))]) from exc
