"""Grouped samples (``Report.targets``): each target written once, its values in columns.

A node's first Report names each of its ~170 targets about nine times (a GPU's UUID in every
one of its NVLinks' counters); grouped, a target is written once and its signals sit beside
their values in one list per type. The message is half the size and the collector reads a
target's fields once, not once per sample. An agent groups its samples only after a Welcome
that says ``grouped_reports``: a collector older than the field would not read them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fleetwatch.model import (
    SampleKey,
    SampleValue,
    Target,
    sample_to_pb,
    sample_value_from_pb,
    target_key_of,
    wire_value,
)
from fleetwatch.wire.v1 import fleetwatch_pb2 as pb

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from fleetwatch.model import TargetKey


def group_samples(samples: Iterable[tuple[SampleKey, SampleValue]]) -> list[pb.TargetSamples]:
    """The samples ``((target, signal), value)`` as one group per target, in first-seen order."""
    columns: dict[Target, tuple[list[str], list[int], list[str], list[float], list[str], list[str]]]
    columns = {}
    for (target, signal), value in samples:
        group = columns.get(target)
        if group is None:
            group = columns[target] = ([], [], [], [], [], [])
        sent = wire_value(value)
        if isinstance(sent, str):
            group[4].append(signal)
            group[5].append(sent)
        elif isinstance(sent, int):
            group[0].append(signal)
            group[1].append(sent)
        else:
            group[2].append(signal)
            group[3].append(sent)
    return [
        pb.TargetSamples(
            target=target.to_pb(),
            int_signals=c[0],
            int_values=c[1],
            real_signals=c[2],
            real_values=c[3],
            text_signals=c[4],
            text_values=c[5],
        )
        for target, c in columns.items()
    ]


def report_of(
    time_ms: int, samples: Iterable[tuple[SampleKey, SampleValue]], *, grouped: bool
) -> pb.Report:
    """A Report of ``samples``: grouped by target, or one ``Sample`` each."""
    if grouped:
        return pb.Report(time_unix_ms=time_ms, targets=group_samples(samples))
    return pb.Report(
        time_unix_ms=time_ms,
        samples=[sample_to_pb(key[0], key[1], value) for key, value in samples],
    )


def sample_count(report: pb.Report) -> int:
    """How many samples a Report carries, in both of its forms."""
    count = len(report.samples)
    for group in report.targets:
        count += len(group.int_signals) + len(group.real_signals) + len(group.text_signals)
    return count


def keyed_sample(sample: pb.Sample) -> tuple[TargetKey, str, SampleValue]:
    """One (trusted) wire sample as ``(target key, signal, value)``."""
    return target_key_of(sample.target), sample.signal, sample_value_from_pb(sample)


def keyed_samples(report: pb.Report) -> Iterator[tuple[TargetKey, str, SampleValue]]:
    """Every ``(target key, signal, value)`` of a Report that is trusted (already screened).

    Columns of unequal lengths are cut to the shorter: the collector's screen refuses them.
    """
    for sample in report.samples:
        yield keyed_sample(sample)
    for group in report.targets:
        key = target_key_of(group.target)
        for signal, number in zip(group.int_signals, group.int_values, strict=False):
            yield key, signal, number
        for signal, real in zip(group.real_signals, group.real_values, strict=False):
            yield key, signal, real
        for signal, text in zip(group.text_signals, group.text_values, strict=False):
            yield key, signal, text
