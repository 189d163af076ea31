"""Which targets a tick evaluates, with which rules, and the data maps built for them.

Every tick evaluates the targets something happened to (a sample or an event, see
:mod:`collector.incidents.changes`). A regular tick also evaluates the targets with an open
incident (their ``for``/``keep_firing_for`` timers run) and a slice of the fleet's nodes, so
that every ``full_sweep_s`` the targets whose answers can change with time alone are seen:
those whose windows hold something that will age out (an event, a counter that moved), GPUs a
training rank runs on, and, for rules that read the ``fleet`` or ``share_of_ports()``, every
target. A node that said Hello is evaluated whole once its first Report is in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain
from typing import TYPE_CHECKING, Any

from collector.incidents.cel_data import base_map, gpu_map, port_map
from collector.incidents.rule_reads import reads_fleet, rule_words
from collector.model.target_keys import gpu_key, link_key, node_key, port_key
from rules.model import Scope

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping

    from collector.incidents.changes import Changes
    from collector.jobs.book import JobBook
    from collector.model.fleet import FleetModel
    from collector.model.history import History
    from rules.engine import Engine
    from rules.model import Rule, RuleSet


@dataclass(slots=True)
class Sweep:
    """One tick's targets and the data maps built for them (each built once)."""

    fleet: dict[str, Any]
    now: float
    wanted: set[tuple[str, str]]  # (node, key) to evaluate with every rule of its scope
    swept: set[str]  # nodes whose targets are looked at for time's sake
    whole: set[str]  # nodes whose every target is evaluated with every rule
    # (node, key) with an open incident: its rules are evaluated even where windows are still
    held: set[tuple[str, str]] = field(default_factory=set)
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    # (node, key) -> the signals whose samples changed there: only the rules reading one of them
    touched: dict[tuple[str, str], set[str]] = field(default_factory=dict)


class Sweeper:
    """Picks each tick's targets and the rules to evaluate on each."""

    def __init__(  # noqa: PLR0913 - the sweep's collaborators and its pace
        self,
        *,
        rules: RuleSet,
        fleet: FleetModel,
        engine: Engine,
        changes: Changes,
        full_sweep_s: float,
        never_when_still: Callable[[Rule], bool],
    ) -> None:
        """Sweep ``fleet`` every ``full_sweep_s``, taking what changed from ``changes``.

        ``never_when_still`` tells a rule that cannot hold on a target whose windows are still
        (asked once per rule, here); ``engine`` the targets with an open incident.
        """
        self.fleet = fleet
        self.engine = engine
        self.changes = changes
        self.by_scope = {scope: rules.by_scope(scope) for scope in Scope}
        self.reads = {r.name: rule_words(r) for r in rules.rules}  # the words each rule reads
        self._full_sweep_s = full_sweep_s
        # Rules a sweep evaluates on every target: their conditions read beyond the target.
        self._sweep_all = {
            scope: tuple(r for r in self.by_scope[scope] if reads_fleet(r)) for scope in Scope
        }
        # Rules a node's Hello evaluates on a target whose windows are still: all but those of
        # windows alone that do not hold with every window at zero (they cannot hold there).
        self._hello_rules = {
            scope: tuple(r for r in self.by_scope[scope] if not never_when_still(r))
            for scope in Scope
        }
        self._reading_cache: dict[tuple[Scope, frozenset[str]], tuple[Rule, ...]] = {}
        # A node's recent remediations and episodes, for its map (None: none; the evaluator's).
        self.faults: Callable[[str], Mapping[str, Any]] | None = None
        self._last_tick: float | None = None
        self._sweep_queue: list[str] = []  # nodes still to sweep in this round
        self._sweep_credit = 0.0

    def sweep_now(self, now: float, *, urgent: bool, fleet: dict[str, Any]) -> Sweep:
        """What this tick evaluates (see :meth:`Evaluator.steps`), with ``fleet`` for its maps."""
        wanted, touched = self.changes.take(now)
        swept: set[str] = set()
        whole: set[str] = set()
        held: set[tuple[str, str]] = set()
        if not urgent:
            held = {(i.node, i.target) for i in self.engine.open_incidents()}
            wanted |= held
            first = self._last_tick is None
            swept = self._slice(now)
            whole_next = self.changes.whole_next
            whole = self._ready_whole(swept | whole_next if first else set(whole_next))
        else:
            whole = self._hellos_among({n for n, _ in wanted} | {n for n, _ in touched})
        return Sweep(
            fleet=fleet,
            now=now,
            wanted=wanted,
            swept=swept,
            whole=whole,
            touched=touched,
            held=held,
        )

    def events_now(self, now: float, *, fleet: dict[str, Any]) -> Sweep:
        """What an ``events`` tick evaluates: the targets events marked, and no others.

        They stay marked changed for the next tick too: a node's mark is also what has that
        tick evaluate the node whole when its first Report is in, and a target or two evaluated
        twice costs less than a node that waits for the regular tick.
        """
        wanted = self.changes.take_evented()
        return Sweep(fleet=fleet, now=now, wanted=wanted, swept=set(), whole=set())

    def _slice(self, now: float) -> set[str]:
        """The nodes whose every target this tick evaluates.

        The first tick takes them all; later ticks a share proportional to the time since the
        last one, in turn.
        """
        nodes = self.fleet.view()
        if self._last_tick is None:
            self._last_tick = now
            return set(nodes)
        self._sweep_credit += len(nodes) * (now - self._last_tick) / self._full_sweep_s
        self._last_tick = now
        count = int(self._sweep_credit)
        self._sweep_credit -= count
        picked: set[str] = set()
        while count > 0 and nodes:
            if not self._sweep_queue:
                self._sweep_queue = sorted(nodes, reverse=True)
            name = self._sweep_queue.pop()
            if name in nodes:
                picked.add(name)
                count -= 1
        return picked

    def _ready_whole(self, names: set[str]) -> set[str]:
        """The nodes of ``names`` to evaluate whole now, taken off the list of those to do so.

        A node is evaluated whole once its first Report since its Hello is in. Before that it has
        no readings: evaluated then, it changes nothing, and its first Report marks each of its
        targets changed for another evaluation. In a restart storm a tick comes between most
        nodes' Hello and their first Report (the loop is busy with the Reports of the others):
        that was three evaluations of a node instead of one, and twice the CPU of its return
        (bench/ingest/reconnect.py). So such a node stays on the list.

        A node that is not connected leaves the list: one the collector took back from its
        journal at a start has no readings until its agent says Hello, which puts it on the list
        again; until then the sweep evaluates its node rules (a node that never returns is
        seen). Evaluating a restored 4,096-node fleet whole at the first tick took seconds of one
        callback, with no stream read meanwhile.
        """
        nodes = self.fleet.view()
        whole_next = self.changes.whole_next
        ready: set[str] = set()
        for name in names:
            state = nodes.get(name)
            if state is None or not state.connected:
                whole_next.discard(name)
            elif state.reported:
                ready.add(name)
                whole_next.discard(name)
        return ready

    def _hellos_among(self, names: set[str]) -> set[str]:
        """The nodes of ``names`` to evaluate whole in this urgent tick (see :meth:`_ready_whole`).

        Such a node said Hello and its first Report is in. It is evaluated whole once: not
        here for the Report and again whole at the next regular tick (after a collector restart
        every node connects at once, and that was twice the evaluation).
        """
        if not self.changes.whole_next:
            return set()
        return self._ready_whole(names & self.changes.whole_next)

    def _rules_for(  # noqa: PLR0913 - one target, its tick, and whether a rank runs there
        self,
        sweep: Sweep,
        history: History,
        name: str,
        key: str,
        scope: Scope,
        *,
        ranked: bool = False,
    ) -> tuple[Rule, ...]:
        """The rules to evaluate on one target this tick (often none).

        A node that said Hello is evaluated whole, but a rule of windows alone that cannot hold
        while they are still is left out on a target whose windows are still (after a restart
        the history holds no counter steps: an NVLink's error rate is 0 whatever its counters
        say, until they step). That holds too where its first Report marked the target changed
        (each NVLink's ``nvlink_up``: 144 evaluations of the error-rate rule a node, 44 % of its
        first evaluation); an event there makes its windows move, and a target with an open
        incident keeps every rule, so that the incident can end.
        """
        if name in sweep.whole and (name, key) not in sweep.held:
            still = not history.moving(key, sweep.now)
            return self._hello_rules[scope] if still else self.by_scope[scope]
        if (name, key) in sweep.wanted:
            return self.by_scope[scope]
        signals = sweep.touched.get((name, key))
        if name not in sweep.swept:
            return self._reading(scope, signals) if signals else ()
        if scope == Scope.NODE or ranked or history.moving(key, sweep.now):
            return self.by_scope[scope]
        if not signals:
            return self._sweep_all[scope]
        swept, reading = self._sweep_all[scope], self._reading(scope, signals)
        return tuple(r for r in self.by_scope[scope] if r in swept or r in reading)

    def _reading(self, scope: Scope, signals: set[str]) -> tuple[Rule, ...]:
        """The rules of ``scope`` whose conditions name one of ``signals``."""
        key = (scope, frozenset(signals))
        rules = self._reading_cache.get(key)
        if rules is None:
            rules = self._reading_cache[key] = tuple(
                r for r in self.by_scope[scope] if not self.reads[r.name].isdisjoint(signals)
            )
        return rules

    def _nodes_with_links(self, sweep: Sweep, history: History) -> set[str]:
        """The nodes whose NVLinks can need a look this tick.

        Listed, moving, or under a rule that reads the fleet: links are nine in ten of a
        node's targets, so they are looped over only there.
        """
        links_of = {n for n, key in sweep.wanted if "/nvlink/" in key}
        links_of |= {n for n, key in sweep.touched if "/nvlink/" in key}
        if self._hello_rules[Scope.NVLINK]:
            links_of |= sweep.whole
        if self._sweep_all[Scope.NVLINK]:
            return links_of | sweep.swept | sweep.whole
        looked = sweep.swept if self._hello_rules[Scope.NVLINK] else sweep.swept | sweep.whole
        return links_of | {n for n in looked if history.moving_links(n, sweep.now)}

    def targets(
        self, sweep: Sweep, history: History, jobs: JobBook | None
    ) -> Iterator[tuple[str, str, Scope, tuple[Rule, ...], dict[str, Any]]]:
        """(node, key, scope, rules, data) of every target with rules to evaluate this tick.

        ``history`` holds the targets' windows; ``jobs`` the ranks on GPUs (None: no jobs).
        The nodes with a target marked changed (an event, a change of state) come first: a tick
        that an Xid woke also evaluates the samples of the last 0.2 s (some 1,000 targets at
        4,096 nodes), and the fault's incident was found wherever its node fell among them.
        """
        nodes = self.fleet.view()
        marked = {n for n, _ in sweep.wanted}
        rest = sweep.swept | sweep.whole | {n for n, _ in sweep.touched}
        links_of = self._nodes_with_links(sweep, history)
        for name in chain(marked, rest - marked):
            node = nodes.get(name)
            if node is None:
                continue
            links = name in links_of
            base: dict[str, Any] | None = None  # the node's and the fleet's maps, once needed
            key = node_key(name)
            if rules := self._rules_for(sweep, history, name, key, Scope.NODE):
                base = base_map(sweep.nodes, sweep.fleet, node, self.faults)
                yield name, key, Scope.NODE, rules, base
            for gpu in node.gpus.values():
                key = gpu_key(name, gpu.index)
                rank = jobs.rank_on(name, gpu.uuid) if jobs is not None else {}
                gpu_data = None
                if rules := self._rules_for(
                    sweep, history, name, key, Scope.GPU, ranked=bool(rank)
                ):
                    base = base or base_map(sweep.nodes, sweep.fleet, node, self.faults)
                    gpu_data = gpu_map(gpu)
                    yield name, key, Scope.GPU, rules, {**base, "gpu": gpu_data, "rank": rank}
                for link, values in gpu.link_signals.items() if links else ():
                    lkey = link_key(name, gpu.index, link)
                    if not (rules := self._rules_for(sweep, history, name, lkey, Scope.NVLINK)):
                        continue
                    base = base or base_map(sweep.nodes, sweep.fleet, node, self.faults)
                    gpu_data = gpu_data or gpu_map(gpu)
                    link_data = {
                        "index": link,
                        "up": gpu.nvlink_up.get(link, True),
                        "signals": values,
                    }
                    yield (
                        name,
                        lkey,
                        Scope.NVLINK,
                        rules,
                        {**base, "gpu": gpu_data, "link": link_data},
                    )
            for port in node.ports.values():
                pkey = port_key(name, port.device, port.port)
                if rules := self._rules_for(sweep, history, name, pkey, Scope.IB_PORT):
                    base = base or base_map(sweep.nodes, sweep.fleet, node, self.faults)
                    yield name, pkey, Scope.IB_PORT, rules, {**base, "port": port_map(port)}
