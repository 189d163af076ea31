"""Gates: the bar each pre-flight check must clear, and how a measurement is judged by it.

A gate belongs to a GPU model (A100, H100, H200, B200, B300), a NIC (HDR, NDR, XDR), the file's
common ``gates``, or a named profile (``cpu``: the tests' gloo-on-CPU scale). :meth:`GateBook.judge`
finds the gate for a measurement (profile, then model, then NIC, then common) and says pass,
warn, fail or could-not-run with a one-line reason. :func:`outliers` compares the values of one
check across the fleet with a robust z-score (median and median absolute deviation), for what
no fixed bar catches; :func:`odd_ones_out` names the nodes whose version differs.

``rules.gates_file`` reads and checks the file these come from (``rules/preflight_gates.yaml``).
"""

from __future__ import annotations

import math
import re
import statistics
from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Final

from fleetwatch.preflight.vocabulary import LEVEL_OF, Check, Level, Measurement, Verdict

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

GPU_MODELS: Final = ("A100", "H100", "H200", "B200", "B300")
NICS: Final = ("HDR", "NDR", "XDR")
MAD_TO_SIGMA: Final = 1.4826  # the MAD of a normal distribution times this is its sigma
SPREAD_FLOOR: Final = 0.01  # the spread is at least 1% of the median (a fleet of equal values)

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
_LINK: Final = re.compile(r"\s*gen(\d+)\s+x(\d+)\s+\(max\s+gen(\d+)\s+x(\d+)\)\s*", re.IGNORECASE)


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
            return f">= {shown_number(self.fail)}{unit}"
        if self.kind is GateKind.AT_MOST:
            return f"<= {shown_number(self.fail)}{unit}"
        if self.kind is GateKind.EQUALS:
            return f"= {shown_number(self.fail)}{unit}"
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


def shown_number(value: float | None) -> str:
    """A bar's number as messages show it (``335``, ``0.5``); ``?`` when there is none."""
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
        warn_bar = shown_number(gate.warn)
        return Judgement(
            Verdict.WARN,
            gate,
            f"{what}: {shown}, passes {gate.bar} but not the warn bar {warn_bar} {cite}",
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
