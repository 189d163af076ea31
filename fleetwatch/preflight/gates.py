"""Gates: the bar each pre-flight check must clear, as data (``rules/preflight_gates.yaml``).

A gate belongs to a GPU model (A100, H100, H200, B200, B300), a NIC (HDR, NDR, XDR), the file's
common ``gates``, or a named profile (``cpu``: the tests' gloo-on-CPU scale). :meth:`GateBook.judge`
finds the gate for a measurement (profile, then model, then NIC, then common) and says pass,
warn, fail or could-not-run with a one-line reason. :func:`outliers` compares the values of one
check across the fleet with a robust z-score (median and median absolute deviation), for what
no fixed bar catches.

The file is checked like the rule files: every problem names the file, the line and the key
path, and all problems are reported at once.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum
from importlib import resources
from typing import TYPE_CHECKING, Any, Final

import yaml

from fleetwatch.config_file import short_repr, shown_path, utf8_line
from fleetwatch.preflight.vocabulary import LEVEL_OF, Check, Level, Measurement, Verdict

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path

BUILTIN: Final = ("rules", "preflight_gates.yaml")
BUILTIN_SOURCE: Final = "builtin/preflight_gates.yaml"
GPU_MODELS: Final = ("A100", "H100", "H200", "B200", "B300")
NICS: Final = ("HDR", "NDR", "XDR")
MAD_TO_SIGMA: Final = 1.4826  # the MAD of a normal distribution times this is its sigma
SPREAD_FLOOR: Final = 0.01  # the spread is at least 1% of the median (a fleet of equal values)
MAX_NUMBER: Final = 1e9

# The unit each measured check is reported in; a gate in another unit is a file error, and a
# measurement in another unit is not judged (Gb/s against GB/s is a factor of eight).
UNITS: Final[dict[Check, str]] = {
    Check.P2P_BW: "GB/s",
    Check.P2P_BIDIR_BW: "GB/s",
    Check.H2D_BW: "GB/s",
    Check.D2H_BW: "GB/s",
    Check.ALLREDUCE_NODE: "GB/s",
    Check.ALLREDUCE_MULTI: "GB/s",
    Check.IB_WRITE_BW: "Gb/s",
    Check.LADDER_THROUGHPUT: "samples/s",
    Check.LADDER_EFFICIENCY: "ratio",
    Check.GPU_UTILISATION: "percent",
}


class GateKind(StrEnum):
    """How a gate judges a value."""

    AT_LEAST = "at_least"  # fail_below / warn_below
    AT_MOST = "at_most"  # fail_above / warn_above
    EQUALS = "equals"  # expect
    GPU_MODEL = "gpu_model"  # the text names the model
    LINK_AT_MAX = "link_at_max"  # "gen5 x16 (max gen5 x16)"
    SAME_ON_ALL_NODES = "same_on_all_nodes"  # versions: see odd_ones_out
    RECORDED = "recorded"  # no bar


TEXT_KINDS: Final = {
    Check.GPU_MODEL: GateKind.GPU_MODEL,
    Check.GPU_PCIE_LINK: GateKind.LINK_AT_MAX,
    Check.NIC_PCIE_LINK: GateKind.LINK_AT_MAX,
    Check.DRIVER_VERSION: GateKind.SAME_ON_ALL_NODES,
    Check.CUDA_VERSION: GateKind.SAME_ON_ALL_NODES,
    Check.VBIOS_VERSION: GateKind.SAME_ON_ALL_NODES,
    Check.NIC_FIRMWARE: GateKind.SAME_ON_ALL_NODES,
}
_NAMED_KINDS: Final = frozenset(
    {GateKind.GPU_MODEL, GateKind.LINK_AT_MAX, GateKind.SAME_ON_ALL_NODES, GateKind.RECORDED}
)
_LINK: Final = re.compile(r"\s*gen(\d+)\s+x(\d+)\s+\(max\s+gen(\d+)\s+x(\d+)\)\s*", re.IGNORECASE)
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


@dataclass(frozen=True, slots=True)
class OutlierRule:
    """When a value is an outlier against the other values of the same check."""

    direction: str = "low"  # low | high | both: which side is bad
    min_values: int = 4  # fewer values: no comparison
    warn_z: float = 3.5
    fail_z: float | None = None  # None: outliers only warn
    min_deviation: float = 0.05  # and at least this share away from the median


@dataclass(frozen=True, slots=True)
class Gate:
    """The bar one check is judged by; ``scope`` says which part of the file it came from."""

    check: Check
    kind: GateKind
    scope: str  # "H100", "NDR", "common" or "profile cpu"
    source: str
    unit: str = ""
    fail: float | None = None  # the fail bar (expect for EQUALS)
    warn: float | None = None
    note: str = ""
    compare_fleet: bool = True
    line: int = 0
    outlier: OutlierRule | None = None  # this check's own rule; None: the file's ``outlier``

    @property
    def bar(self) -> str:
        """The bar in words: ``>= 335 GB/s``, ``<= 0 count``, ``= 1 flag``, ``at max``."""
        unit = f" {self.unit}" if self.unit else ""
        if self.kind is GateKind.AT_LEAST:
            return f">= {_num(self.fail)}{unit}"
        if self.kind is GateKind.AT_MOST:
            return f"<= {_num(self.fail)}{unit}"
        if self.kind is GateKind.EQUALS:
            return f"= {_num(self.fail)}{unit}"
        return {
            GateKind.GPU_MODEL: "the expected model",
            GateKind.LINK_AT_MAX: "at its maximum",
            GateKind.SAME_ON_ALL_NODES: "the same on every node",
        }.get(self.kind, "none")


@dataclass(frozen=True, slots=True)
class Judgement:
    """A measurement judged: the verdict, the gate applied (None if none) and why, in a line."""

    verdict: Verdict
    gate: Gate | None
    reason: str


@dataclass(frozen=True, slots=True)
class Outlier:
    """A value far from the fleet's median of the same check: its index in the list given."""

    index: int
    value: float
    verdict: Verdict
    median: float
    spread: float
    score: float
    reason: str


@dataclass(frozen=True, slots=True)
class GateBook:
    """The gates of one file, optionally with one profile's gates taking precedence."""

    source: str
    common: Mapping[Check, Gate]
    models: Mapping[str, Mapping[Check, Gate]]
    nics: Mapping[str, Mapping[Check, Gate]]
    line_rates: Mapping[str, float]
    profiles: Mapping[str, Mapping[Check, Gate]]
    outlier_default: OutlierRule = field(default_factory=OutlierRule)
    profile: str | None = None

    def with_profile(self, name: str | None) -> GateBook:
        """This book with profile ``name``'s gates first (None: no profile)."""
        if name is not None and name not in self.profiles:
            known = ", ".join(sorted(self.profiles)) or "none"
            msg = f"{self.source}: no gate profile {name!r} (profiles: {known})"
            raise KeyError(msg)
        return GateBook(
            self.source,
            self.common,
            self.models,
            self.nics,
            self.line_rates,
            self.profiles,
            self.outlier_default,
            name,
        )

    def gate(self, check: Check, gpu_model: str, nic: str) -> Gate | None:
        """The gate for ``check`` on a node with ``gpu_model`` and ``nic`` (None: no gate)."""
        model = model_of(gpu_model)
        layers: list[Mapping[Check, Gate]] = []
        if self.profile is not None:
            layers.append(self.profiles[self.profile])
        if model is not None:
            layers.append(self.models.get(model, {}))
        layers.extend((self.nics.get(nic.upper(), {}), self.common))
        for layer in layers:
            if check in layer:
                return layer[check]
        return None

    def nic_for_rate(self, rate_gbps: float) -> str | None:
        """The NIC whose line rate is ``rate_gbps`` (400: NDR), or None."""
        for name, rate in self.line_rates.items():
            if math.isclose(rate, rate_gbps):
                return name
        return None

    def judge(self, m: Measurement, gpu_model: str, nic: str) -> Judgement:
        """Judge one measurement on a node with ``gpu_model`` (NVML's name or A100..B300).

        Never a pass for something that did not run, has no gate, or is in the wrong unit.
        """
        gate = self.gate(m.check, gpu_model, nic)
        if m.error or not m.ran:
            why = m.error or "no result"
            return Judgement(Verdict.COULD_NOT_RUN, gate, f"{m.check} {m.component}: {why}")
        if gate is None:
            return Judgement(
                Verdict.COULD_NOT_RUN,
                None,
                f"{m.check} {m.component}: no gate for GPU model {gpu_model!r} and NIC {nic!r} "
                f"(models: {', '.join(self.models)}; NICs: {', '.join(self.nics)})",
            )
        want_unit = UNITS.get(m.check)
        if want_unit is not None and m.unit != want_unit:
            return Judgement(
                Verdict.COULD_NOT_RUN,
                gate,
                f"{m.check} {m.component}: measured in {m.unit!r}, judged in {want_unit!r}",
            )
        return _apply(gate, m, model_of(gpu_model))

    def outlier_rule(self, check: Check, gpu_model: str = "", nic: str = "") -> OutlierRule | None:
        """How ``check``'s values are compared with the fleet's; None: they are not."""
        if LEVEL_OF[check] is Level.QUICK:
            return None
        gate = self.gate(check, gpu_model, nic)
        if gate is not None and not gate.compare_fleet:
            return None
        if gate is not None and gate.outlier is not None:
            return gate.outlier
        return self.outlier_default

    def outliers(
        self, check: Check, values: Sequence[float | None], gpu_model: str = "", nic: str = ""
    ) -> list[Outlier]:
        """The outliers among ``values`` of one check (empty when it is not compared)."""
        rule = self.outlier_rule(check, gpu_model, nic)
        return [] if rule is None else outliers(values, rule)


def _num(value: float | None) -> str:
    if value is None:
        return "?"
    return f"{value:g}"


def model_of(name: str) -> str | None:
    """The model (A100..B300) that a GPU name such as ``NVIDIA H100 80GB HBM3`` is, or None."""
    upper = name.upper()
    if upper in GPU_MODELS:
        return upper
    found = [m for m in GPU_MODELS if re.search(rf"(?<![A-Z0-9]){m}(?![0-9])", upper)]
    return found[0] if len(found) == 1 else None


def _apply(gate: Gate, m: Measurement, model: str | None) -> Judgement:
    what = f"{m.check} {m.component}"
    if gate.kind is GateKind.RECORDED:
        return Judgement(Verdict.PASS, gate, f"{what}: {_shown(m)} recorded, no bar of its own")
    if gate.kind is GateKind.GPU_MODEL:
        if model is not None and model_of(m.text or "") == model:
            return Judgement(Verdict.PASS, gate, f"{what}: {m.text} is an {model}")
        expected = model or "known model"
        return Judgement(Verdict.FAIL, gate, f"{what}: {m.text!r} is not an {expected}")
    if gate.kind is GateKind.LINK_AT_MAX:
        return _link(gate, m, what)
    if gate.kind is GateKind.SAME_ON_ALL_NODES:
        shown = m.text or _shown(m)
        return Judgement(Verdict.PASS, gate, f"{what}: {shown}; compared across the nodes")
    return _numeric(gate, m, what)


def _numeric(gate: Gate, m: Measurement, what: str) -> Judgement:
    value = m.value
    if value is None or not math.isfinite(value) or gate.fail is None:
        return Judgement(Verdict.COULD_NOT_RUN, gate, f"{what}: no number to judge ({m.text!r})")
    failed = {
        GateKind.AT_LEAST: value < gate.fail,
        GateKind.AT_MOST: value > gate.fail,
        GateKind.EQUALS: not math.isclose(value, gate.fail),
    }[gate.kind]
    shown, cite = _shown(m), f"({gate.scope} gate)"
    if failed:
        return Judgement(Verdict.FAIL, gate, f"{what}: {shown}, needs {gate.bar} {cite}")
    warned = gate.warn is not None and (
        value < gate.warn if gate.kind is GateKind.AT_LEAST else value > gate.warn
    )
    if warned:
        return Judgement(
            Verdict.WARN,
            gate,
            f"{what}: {shown}, passes {gate.bar} but not the warn bar {_num(gate.warn)} {cite}",
        )
    return Judgement(Verdict.PASS, gate, f"{what}: {shown}, needs {gate.bar}")


def _link(gate: Gate, m: Measurement, what: str) -> Judgement:
    match = _LINK.fullmatch(m.text)
    if match is None:
        return Judgement(
            Verdict.COULD_NOT_RUN,
            gate,
            f"{what}: cannot read {m.text!r} (expected like 'gen5 x16 (max gen5 x16)')",
        )
    gen, width, max_gen, max_width = (int(g) for g in match.groups())
    if gen >= max_gen and width >= max_width:
        return Judgement(Verdict.PASS, gate, f"{what}: {m.text.strip()}")
    return Judgement(Verdict.FAIL, gate, f"{what}: {m.text.strip()}, below its maximum")


def _shown(m: Measurement) -> str:
    if m.value is None:
        return m.text
    unit = f" {m.unit}" if m.unit else ""
    return f"{m.value:.4g}{unit}"


def outliers(values: Sequence[float | None], rule: OutlierRule | None = None) -> list[Outlier]:
    """The values far from the median of ``values`` on the bad side, by a robust z-score.

    ``None`` and non-finite values are skipped (they could not run; their verdict says so). The
    spread is 1.4826 times the median absolute deviation, at least 1% of the median, so a fleet
    of equal values does not turn a 0.1% difference into an outlier.
    """
    rule = rule or OutlierRule()
    present = [(i, v) for i, v in enumerate(values) if v is not None and math.isfinite(v)]
    if len(present) < rule.min_values:
        return []
    numbers = [v for _, v in present]
    median = statistics.median(numbers)
    mad = statistics.median(abs(v - median) for v in numbers)
    spread = max(MAD_TO_SIGMA * mad, SPREAD_FLOOR * abs(median), 1e-12)
    found: list[Outlier] = []
    for index, value in present:
        signed = (value - median) / spread
        score = {"low": -signed, "high": signed, "both": abs(signed)}[rule.direction]
        deviation = abs(value - median) / abs(median) if median else math.inf
        if score < rule.warn_z or deviation < rule.min_deviation:
            continue
        verdict = Verdict.WARN
        if rule.fail_z is not None and score >= rule.fail_z:
            verdict = Verdict.FAIL
        side = "below" if value < median else "above"
        reason = (
            f"{value:.4g} is {deviation:.0%} {side} the fleet median {median:.4g} "
            f"(robust z {score:.1f}, warn at {rule.warn_z:g}"
            + ("" if rule.fail_z is None else f", fail at {rule.fail_z:g}")
            + ")"
        )
        found.append(Outlier(index, value, verdict, median, spread, score, reason))
    return found


def odd_ones_out(texts: Mapping[str, str]) -> dict[str, str]:
    """Nodes whose text (a version) differs from the most common one: node -> reason.

    With no single most common value (two nodes, two drivers), every node is named: nothing
    says which one is right.
    """
    counts = Counter(texts.values())
    if len(counts) <= 1:
        return {}
    ranked = counts.most_common()
    top, top_count = ranked[0]
    if ranked[1][1] == top_count:
        values = ", ".join(sorted(counts))
        return {node: f"{text!r}: no majority among {values}" for node, text in texts.items()}
    return {
        node: f"{text!r} where {top_count} of {len(texts)} nodes have {top!r}"
        for node, text in texts.items()
        if text != top
    }


# ---- loading -------------------------------------------------------------------------------


class _Checker:
    def __init__(self, source: str, lines: dict[tuple[str, ...], int]) -> None:
        self.source = source
        self.lines = lines
        self.problems: list[GateProblem] = []

    def line(self, path: tuple[str, ...]) -> int:
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return 1

    def problem(self, path: tuple[str, ...], message: str) -> None:
        self.problems.append(GateProblem(self.source, self.line(path), ".".join(path), message))

    def number(self, raw: object, path: tuple[str, ...]) -> float | None:
        if isinstance(raw, bool) or not isinstance(raw, int | float):
            self.problem(path, f"must be a number, not {short_repr(raw)}")
            return None
        value = float(raw)
        if not math.isfinite(value) or not 0 <= value <= MAX_NUMBER:
            self.problem(path, f"must be a number from 0 to {MAX_NUMBER:g}, not {short_repr(raw)}")
            return None
        return value

    def text(self, raw: object, path: tuple[str, ...], *, required: bool) -> str:
        if raw is None and not required:
            return ""
        if not isinstance(raw, str) or (required and not raw.strip()):
            self.problem(path, f"must be a non-empty string, not {short_repr(raw)}")
            return ""
        return raw

    def mapping(self, raw: object, path: tuple[str, ...]) -> dict[Any, Any]:
        if raw is None:
            return {}
        if not isinstance(raw, dict):
            self.problem(path, f"must be a mapping, not {short_repr(raw)}")
            return {}
        return raw

    def outlier(self, raw: object, path: tuple[str, ...]) -> OutlierRule:
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
        self, raw: Mapping[Any, Any], path: tuple[str, ...], scope: str, extra: frozenset[str]
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

    def gate(self, check: Check, raw: object, path: tuple[str, ...], scope: str) -> Gate | None:
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
                    f"the warn bar {_num(warn)} must not be on the failing side of "
                    f"fail_{suffix} {_num(fail)}",
                )
        elif kind is GateKind.EQUALS:
            fail = self.number(raw["expect"], (*path, "expect"))
        if kind is None or len(self.problems) > before:
            return None
        line = self.line(path)
        return Gate(
            check, kind, scope, source, unit, fail, warn, note, compare is True, line, own_rule
        )

    def _compare(self, raw: object, path: tuple[str, ...]) -> tuple[bool, OutlierRule | None]:
        """A gate's ``outlier``: compared or not, and its own rule (None: the file's)."""
        if isinstance(raw, dict):  # this check's own outlier rule
            return True, self.outlier(raw, path)
        if not isinstance(raw, bool):
            self.problem(
                path, f"must be true, false or an outlier rule (a mapping), not {short_repr(raw)}"
            )
            return True, None
        return raw, None

    def _kind(self, check: Check, raw: Mapping[Any, Any], path: tuple[str, ...]) -> GateKind | None:
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


def _key_lines(node: yaml.Node, path: tuple[str, ...], out: dict[tuple[str, ...], int]) -> None:
    if not isinstance(node, yaml.MappingNode):
        return
    for key, value in node.value:
        if isinstance(key, yaml.ScalarNode):
            here = (*path, str(key.value))
            out[here] = int(key.start_mark.line) + 1
            _key_lines(value, here, out)


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
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 1
        raise GatesFileError([GateProblem(source, line, "", f"not valid YAML: {exc}")]) from exc
    except (ValueError, RecursionError) as exc:
        problem = GateProblem(source, 1, "", f"not valid YAML: {str(exc)[:200]}")
        raise GatesFileError([problem]) from exc
    lines: dict[tuple[str, ...], int] = {}
    if node is not None:
        _key_lines(node, (), lines)
    checker = _Checker(source, lines)
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
        text = resources.files(BUILTIN[0]).joinpath(BUILTIN[1]).read_text("utf-8")
        source = BUILTIN_SOURCE
    else:
        source = shown_path(path)
        try:
            text = path.read_text("utf-8")
        except OSError as exc:
            raise GatesFileError(
                [GateProblem(source, 0, "", f"cannot read: {exc.strerror}")]
            ) from exc
        except UnicodeDecodeError as exc:
            line, why = utf8_line(exc), f"not UTF-8 text: {exc.reason} at byte {exc.start}"
            raise GatesFileError([GateProblem(source, line, "", why)]) from exc
    book = parse_gates(text, source)
    if profile is None:
        return book
    try:
        return book.with_profile(profile)
    except KeyError as exc:
        raise GatesFileError([GateProblem(source, 1, "profiles", str(exc.args[0]))]) from exc
