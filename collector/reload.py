"""The collector's reload: read and check every file, then say what may change while it runs.

On SIGHUP the collector reads its config file again (with the same command-line overrides),
the rule files it names, the Xid catalog, every webhook secret and Alertmanager's token and CA
files, and checks the TLS files and
the API token as a start would. :func:`read_candidate` does all of that and changes nothing: any
problem raises :class:`ReloadError` listing each one with its file and line. The composition
root (:meth:`collector.main.CollectorService.reload`) then swaps in what :data:`LIVE_KEYS`
lists; keys in :data:`RESTART_KEYS` keep their running values, and each one that differs is
named in a warning.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import structlog
import yaml
from prometheus_client.registry import Collector

from collector.actions.actuators import build_actuators
from collector.config import CollectorConfig, load_collector_config
from collector.exceptions import CollectorError, ConfigError
from collector.export.catalog import catalog, families
from collector.incidents.evaluator import Evaluator
from collector.ingest.tls import tls_material
from fleetwatch.config_lines import FileProblem, config_problem
from fleetwatch.reload import RESULTS, changed_keys
from rules.exceptions import CatalogError, RulesError
from rules.loader import RulesFileError, load_rules
from rules.xid_catalog import load_catalog

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping
    from pathlib import Path

    from prometheus_client import Metric

    from collector.actions.actuators import Actuators
    from collector.actions.alertmanager_http import AlertmanagerEndpoint
    from fleetwatch.clock import Clock
    from fleetwatch.reload import ReloadTally
    from rules.engine import Incident
    from rules.model import Rule, RuleSet
    from rules.xid_catalog import XidCatalog

log = structlog.get_logger("collector.reload")

# What a reload applies. Rules and the catalog are swapped whole; open incidents of rules that
# are still there (same name, same scope) carry on.
LIVE_KEYS: Final = (
    "rules",
    "rules_interval",
    "xid_catalog",
    "missed_heartbeats",
    "actions",
    "alertmanager",
    "log_level",
)
# Everything else needs a restart: sockets and the journal are open, TLS and the API token were
# read at start, agents took heartbeat_interval and poll_interval when they connected (liveness
# must keep judging them by what they were told), running jobs were sized by the jobs table. A
# key added to the config later is restart-only until it is listed above.
RESTART_KEYS: Final = tuple(
    f.name for f in dataclasses.fields(CollectorConfig) if f.name not in LIVE_KEYS
)
NAMES: Final = tuple(s.name for s in catalog() if s.group == "Configuration reloads")
_XID_NUMBER: Final = re.compile(r"\bXid (?:key )?(\d+)")


class ReloadError(CollectorError):
    """A reload found problems and changed nothing; ``problems`` lists each with its place."""

    def __init__(self, problems: list[FileProblem]) -> None:
        """Keep every problem (at least one); the message lists them one per line."""
        super().__init__("\n".join(str(p) for p in problems))
        self.problems = problems or [FileProblem("configuration", "could not be read")]


@dataclass(frozen=True, slots=True)
class ConfigSource:
    """Where the configuration comes from: the file (None: none) and the command line's values."""

    path: Path | None = None
    overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def load(self) -> CollectorConfig:
        """Read the file and apply the overrides, as at start."""
        return load_collector_config(self.path, dict(self.overrides))


@dataclass(frozen=True, slots=True)
class Candidate:
    """A checked configuration, ready to swap in; nothing of it is in use yet.

    ``cfg`` has the file's live keys and the running restart-only ones; ``needs_restart`` maps
    each restart-only key whose value in the file differs to (running, in the file).
    """

    cfg: CollectorConfig
    rules: RuleSet
    catalog: XidCatalog
    actuators: Actuators
    needs_restart: dict[str, tuple[object, object]]
    alertmanagers: tuple[AlertmanagerEndpoint, ...] = ()


def read_candidate(
    source: ConfigSource, running: CollectorConfig, environ: Mapping[str, str], clock: Clock
) -> Candidate:
    """Read and check everything a reload would use, changing nothing.

    Raises:
        ReloadError: every problem found, each naming its file and, where known, its line.
    """
    try:
        new = source.load()
    except ConfigError as exc:
        raise ReloadError([config_problem(source.path, "collector", str(exc))]) from exc
    problems: list[FileProblem] = []
    rules = catalog = actuators = None
    try:
        rules = load_rules(list(new.rules))
    except RulesFileError as exc:
        problems.extend(
            _rule_problem(p.source, p.rule, p.message, p.line, p.column) for p in exc.problems
        )
    except RulesError as exc:
        problems.append(FileProblem("rules", str(exc)))
    try:
        catalog = load_catalog(new.xid_catalog)
    except CatalogError as exc:
        problems.append(catalog_problem(new.xid_catalog, exc))
    try:
        actuators = build_actuators(new.actions, clock, environ)
    except ConfigError as exc:
        problems.append(config_problem(source.path, "collector", str(exc)))
    alertmanagers: tuple[AlertmanagerEndpoint, ...] = ()
    try:
        alertmanagers = new.alertmanager.endpoints(environ)
    except ConfigError as exc:
        problems.append(config_problem(source.path, "collector", str(exc)))
    problems.extend(_restart_problems(source.path, new, environ))
    if problems or rules is None or catalog is None or actuators is None:
        raise ReloadError(problems)
    differ = changed_keys(running, new, RESTART_KEYS)
    kept = {key: getattr(running, key) for key in RESTART_KEYS}
    return Candidate(
        cfg=dataclasses.replace(new, **kept),
        rules=rules,
        catalog=catalog,
        actuators=actuators,
        needs_restart={key: (getattr(running, key), getattr(new, key)) for key in differ},
        alertmanagers=alertmanagers,
    )


def _restart_problems(
    path: Path | None, new: CollectorConfig, environ: Mapping[str, str]
) -> list[FileProblem]:
    """Problems with the TLS files and the API token the file names.

    A reload does not use them (they need a restart), but a reload that works should mean the
    collector would also start with these files: a broken one fails the reload too.
    """
    problems: list[FileProblem] = []
    for check in (lambda: tls_material(new.server_tls()), lambda: new.api_token(environ)):
        try:
            check()
        except ConfigError as exc:
            problems.append(config_problem(path, "collector", str(exc)))
    return problems


def _rule_problem(source: str, rule: str, message: str, line: int, column: int) -> FileProblem:
    text = f"rule {rule}: {message}" if rule else message
    return FileProblem(source, text, line or None, column or None)


def catalog_problem(path: Path | None, exc: CatalogError) -> FileProblem:
    """An Xid catalog error, at the line of a YAML syntax error or of the Xid it names."""
    where = "builtin/xid_catalog.yaml" if path is None else str(path)
    message = str(exc)
    cause = exc.__cause__
    mark = getattr(cause, "problem_mark", None) if isinstance(cause, yaml.YAMLError) else None
    if mark is not None:
        return FileProblem(where, message, mark.line + 1, mark.column + 1)
    xid = _XID_NUMBER.search(message)
    if path is None or xid is None:
        return FileProblem(where, message)
    try:
        text = path.read_text("utf-8")
    except (OSError, UnicodeDecodeError):
        return FileProblem(where, message)
    entry = re.compile(rf"^\s*['\"]?{xid[1]}['\"]?\s*:")
    line = next((n for n, t in enumerate(text.splitlines(), start=1) if entry.match(t)), None)
    return FileProblem(where, message, line)


def rule_changes(old: RuleSet, new: RuleSet) -> tuple[list[str], list[str], list[str]]:
    """Names of the rules added, removed and changed (a rule that only moved is unchanged)."""
    before = {r.name: _content(r) for r in old.rules}
    after = {r.name: _content(r) for r in new.rules}
    added = sorted(after.keys() - before.keys())
    removed = sorted(before.keys() - after.keys())
    changed = sorted(n for n in after.keys() & before.keys() if after[n] != before[n])
    return added, removed, changed


def _content(rule: Rule) -> Rule:
    return dataclasses.replace(rule, source="", line=0)


def successor(
    old: Evaluator, rules: RuleSet, catalog: XidCatalog
) -> tuple[Evaluator, list[Incident]]:
    """An evaluator of ``rules`` that carries on from ``old``; and the incidents it dropped.

    It shares ``old``'s history (events and samples the windows read, now kept for the new
    rules' windows too), its counters and its collaborators. Open incidents go on when their
    rule is still there with the same scope (a target key of another scope would never be
    evaluated again); the others end with their rule, as after a restart. Call it only when
    the swap will happen: it moves the history's windows and the jobs' hooks to the successor.
    """
    new = Evaluator(
        rules=rules,
        fleet=old.fleet,
        catalog=catalog,
        clock=old.clock,
        env=old.env,
        fleet_extras=old.fleet_extras,
        node_faults=old.node_faults,
    )
    dropped: list[Incident] = []
    for incident in old.engine.open_incidents():
        rule, was = rules.get(incident.rule), old.engine.rules[incident.rule]
        if rule is not None and rule.scope == was.scope:
            new.engine.restore(incident)
        else:
            dropped.append(incident)
    old.history.sample_windows = dict(new.history.sample_windows)
    new.history = old.history
    new.evaluations = old.evaluations
    new.errors = {name: n for name, n in old.errors.items() if name in new.engine.rules}
    new.failures = old.failures
    new.silencer, new.on_event = old.silencer, old.on_event
    if old.jobs is not None:
        new.attach_jobs(old.jobs)
    return new, dropped


class SwappableCollector(Collector):
    """Passes a scrape on to :attr:`inner`, which a reload replaces in one assignment."""

    def __init__(self, inner: Collector) -> None:
        """Start with ``inner``."""
        self.inner = inner

    def describe(self) -> list[Metric]:
        """Skip the registration-time collect (families are dynamic)."""
        return []

    def collect(self) -> Iterator[Metric]:
        """What the current inner collector yields."""
        return iter(self.inner.collect())


class ReloadCollector(Collector):
    """``fleetwatch_config_*``: whether the last reload worked, when one last did, how many."""

    def __init__(self, tally: ReloadTally) -> None:
        """Read ``tally`` at every scrape."""
        self._tally = tally

    def describe(self) -> list[Metric]:
        """Skip the registration-time collect."""
        return []

    def collect(self) -> Iterator[Metric]:
        """Render the three families."""
        tally = self._tally
        f = families(NAMES)
        f["fleetwatch_config_last_reload_successful"].add_metric([], float(tally.successful))
        f["fleetwatch_config_last_reload_success_timestamp_seconds"].add_metric(
            [], tally.last_success_unix
        )
        for result in RESULTS:
            f["fleetwatch_config_reloads_total"].add_metric([result], tally.counts[result])
        yield from f.values()
