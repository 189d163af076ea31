"""How ``fleetwatch config check`` loads a file: as the daemon does, then again part by part.

:func:`load_agent` and :func:`load_collector` load a file as the daemons do; the loaders stop
at their first problem, so a file that does not load is read again: each unknown key is named
(with the known key it is closest to, from the tables :func:`accepted_keys` reads from the
loaders' own dataclasses and key lists) and left out, each part of ``[collector]`` (``actions``
channel by channel, ``alertmanager``, ``ingest``, ``jobs``) is checked on its own, and the rest
is loaded again without the keys each problem names until it loads. So every problem is listed,
and the checks that follow (rules, TLS, secrets: :mod:`cli.config`) still run. :class:`Place`
puts each problem at the line of the key it names, as the collector's reload does
(:mod:`fleetwatch.config_lines`).
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import tomllib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeVar

from collector.exceptions import CollectorError
from fleetwatch.config_file import shown_key
from fleetwatch.config_lines import FileProblem, locate

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from pathlib import Path

    from agent.config import AgentConfig
    from collector.config import CollectorConfig

# sub-tables of [collector] checked on their own
_PARTS: Final = ("actions", "alertmanager", "ingest", "jobs")
_SUGGEST_CHARS: Final = 100  # a key longer than this gets no "did you mean"
_Config = TypeVar("_Config")


def accepted_keys(kind: str) -> dict[str, frozenset[str]]:
    """The keys each table of a ``kind`` file takes, read from the loaders' own dataclasses.

    Tables are named from the kind's own (``""``, ``actions``, ``actions.slurm``); a ``*``
    stands for any name (``actions.notify.*``: each notify channel).
    """
    fields = dataclasses.fields
    if kind == "agent":
        from agent.bmc_config import BmcConfig  # noqa: PLC0415 - each kind loads its own code
        from agent.config import AgentConfig  # noqa: PLC0415

        return {
            "": frozenset(f.name for f in fields(AgentConfig)),
            "bmc": frozenset(f.name for f in fields(BmcConfig)),
        }
    from collector.actions.alertmanager_config import ALERTMANAGER_KEYS  # noqa: PLC0415
    from collector.actions.config import (  # noqa: PLC0415
        RMA_KEYS,
        SAFETY_KEYS,
        SLURM_KEYS,
        WEBHOOK_KEYS,
        WEBHOOK_TABLES,
    )
    from collector.config import CollectorConfig  # noqa: PLC0415
    from collector.ingest.throttle import IngestLimits  # noqa: PLC0415
    from collector.jobs.config import JobsConfig  # noqa: PLC0415

    return {
        "": frozenset(f.name for f in fields(CollectorConfig)),
        "actions": frozenset({*SAFETY_KEYS, "slurm", *WEBHOOK_TABLES, "notify"}),
        "actions.slurm": frozenset(SLURM_KEYS),
        "actions.drain_webhook": frozenset(WEBHOOK_KEYS),
        "actions.reboot_webhook": frozenset(WEBHOOK_KEYS),
        "actions.rma_webhook": frozenset(RMA_KEYS),
        "actions.notify.*": frozenset(WEBHOOK_KEYS),
        "alertmanager": frozenset(ALERTMANAGER_KEYS),
        "ingest": frozenset(f.name for f in fields(IngestLimits)),
        "jobs": frozenset(f.name for f in fields(JobsConfig)),
    }


@dataclass(frozen=True, slots=True)
class Place:
    """Puts the problems of one config file at their line, as the collector's reload does.

    ``sections``: the tables whose keys a message may name (the kind's own first, then the
    sub-tables whose messages name keys without their table: ``collector.jobs: min_drop``).
    """

    file: str
    text: str
    sections: tuple[str, ...]

    @classmethod
    def of(cls, path: Path, *sections: str) -> Place:
        """The file's text read once (none when unreadable: the loader says why)."""
        try:
            text = path.read_text("utf-8")
        except (OSError, UnicodeDecodeError):
            text = ""
        return cls(str(path), text, sections)

    def at(self, message: str) -> FileProblem:
        """``message`` at the line that sets the key it names (or of a TOML syntax error)."""
        found = FileProblem(self.file, message)
        for section in self.sections:
            found = locate(self.file, self.text, section, message)
            if found.line is not None:
                break
        return found

    def outside(self, message: str) -> FileProblem:
        """A problem in a file the config names (a rule file), which gives its own place."""
        return FileProblem(self.file, message)


def _file_table(
    path: Path, kind: str, place: Place
) -> tuple[dict[str, Any] | None, list[FileProblem]]:
    """The keys of the file's ``[kind]`` table the loader knows, and a problem for each other.

    As the loader reads the file (a file without the table is read as the table), but a key
    above the first table or not known is named and left out rather than stopping the check:
    ``unknown key actions.max_drained_nodez; did you mean actions.max_drained_nodes?``. None
    when the file or its table cannot be read at all (the loader's message says why).
    """
    try:
        raw = tomllib.loads(path.read_text("utf-8"))
    except (OSError, ValueError):  # UnicodeDecodeError and TOMLDecodeError are ValueErrors
        return None, []
    table = raw.get(kind, raw)
    if not isinstance(table, dict):
        return None, []
    what = f"{kind} config"
    stray = [
        f"{what}: key {shown_key(key)} outside the [{kind}] table (above it); move it into it"
        for key, value in raw.items()
        if table is not raw and not isinstance(value, dict)
    ]
    values, unknown = _known(table, kind, accepted_keys(kind), "", "")
    return values, [place.at(message) for message in (*stray, *unknown)]


def _known(
    values: dict[str, Any], kind: str, tables: Mapping[str, frozenset[str]], name: str, table: str
) -> tuple[dict[str, Any], list[str]]:
    """``values`` without the keys ``tables[table]`` lacks, nor those its sub-tables lack.

    A message names each key left out by its dotted path (``name``: that of ``values``).
    """
    kept: dict[str, Any] = {}
    unknown: list[str] = []
    for key, value in values.items():
        dotted = f"{name}{shown_key(key)}"
        inner = f"{table}.{key}".lstrip(".")
        if key not in tables[table]:
            unknown.append(_unknown_key(kind, dotted, key, name, tables[table]))
        elif isinstance(value, dict) and inner in tables:
            kept[key], found = _known(value, kind, tables, f"{dotted}.", inner)
            unknown += found
        elif isinstance(value, dict) and f"{inner}.*" in tables:  # named channels, each a table
            kept[key] = {}
            for channel, sub in value.items():
                kept[key][channel] = sub
                if isinstance(sub, dict):
                    where = f"{dotted}.{shown_key(channel)}."
                    kept[key][channel], found = _known(sub, kind, tables, where, f"{inner}.*")
                    unknown += found
        else:
            kept[key] = value
    return kept, unknown


def _unknown_key(kind: str, dotted: str, key: str, prefix: str, known: frozenset[str]) -> str:
    """``unknown key K; did you mean M?`` (the closest known key), or the keys it may be."""
    close = difflib.get_close_matches(key, sorted(known), n=1) if len(key) < _SUGGEST_CHARS else []
    if close:
        return f"{kind} config: unknown key {dotted}; did you mean {prefix}{close[0]}?"
    table = f"[{kind}.{prefix}".rstrip(".") + "]"
    return f"{kind} config: unknown key {dotted}; {table} takes {', '.join(sorted(known))}"


def _named(message: str, key: str, kind: str) -> bool:
    """Whether ``message`` names ``key`` of ``[kind]``, as ``key`` or ``kind.key`` (a table).

    Only before any ``got VALUE``: a value is not a key.
    """
    head = message.split(" got ", 1)[0]
    return re.search(rf"(?<![\w.])(?:{kind}\.)?{re.escape(key)}(?!\w)", head) is not None


def _until_it_loads(
    values: dict[str, Any],
    load: Callable[[dict[str, Any]], _Config],
    error: type[Exception],
    place: Place,
) -> tuple[_Config | None, list[FileProblem], set[str]]:
    """Load ``values``; at each problem, set aside the keys its message names and load again.

    The loaders stop at their first problem: each round reports one and leaves out what it
    names (``tls_cert, tls_key, tls_ca go together`` names three), so the next round finds the
    next. Returns the config of the keys that passed (None when a problem names no key), the
    problems, and the keys set aside, whose checks the caller skips.
    """
    problems: list[FileProblem] = []
    aside: set[str] = set()
    while True:
        try:
            return load(values), problems, aside
        except error as exc:
            message = str(exc)
        problems.append(place.at(message))
        named = {key for key in values if _named(message, key, place.sections[0])}
        if not named:
            return None, problems, aside
        aside |= named
        values = {key: value for key, value in values.items() if key not in named}


def load_agent(path: Path, place: Place) -> tuple[AgentConfig | None, list[FileProblem], set[str]]:
    """The config as the agent loads it, or as much of it as loads, with every problem."""
    from agent.config import load_agent_config  # noqa: PLC0415 - each kind loads its own code
    from agent.exceptions import AgentError  # noqa: PLC0415

    try:
        return load_agent_config(path, {}), [], set()
    except AgentError as exc:
        first = place.at(str(exc))
    values, problems = _file_table(path, "agent", place)
    if values is None:
        return None, [first], set()

    def load(known: dict[str, Any]) -> AgentConfig:
        # The loader takes an override ``collector`` as --collector (a comma list, replacing
        # ``collectors``): the file's key goes in afterwards, checked as the file's.
        cfg = load_agent_config(None, {k: v for k, v in known.items() if k != "collector"})
        if "collector" in known:
            cfg = dataclasses.replace(cfg, collector=known["collector"])
        return cfg

    cfg, found, aside = _until_it_loads(values, load, AgentError, place)
    return cfg, (problems + found) or [first], aside


def load_collector(
    path: Path, place: Place
) -> tuple[CollectorConfig | None, list[FileProblem], set[str]]:
    """The config as the collector loads it, or as much of it as loads, with every problem.

    The loader stops at its first problem. Then the table is read again: unknown keys are
    named, each part of ``_PARTS`` is checked on its own (``actions`` channel by channel), so a
    mistake in ``[collector.jobs]`` does not hide one in ``[collector.actions]``, and the rest
    loads without the keys each problem names. The config returned has the parts and keys
    that passed (None when a problem names no key), for the checks that follow; the keys and
    parts set aside are returned with it.
    """
    from collector.actions.alertmanager_config import parse_alertmanager  # noqa: PLC0415
    from collector.config import load_collector_config, parse_ingest, parse_jobs  # noqa: PLC0415

    try:
        return load_collector_config(path, {}), [], set()
    except CollectorError as exc:
        first = place.at(str(exc))
    values, problems = _file_table(path, "collector", place)
    if values is None:
        return None, [first], set()
    parts = {key: values.pop(key) for key in _PARTS if key in values}
    checks: dict[str, Callable[[object], object]] = {
        "alertmanager": parse_alertmanager,
        "ingest": parse_ingest,
        "jobs": parse_jobs,
    }
    aside: set[str] = set()
    for key, raw in parts.items():
        found = _actions_problems(raw) if key == "actions" else _problem(checks[key], raw)
        problems += map(place.at, found)
        if found:
            aside.add(key)
        else:
            values[key] = raw
    cfg, found_here, rest = _until_it_loads(
        values, lambda known: load_collector_config(None, known), CollectorError, place
    )
    return cfg, list(dict.fromkeys(problems + found_here)) or [first], aside | rest


def _actions_problems(raw: object) -> list[str]:
    """Problems of ``[collector.actions]``: its own keys, each webhook, each channel."""
    from collector.actions.config import WEBHOOK_TABLES, parse_actions  # noqa: PLC0415

    if not isinstance(raw, dict):
        return _problem(parse_actions, raw)
    table: dict[str, Any] = dict(raw)
    hooks = {name: table.pop(name, None) for name in WEBHOOK_TABLES}
    notify = table.pop("notify", None)
    problems = _problem(parse_actions, table)
    for name, hook in hooks.items():
        if hook is not None:
            problems += _problem(parse_actions, {name: hook})
    if isinstance(notify, dict):
        for name, hook in notify.items():
            problems += _problem(parse_actions, {"notify": {name: hook}})
    elif notify is not None:
        problems += _problem(parse_actions, {"notify": notify})
    return problems


def _problem(check: Callable[[Any], object], raw: object) -> list[str]:
    """``[message]`` when ``check(raw)`` raises the collector's config error, else ``[]``."""
    try:
        check(raw)
    except CollectorError as exc:
        return [str(exc)]
    return []
