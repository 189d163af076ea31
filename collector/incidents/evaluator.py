"""Rules applied to the fleet: which targets to evaluate, with what data, and what came of it.

On every tick the evaluator looks at the targets something happened to (a sample or an event),
the targets with an open incident (their ``for``/``keep_firing_for`` timers run), and, every
``full_sweep_s``, the targets whose answers can change with time alone: those whose windows hold
something that will age out (an event, a counter that moved), GPUs a training rank runs on, and,
for rules that read the ``fleet`` or ``share_of_ports()``, every target. Conditions run in CEL;
the engine turns their results into incident transitions, returned with the verdict on whether
their actions may run.

Grouping: a firing critical node-level incident suppresses the GPU, NVLink and IB-port incidents
of that node that fire after it (they are journaled as suppressed and run no actions).
"""

from __future__ import annotations

import re
from collections import Counter, deque
from dataclasses import dataclass, field
from itertools import chain
from typing import TYPE_CHECKING, Any, Final

import structlog

from collector.incidents.condition_memo import ConditionMemo
from collector.model.history import History, PastEvent
from collector.model.slots import SLOT_ALSO, SLOT_KEY, TargetSlot, rules_key
from collector.model.target_keys import FLEET_KEY, gpu_key, job_key, link_key, node_key, port_key
from fleetwatch.model import EventKind, SampleValue, Target
from rules.cel_env import RuleEnvironment, TargetContext
from rules.engine import Engine, Incident, Phase, Transition
from rules.model import Rule, RuleSet, Scope, Severity

if TYPE_CHECKING:
    from collections.abc import Callable, Generator, Hashable, Iterator

    from cel_expr_python import cel

    from collector.jobs.book import JobBook
    from collector.model.fleet import FleetModel
    from collector.model.state import GpuState, NodeState, PortState
    from fleetwatch.clock import Clock
    from rules.xid_catalog import XidCatalog

log = structlog.get_logger("collector.incidents.evaluator")

ERROR_LOG_EVERY: Final = 1000  # a rule that fails on every target logs once, then now and then
NO_DRAINS: Final = {
    "drained_nodes": 0,
    "drains_waiting": 0,
    "drain_cap": 0,
    "drain_breaker_open": False,
}
EVENT_WINDOW_S: Final = 24 * 3600.0
# A signal whose every reading rule holds for a while (``for`` at least PACED_MIN_FOR_S) is
# paced: its samples send their target through those rules at most every PACE_S (the first
# sample of a pause at the next tick, the ones after it within PACE_S). A busy GPU's temperature
# changes at every poll; evaluating its two heat rules at each was most of a 4,096-node
# collector's rule CPU, and a rule that must hold 2 minutes decides the same a few seconds on.
PACE_S: Final = 5.0
PACED_MIN_FOR_S: Final = 60.0
# Events that interrupt a training job whatever the Xid catalog says, by failure category.
FAILURE_KINDS: Final = {
    EventKind.GPU_LOST: "gpu_lost",
    EventKind.PCI_REMOVED: "pcie",
    EventKind.NODE_UNREACHABLE: "node",
}


# Xids whose xids() entries are kept made: more than any catalog lists (a node may send any).
MAX_XID_ENTRIES: Final = 4096


@dataclass(slots=True)
class Verdict:
    """Why an incident's actions will not run (None: they will)."""

    suppressed_by: str | None = None
    silenced_by: str | None = None


@dataclass(frozen=True, slots=True)
class Outcome:
    """A transition, the rule it belongs to, and whether its actions may run."""

    transition: Transition
    rule: Rule
    verdict: Verdict


@dataclass(slots=True)
class _Context:
    """The window functions' view of one target."""

    evaluator: Evaluator
    key: str
    now: float

    def events(self, kind: str, window_s: float) -> int:
        return self.evaluator.history.events(self.key, kind, self.now - window_s)

    def xids(self, window_s: float) -> list[dict[str, Any]]:
        entries = self.evaluator.xid_entries
        return [entries(xid) for xid in self.evaluator.history.xids(self.key, self.now - window_s)]

    def xids_key(self, window_s: float) -> Hashable:
        """What a remembered answer over ``xids(window_s)`` is keyed by.

        This target's window as it stands (the same two numbers of another target say nothing
        of its Xids), and the catalog that names them.
        """
        version = self.evaluator.history.xids_version(self.key, self.now - window_s)
        return id(self.evaluator.catalog), self.key, *version

    def increase(self, signal: str, window_s: float) -> float:
        return self.evaluator.history.increase(self.key, signal, self.now - window_s, self.now)

    def share_of_ports(self, signal: str, above: float) -> float:
        # Counted in the regular tick's fleet tally; a threshold asked for the first time is
        # counted now, and in the tally from the next tick on.
        share = self.evaluator.shares.get((signal, above))
        if share is None:
            share = self.evaluator.share_now(signal, above)
        return share


def _ports_over(nodes: list[NodeState], signal: str, above: float) -> int:
    """How many of the nodes' IB ports have ``signal`` over ``above``.

    A plain loop: every port of the fleet, every regular tick (a method call per port made it a
    third of a 2,048-node collector's rules time).
    """
    hot = 0
    for node in nodes:
        for port in node.ports.values():
            value = port.signals.get(signal)
            if value is not None and not isinstance(value, str) and value > above:
                hot += 1
    return hot


class _StillContext:
    """The window functions of a target whose windows hold nothing that moves: all zero.

    A target the history does not call :meth:`~collector.model.history.History.moving` has every
    event older than the event window and every counter step older than its signal's window.
    """

    def events(self, kind: str, window_s: float) -> int:
        del kind, window_s
        return 0

    def xids(self, window_s: float) -> list[dict[str, Any]]:
        del window_s
        return []

    def increase(self, signal: str, window_s: float) -> float:
        del signal, window_s
        return 0.0

    def share_of_ports(self, signal: str, above: float) -> float:
        del signal, above
        return 0.0


# A window function call with literal arguments: what a condition of windows alone is made of.
_WINDOW_CALL: Final = re.compile(
    r"""\b(?:rate|increase|events|xids)\(\s*["'][^"']*["']\s*(?:,\s*["'][^"']*["']\s*)?\)"""
)
# What may remain of such a condition once its window calls are taken out: numbers, operators.
_ONLY_ARITHMETIC: Final = re.compile(r"[\s\d.eE<>=!&|()+\-*/%]*")


def reads_windows_only(rule: Rule) -> bool:
    """Whether the rule's condition reads nothing but window functions of its target.

    Such a condition answers the same on every target whose windows are still (no event and no
    counter step inside them): ``rate("nvlink_crc_errors", "5m") > 100.0`` is one.
    """
    rest = _WINDOW_CALL.sub(" 0 ", rule.when)
    return rest != rule.when and _ONLY_ARITHMETIC.fullmatch(rest) is not None


@dataclass(slots=True)
class _Sweep:
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


# A condition that reads these sees more than its own target: the sweep evaluates it everywhere.
_READS_FLEET: Final = re.compile(r"\b(fleet|share_of_ports)\b")
# Nodes between two parts of a regular tick's fleet tally (the loop may take a turn between).
TALLY_CHUNK: Final = 256


def rule_texts(rule: Rule) -> tuple[str, str]:
    """What a rule's answer is computed from: its condition and its occurrence count ("")."""
    counted = rule.escalation.occurrences if rule.escalation is not None else ""
    return rule.when, counted or ""


def _sample_windows(rules: RuleSet) -> dict[str, float]:
    """The longest window each counter signal is asked over, by any rule."""
    import re  # noqa: PLC0415

    from rules.durations import parse_duration  # noqa: PLC0415

    windows: dict[str, float] = {}
    pattern = re.compile(r"""(?:increase|rate)\(\s*["']([^"']+)["']\s*,\s*["']([^"']+)["']""")
    for rule in rules.rules:
        for signal, window in pattern.findall(" ".join(rule_texts(rule))):
            windows[signal] = max(windows.get(signal, 0.0), parse_duration(window))
    return windows


# Samples that change what the rules see under another name (gpu.present, nvlinks_down, a port's
# state and up): they mark their target whatever the conditions say.
MODEL_SIGNALS: Final = frozenset({"gpu_present", "nvlink_up", "ib_state", "ib_phys_state"})
# A condition that walks a signals map (size(), a macro over it) reads every signal in it.
_WALKS_SIGNALS: Final = re.compile(
    r"signals\s*(\)|,|\.\s*(all|exists|exists_one|filter|map)\s*\()|in\s+[\w.]*signals\b"
)
_WORD: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_INDEXES_SIGNALS: Final = re.compile(r"signals\s*\[")


def rule_words(rule: Rule) -> frozenset[str]:
    """Every word of a rule's condition and of its occurrence count: the signals it can read."""
    return frozenset(word for text in rule_texts(rule) for word in _WORD.findall(text))


def paced_signals(rules: RuleSet, watched: frozenset[str] | None) -> frozenset[str]:
    """The watched signals every rule reading them holds ``PACED_MIN_FOR_S`` or longer."""
    if watched is None:
        return frozenset()
    readers: dict[str, list[Rule]] = {}
    for rule in rules.rules:
        for word in rule_words(rule) & watched:
            readers.setdefault(word, []).append(rule)
    return frozenset(
        signal
        for signal, rules_of in readers.items()
        if signal not in MODEL_SIGNALS and all(r.for_s >= PACED_MIN_FOR_S for r in rules_of)
    )


def reads_named_signals(rule: Rule) -> bool:
    """Whether the rule reads signals only by name (``x.signals.name``).

    Never the whole map, and never by a computed key: then a signals map can be cut to the names
    the rule says.
    """
    return not any(
        _WALKS_SIGNALS.search(text) or _INDEXES_SIGNALS.search(text) for text in rule_texts(rule)
    )


def cel_view(data: dict[str, Any], words: frozenset[str], *, cut_signals: bool) -> dict[str, Any]:
    """The part of ``data`` a condition with ``words`` can read.

    CEL converts every value it is handed, read or not: a GPU rule got the node's, the GPU's
    and the fleet's maps (about eighty signals) for the two or three it reads, and the
    conversion was half of its evaluation. Variables the condition does not name are left out,
    and, when ``cut_signals``, each ``signals`` map keeps only the names the condition says.
    """
    out: dict[str, Any] = {}
    for name, value in data.items():
        if name not in words:
            continue
        if cut_signals and isinstance(value, dict) and "signals" in value:
            signals = value["signals"]
            out[name] = {**value, "signals": {k: signals[k] for k in words if k in signals}}
        else:
            out[name] = value
    return out


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


class Evaluator:
    """Runs a rule set over the fleet model and feeds the incident engine."""

    def __init__(  # noqa: PLR0913 - the collector's collaborators
        self,
        *,
        rules: RuleSet,
        fleet: FleetModel,
        catalog: XidCatalog,
        clock: Clock,
        full_sweep_s: float = 30.0,
        env: RuleEnvironment | None = None,
        jobs: JobBook | None = None,
    ) -> None:
        """Compile every rule once; ``jobs`` gives job and rank variables (none: no jobs)."""
        self.rules = rules
        self.fleet = fleet
        self.catalog = catalog
        self._entries_of: XidCatalog | None = None  # the catalog _entries were made from
        self._entries: dict[int, dict[str, Any]] = {}
        self.clock = clock
        self.env = env or RuleEnvironment()
        self.engine = Engine(rules)
        self.history = History(EVENT_WINDOW_S, _sample_windows(rules))
        self._compiled: dict[str, cel.Expression] = {
            r.name: self.env.compile(r.scope, r.when) for r in rules.rules
        }
        # Escalations that count occurrences: the number each grows with.
        self._occurrences: dict[str, cel.Expression] = {
            r.name: self.env.compile(r.scope, r.escalation.occurrences)
            for r in rules.rules
            if r.escalation is not None and r.escalation.occurrences
        }
        self._by_scope = {scope: rules.by_scope(scope) for scope in Scope}
        self._watched = watched_signals(rules)
        self._paced = paced_signals(rules, self._watched)
        # (node, key) -> (when its paced signals were last let through, signals held since)
        self._paced_at: dict[tuple[str, str], tuple[float, set[str]]] = {}
        self._pace_queue: deque[tuple[float, tuple[str, str]]] = deque()
        self._full_sweep_s = full_sweep_s
        # Rules a sweep evaluates on every target: their conditions read beyond the target.
        self._sweep_all = {
            scope: tuple(r for r in self._by_scope[scope] if _READS_FLEET.search(r.when))
            for scope in Scope
        }
        # Rules a node's Hello evaluates on a target whose windows are still: all but those of
        # windows alone that do not hold with every window at zero (they cannot hold there).
        self._hello_rules = {
            scope: tuple(r for r in self._by_scope[scope] if not self._never_when_still(r))
            for scope in Scope
        }
        self._fleet_nodes: dict[str, Any] | None = None  # the fleet counts of the last tick
        # share_of_ports() of the last regular tick, by (signal, above); and the pairs asked for
        self.shares: dict[tuple[str, float], float] = {}
        self._share_args: set[tuple[str, float]] = set()
        self._whole_next: set[str] = set()  # nodes whose inventory changed
        self._last_tick: float | None = None
        self._sweep_queue: list[str] = []  # nodes still to sweep in this round
        self._sweep_credit = 0.0
        self._dirty: set[tuple[str, str]] = set()  # (node, target key)
        self._evented: set[tuple[str, str]] = set()  # of those, the targets an event marked
        self._touched: dict[tuple[str, str], set[str]] = {}  # (node, key) -> signals sampled
        self._reads = {r.name: rule_words(r) for r in rules.rules}
        self._cut_signals = {r.name: reads_named_signals(r) for r in rules.rules}
        # Answers of the conditions that read nothing but the values they name.
        self.memo = ConditionMemo({r.name: r.when for r in rules.rules})
        self._reading_cache: dict[tuple[Scope, frozenset[str]], tuple[Rule, ...]] = {}
        self.evaluations = 0
        self.errors: dict[str, int] = {}
        self.failures: Counter[tuple[str, str]] = Counter()  # (node, category)
        self.silencer: Callable[[Incident, Rule], str | None] = lambda _i, _r: None
        # Called when an event arrives, so the incident service evaluates at once.
        self.on_event: Callable[[], None] = lambda: None
        # More ``fleet`` variables from elsewhere: the dispatcher's drain counts.
        self.fleet_extras: Callable[[], dict[str, Any]] = lambda: dict(NO_DRAINS)
        self.jobs: JobBook | None = None
        if jobs is not None:
            self.attach_jobs(jobs)

    def _never_when_still(self, rule: Rule) -> bool:
        """Whether ``rule`` reads windows alone and does not hold while they are all zero."""
        if not reads_windows_only(rule):
            return False
        holds, error = self.env.evaluate(self._compiled[rule.name], {}, _StillContext())
        return error is None and not holds

    def attach_jobs(self, jobs: JobBook) -> None:
        """Take job and rank variables from ``jobs``, and lend it the windows' history."""
        self.jobs = jobs
        jobs.history = self.history
        jobs.on_change = self.note_job

    # ---- what happened --------------------------------------------------------------------

    def target_key(self, node: NodeState, target: Target) -> str:
        """The key a wire target has in this node."""
        return rules_key(node, target)

    def note_event(self, node: str, kind: EventKind, target: Target, xid: int) -> None:
        """An event was journaled: remember it for windows and mark its targets for a look."""
        self._evented |= self._remember(node, kind, target, xid, self.clock.monotonic())
        category = self.failure_category(kind, xid)
        if category is not None:
            self.failures[node, category] += 1
            if self.jobs is not None:
                self.jobs.note_failure(node)
        self.on_event()

    def restore_event(
        self, node: str, kind: EventKind, target: Target, xid: int, age_s: float
    ) -> None:
        """An event journaled ``age_s`` ago by an earlier process: back into the windows.

        Only the windows: it was counted (failures) and woke the rules when it came in.
        """
        self._remember(node, kind, target, xid, self.clock.monotonic() - max(age_s, 0.0))

    def _remember(
        self, node: str, kind: EventKind, target: Target, xid: int, at: float
    ) -> set[tuple[str, str]]:
        """Put the event in its targets' windows and mark them changed; return them."""
        state = self.fleet.view().get(node)
        key = self.target_key(state, target) if state is not None else node_key(node)
        past = PastEvent(at, kind.value, xid)
        keys = {key, node_key(node)}
        if "/nvlink/" in key:
            keys.add(key.rsplit("/nvlink/", 1)[0])
        marked = {(node, k) for k in keys}
        for k in keys:
            self.history.add_event(k, past)
        self._dirty |= marked
        return marked

    def failure_category(self, kind: EventKind, xid: int) -> str | None:
        """The category of an event that interrupts a training job, or None for others.

        Such events count in checkpoint advice and in ``fleetwatch_node_failures_total``:
        ``gpu_lost``, ``pcie`` (the PCI device went away), ``node`` (unreachable), and fatal
        Xids under their catalog class.
        """
        if kind in FAILURE_KINDS:
            return FAILURE_KINDS[kind]
        entry = self.catalog.get(xid) if kind == EventKind.XID else None
        return entry.xid_class if entry is not None and entry.fatal else None

    def wants(self, signal: str) -> bool:
        """Whether a sample of ``signal`` matters: a rule windows over it, or reads it.

        A busy GPU changes temperature, power and utilisation every poll; evaluating its rules
        for values none of them reads cost three quarters of a loaded collector's CPU
        (bench/collector_ingest.py). Targets are still swept every ``full_sweep_s``.
        """
        return self.history.wants(signal) or self._watched is None or signal in self._watched

    def note_samples(self, node: str, noted: list[tuple[TargetSlot, str, SampleValue]]) -> None:
        """Samples it :meth:`wants` were applied: keep windowed values, mark targets read.

        A node to be evaluated whole (it said Hello: this is its first Report) needs no target
        marked: the mark of the node is enough for an urgent tick to take it up. Marking and
        pacing each of a first Report's 1,500 samples was a third of what it cost.
        """
        now = self.clock.monotonic()
        history, watched, dirty, touched = self.history, self._watched, self._dirty, self._touched
        if node in self._whole_next:
            for slot, signal, value in noted:
                if history.wants(signal) and isinstance(value, int | float):
                    history.add_sample(slot[SLOT_KEY], signal, now, float(value))
            dirty.add((node, node_key(node)))
            return
        paced = self._paced
        for slot, signal, value in noted:
            key = slot[SLOT_KEY]
            if history.wants(signal) and isinstance(value, int | float):
                history.add_sample(key, signal, now, float(value))
            if watched is None or signal in MODEL_SIGNALS:
                dirty.add((node, key))
            elif signal in paced:
                self._pace(node, key, signal, now)
                continue
            elif signal in watched:
                # Only the rules that read it: a busy GPU's temperature changes every poll, and
                # sending its target through every GPU rule for it was most of a fleet's ticks.
                touched.setdefault((node, key), set()).add(signal)
            else:
                continue
            also = slot[SLOT_ALSO]
            if also is not None:  # the GPU's view (nvlinks_down) changed too
                dirty.add((node, also))

    def _pace(self, node: str, key: str, signal: str, now: float) -> None:
        """Hold a paced signal's sample until its target's pace lets it through."""
        target = (node, key)
        held = self._paced_at.get(target)
        if held is None or now - held[0] >= PACE_S:
            # Through at the next tick, and the pause starts now.
            self._touched.setdefault(target, set()).add(signal)
            self._paced_at[target] = (now, set())
            self._pace_queue.append((now, target))
        elif held[0] == now and not held[1]:
            # The same report's other signals of the target go with the first (an NVLink's
            # three counters come together: not one now and two more at the pause's end).
            self._touched.setdefault(target, set()).add(signal)
        else:
            held[1].add(signal)

    def has_changes(self) -> bool:
        """Whether an urgent tick now would evaluate anything.

        That is a target marked or sampled, or a paced pause that may be over.
        """
        if self._dirty or self._touched:
            return True
        queue = self._pace_queue
        return bool(queue) and self.clock.monotonic() - queue[0][0] >= PACE_S

    def _release_paced(self, now: float) -> None:
        """Let through the held samples whose target's pause is over.

        Pauses end in the order they began (they all last ``PACE_S``): the queue is read from
        its front while they are over; an entry for a pause since begun again is skipped.
        """
        queue, paused = self._pace_queue, self._paced_at
        while queue and now - queue[0][0] >= PACE_S:
            since, target = queue.popleft()
            held = paused.get(target)
            if held is None or held[0] != since:
                continue
            if held[1]:
                self._touched.setdefault(target, set()).update(held[1])
                paused[target] = (now, set())
                queue.append((now, target))
            else:
                del paused[target]  # a quiet target: its next sample goes through at once

    def note_job(self, job_id: str, gpus: list[tuple[str, str]]) -> None:
        """A job finished steps; ``gpus`` (node, uuid) host ranks that began or ended straggling."""
        self._dirty.add((job_key(job_id), job_key(job_id)))
        nodes = self.fleet.view()
        for name, uuid in gpus:
            gpu = nodes[name].gpus.get(uuid) if name in nodes else None
            if gpu is not None:
                self._dirty.add((name, gpu_key(name, gpu.index)))

    def note_node(self, node: str) -> None:
        """Something about the node as a whole changed (reachability)."""
        self._dirty.add((node, node_key(node)))

    def note_inventory(self, node: str) -> None:
        """The node said Hello (or came back from the journal): evaluate all of it once."""
        self._whole_next.add(node)

    # ---- evaluation -----------------------------------------------------------------------

    def xid_entries(self, xid: int) -> dict[str, Any]:
        """What ``xids()`` lists for one ``xid``: its catalog entry, made once per catalog."""
        if self._entries_of is not self.catalog:
            self._entries_of, self._entries = self.catalog, {}
        found = self._entries.get(xid)
        if found is not None:
            return found
        entry = self.catalog.get(xid)
        made = {
            "xid": xid,
            "class": entry.xid_class if entry else "unknown",
            "action": entry.action if entry else "UNKNOWN",
            "fatal": entry.fatal if entry else False,
        }
        if len(self._entries) < MAX_XID_ENTRIES:
            self._entries[xid] = made
        return made

    def tick(self, *, urgent: bool = False) -> list[Outcome]:
        """Evaluate what needs it; return the transitions with their verdicts (:meth:`steps`)."""
        return [outcome for part in self.steps(urgent=urgent) for outcome in part]

    def steps(self, *, urgent: bool = False, events: bool = False) -> Generator[list[Outcome]]:
        """One tick in parts: the transitions of each node's targets, then of jobs and the fleet.

        The caller may give the event loop a turn between parts (the incident service does,
        every few milliseconds), so that a tick evaluating thousands of nodes does not stop
        every stream for as long; data that changes meanwhile is seen by this tick or the next.

        Every tick evaluates the targets whose data changed, and the paced samples whose pause
        is over. A regular tick also evaluates the open incidents' targets (for ``for`` and
        ``keep_firing_for``), the nodes that said Hello and sent their first Report since, the
        job and fleet rules, and a slice of the fleet's nodes, so every node is swept within
        ``full_sweep_s`` without one tick doing the whole fleet and stalling the loop. A sweep
        evaluates what can change with time alone (see the module's docstring); the first tick
        evaluates everything. An ``urgent`` tick (an event arrived, or the incident service's
        small tick between regular ones) evaluates only the changed targets (all of a node among
        them that said Hello and sent its first Report since), to act fast, with the fleet
        counts of the last regular tick.

        An ``events`` tick evaluates only the targets that events marked since the last tick
        (an urgent one too): it is what an event that arrives during another tick gets, at that
        tick's next turn. The rest of what changed waits for the next tick; evaluated there
        too, a 4,096-node restart's first Reports made it last seconds, and an Xid that arrived
        meanwhile waited for all of it (bench/collector_ingest.py).
        """
        urgent = urgent or events
        if events:
            if self._fleet_nodes is None:  # during the first tick's tally: count the fleet
                self._fleet_nodes, self.shares = yield from self._tally_fleet()
            # Not an urgent tick's sweep when there were no counts yet: that evaluated every
            # node back since as well, and an Xid in a restart's first tick waited for all.
            sweep = self._events_now()
        else:
            if not urgent or self._fleet_nodes is None:
                self._fleet_nodes, self.shares = yield from self._tally_fleet()
            sweep = self._sweep_now(self.clock.monotonic(), urgent=urgent)
        now = sweep.now
        outcomes: list[Outcome] = []
        nodes = self.fleet.view()
        last = ""
        for node, key, _scope, rules, data in self._targets(sweep):
            if node != last:  # a part per node: its targets come together
                yield outcomes
                outcomes, last = [], node
            state = nodes.get(node)
            waiting = state is None or not state.reported
            for rule in rules:
                outcomes += self._evaluate(rule, node, key, data, now, waiting=waiting)
        if not urgent:
            outcomes += self._jobs_and_fleet(sweep)
        yield outcomes

    def _sweep_now(self, now: float, *, urgent: bool) -> _Sweep:
        """What this tick evaluates (see :meth:`steps`)."""
        wanted, touched = self._take_changes(now)
        swept: set[str] = set()
        whole: set[str] = set()
        held: set[tuple[str, str]] = set()
        if not urgent:
            held = {(i.node, i.target) for i in self.engine.open_incidents()}
            wanted |= held
            first = self._last_tick is None
            swept = self._sweep_slice(now)
            whole = self._ready_whole(swept | self._whole_next if first else set(self._whole_next))
        else:
            whole = self._hellos_among({n for n, _ in wanted} | {n for n, _ in touched})
        return _Sweep(
            fleet=self._fleet_map(),
            now=now,
            wanted=wanted,
            swept=swept,
            whole=whole,
            touched=touched,
            held=held,
        )

    def _jobs_and_fleet(self, sweep: _Sweep) -> list[Outcome]:
        """The job rules on every job and the fleet rules (a regular tick's last part)."""
        outcomes: list[Outcome] = []
        if self.jobs is not None:
            for job in self.jobs.publish():
                key = job_key(job["id"])
                for rule in self._by_scope[Scope.JOB]:
                    data = {"job": job, "fleet": sweep.fleet}
                    outcomes += self._evaluate(rule, key, key, data, sweep.now)
        for rule in self._by_scope[Scope.FLEET]:
            data = {"fleet": sweep.fleet}
            outcomes += self._evaluate(rule, FLEET_KEY, FLEET_KEY, data, sweep.now)
        return outcomes

    def _events_now(self) -> _Sweep:
        """What an ``events`` tick evaluates: the targets events marked, and no others.

        They stay marked changed for the next tick too: a node's mark is also what has that
        tick evaluate the node whole when its first Report is in, and a target or two evaluated
        twice costs less than a node that waits for the regular tick.
        """
        wanted, self._evented = self._evented, set()
        return _Sweep(
            fleet=self._fleet_map(),
            now=self.clock.monotonic(),
            wanted=wanted,
            swept=set(),
            whole=set(),
        )

    def _fleet_map(self) -> dict[str, Any]:
        """The ``fleet`` a tick reads: the last regular tick's counts, and the extras."""
        return {**(self._fleet_nodes or {}), **self.fleet_extras()}

    def _take_changes(
        self, now: float
    ) -> tuple[set[tuple[str, str]], dict[tuple[str, str], set[str]]]:
        """The targets marked changed, and those sampled (with their signals), since the last tick.

        Every tick first lets through the paced samples whose pause is over, urgent ones too:
        released only at regular ticks, every busy GPU's pause came to begin at one, and each
        regular tick at 4,096 nodes evaluated some 11,000 of them at once (140 ms of the loop,
        when the tail of the fault benchmark's faults arrived). A pause begins again at the
        tick that lets it through, so pauses let through together stay together.
        """
        self._release_paced(now)
        wanted = set(self._dirty)
        self._dirty.clear()
        self._evented.clear()
        touched, self._touched = self._touched, {}
        return wanted, touched

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
        ready: set[str] = set()
        for name in names:
            state = nodes.get(name)
            if state is None or not state.connected:
                self._whole_next.discard(name)
            elif state.reported:
                ready.add(name)
                self._whole_next.discard(name)
        return ready

    def _hellos_among(self, names: set[str]) -> set[str]:
        """The nodes of ``names`` to evaluate whole in this urgent tick (see :meth:`_ready_whole`).

        Such a node said Hello and its first Report is in. It is evaluated whole once: not
        here for the Report and again whole at the next regular tick (after a collector restart
        every node connects at once, and that was twice the evaluation).
        """
        if not self._whole_next:
            return set()
        return self._ready_whole(names & self._whole_next)

    def _evaluate(  # noqa: PLR0913 - a target's rule, its data, and whether it has any yet
        self,
        rule: Rule,
        node: str,
        key: str,
        data: dict[str, Any],
        now: float,
        *,
        waiting: bool = False,
    ) -> list[Outcome]:
        """Evaluate ``rule`` on one target and let the engine move its incident.

        ``waiting``: the target's node has sent no Report since its Hello or since this
        collector took it back from the journal, so its model holds no readings yet. A rule
        that does not hold there changes nothing: an incident open on it is neither resolved
        nor its ``for`` restarted by the want of data (it would fire again, with new actions,
        a second later when the first Report came in).
        """
        self.evaluations += 1
        context: TargetContext = _Context(self, key, now)
        holds, error = self._answer(rule, data, context)
        if error is not None and not error.startswith("NOT_FOUND"):
            count = self.errors[rule.name] = self.errors.get(rule.name, 0) + 1
            if count == 1 or count % ERROR_LOG_EVERY == 0:
                log.warning(
                    "rule_evaluation_failed", rule=rule.name, target=key, error=error, count=count
                )
        if waiting and not holds:
            return []
        occurrences = None
        counted = self._occurrences.get(rule.name)
        if counted is not None and (holds or self.engine.get(rule.name, key) is not None):
            occurrences = self.env.number(counted, data, context)
        transitions = self.engine.observe(
            rule.name,
            node,
            key,
            holds=holds,
            now=now,
            evidence=self._evidence(rule, data) if holds else "",
            occurrences=occurrences,
        )
        return [Outcome(t, rule, self.verdict(t.incident, rule)) for t in transitions]

    def _answer(
        self, rule: Rule, data: dict[str, Any], context: TargetContext
    ) -> tuple[bool, str | None]:
        """The rule's condition on ``data``: remembered when pure and seen, else from CEL.

        A pure condition's key holds the values of the windows it asks (``context``), so a
        window that moves is a new key, as a field that changes is.
        """
        memo = self.memo
        seen = memo.key(rule.name, data, context)
        if seen is not None and (answer := memo.get(rule.name, seen)) is not None:
            return answer
        view = cel_view(data, self._reads[rule.name], cut_signals=self._cut_signals[rule.name])
        answer = self.env.evaluate(self._compiled[rule.name], view, context)
        if seen is not None:
            memo.put(rule.name, seen, answer)
        return answer

    def holds_now(self, incident: Incident) -> bool | None:
        """Whether the incident's rule holds on its target now, evaluated afresh.

        What an action that waited checks before it runs: the condition itself, not the
        incident's phase (``keep_firing_for`` keeps an incident firing after its fault cleared).
        None when the target is gone or the rule is not one of a node's targets.
        """
        rule = self.engine.rules.get(incident.rule)
        if rule is None or rule.scope in (Scope.JOB, Scope.FLEET):
            return None
        now = self.clock.monotonic()
        extras = self._fleet_nodes if self._fleet_nodes is not None else self._fleet_counts()
        sweep = _Sweep(
            fleet={**extras, **self.fleet_extras()},
            now=now,
            wanted={(incident.node, incident.target)},
            swept=set(),
            whole=set(),
        )
        for _node, key, scope, _rules, data in self._targets(sweep):
            if key == incident.target and scope == rule.scope:
                holds, _error = self.env.evaluate(
                    self._compiled[rule.name], data, _Context(self, key, now)
                )
                return holds
        return None

    def verdict(self, incident: Incident, rule: Rule) -> Verdict:
        """Whether a firing incident is suppressed (by a critical one on its node) or silenced."""
        verdict = Verdict(silenced_by=self.silencer(incident, rule))
        if incident.phase != Phase.FIRING or rule.scope in (Scope.NODE, Scope.JOB, Scope.FLEET):
            return verdict
        for other in self.engine.open_incidents():
            other_rule = self.engine.rules[other.rule]
            if (
                other.node == incident.node
                and other.phase == Phase.FIRING
                and other_rule.scope == Scope.NODE
                and other_rule.severity == Severity.CRITICAL
            ):
                verdict.suppressed_by = other.id
                break
        return verdict

    def _evidence(self, rule: Rule, data: dict[str, Any]) -> str:
        """A short, factual line naming the target (the rule is named beside it)."""
        if "job" in data:
            return str(data["job"]["summary"])
        rank = data.get("rank")
        if rank and self.jobs is not None and "rank." in rule.when:
            return self.jobs.straggler_summary(rank["job"], rank["rank"])
        return self._target_line(rule, data)

    @staticmethod
    def _target_line(rule: Rule, data: dict[str, Any]) -> str:
        if "port" in data:
            p = data["port"]
            return f"IB {p['device']}/{p['port']} {p['state']}/{p['phys_state']}"
        if "link" in data:
            return f"GPU {data['gpu']['index']} NVLink {data['link']['index']}"
        if "gpu" in data:
            g = data["gpu"]
            return f"GPU {g['index']} {g['uuid']}"
        if "node" in data:
            return f"node {data['node']['name']}"
        return rule.scope.value

    # ---- data for CEL -----------------------------------------------------------------------

    def _fleet_counts(self) -> dict[str, Any]:
        """The ``fleet`` variables the model gives (the dispatcher gives the rest), at once."""
        tally = self._tally_fleet()
        while True:
            try:
                next(tally)
            except StopIteration as done:
                counts: dict[str, Any] = done.value[0]
                return counts

    def _tally_fleet(
        self,
    ) -> Generator[list[Outcome], None, tuple[dict[str, Any], dict[tuple[str, float], float]]]:
        """The ``fleet`` counts, and each ``share_of_ports`` asked for, in parts of nodes.

        An empty part after every :data:`TALLY_CHUNK` nodes lets the incident service give the
        loop a turn: at 4,096 nodes the counts took 10 ms, and a share (every port of the fleet)
        20 to 40 ms, each as one piece of every regular tick with no stream read meanwhile.
        """
        nodes = list(self.fleet.view().values())
        asked = sorted(self._share_args)
        hot = [0] * len(asked)
        reachable = gpus = ports = up = 0
        for start in range(0, len(nodes), TALLY_CHUNK):
            chunk = nodes[start : start + TALLY_CHUNK]
            for node in chunk:
                reachable += node.reachable
                gpus += len(node.gpus)
                ports += len(node.ports)
                for port in node.ports.values():
                    if port.state == "ACTIVE":
                        up += 1
            for i, (signal, above) in enumerate(asked):
                hot[i] += _ports_over(chunk, signal, above)
            yield []
        counts = {
            "nodes": len(nodes),
            "nodes_reachable": reachable,
            "gpus": gpus,
            "ib_ports": ports,
            "ib_ports_up": up,
        }
        return counts, {pair: hot[i] / ports if ports else 0.0 for i, pair in enumerate(asked)}

    def share_now(self, signal: str, above: float) -> float:
        """The share of the fleet's IB ports whose ``signal`` is over ``above``, counted now.

        The pair is counted in every regular tick's tally from now on.
        """
        self._share_args.add((signal, above))
        nodes = list(self.fleet.view().values())
        total = sum(len(node.ports) for node in nodes)
        return _ports_over(nodes, signal, above) / total if total else 0.0

    @staticmethod
    def _node_map(node: NodeState) -> dict[str, Any]:
        return {
            "name": node.name,
            "reachable": node.reachable,
            "connected": node.connected,
            "gpus": len(node.gpus),
            "gpus_lost": sum(1 for g in node.gpus.values() if not g.present),
            "nvlinks_down": sum(g.nvlinks_down for g in node.gpus.values()),
            "ib_ports": len(node.ports),
            "ib_ports_down": sum(1 for p in node.ports.values() if p.state and not p.up),
            "signals": node.signals,
        }

    @staticmethod
    def _gpu_map(gpu: GpuState) -> dict[str, Any]:
        return {
            "index": gpu.index,
            "uuid": gpu.uuid,
            "model": gpu.model,
            "pci_bus_id": gpu.pci_bus_id,
            "present": gpu.present,
            "nvlink_count": gpu.nvlink_count,
            "nvlinks_down": gpu.nvlinks_down,
            "signals": gpu.signals,
        }

    @staticmethod
    def _port_map(port: PortState) -> dict[str, Any]:
        return {
            "device": port.device,
            "port": port.port,
            "state": port.state,
            "phys_state": port.phys_state,
            "up": port.up,
            "rate": port.rate,
            "signals": port.signals,
        }

    def _sweep_slice(self, now: float) -> set[str]:
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

    def _rules_for(
        self, sweep: _Sweep, name: str, key: str, scope: Scope, *, ranked: bool = False
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
            still = not self.history.moving(key, sweep.now)
            return self._hello_rules[scope] if still else self._by_scope[scope]
        if (name, key) in sweep.wanted:
            return self._by_scope[scope]
        signals = sweep.touched.get((name, key))
        if name not in sweep.swept:
            return self._reading(scope, signals) if signals else ()
        if scope == Scope.NODE or ranked or self.history.moving(key, sweep.now):
            return self._by_scope[scope]
        if not signals:
            return self._sweep_all[scope]
        swept, reading = self._sweep_all[scope], self._reading(scope, signals)
        return tuple(r for r in self._by_scope[scope] if r in swept or r in reading)

    def _reading(self, scope: Scope, signals: set[str]) -> tuple[Rule, ...]:
        """The rules of ``scope`` whose conditions name one of ``signals``."""
        key = (scope, frozenset(signals))
        rules = self._reading_cache.get(key)
        if rules is None:
            rules = self._reading_cache[key] = tuple(
                r for r in self._by_scope[scope] if not self._reads[r.name].isdisjoint(signals)
            )
        return rules

    def _base_map(self, sweep: _Sweep, node: NodeState) -> dict[str, Any]:
        node_data = sweep.nodes.get(node.name)
        if node_data is None:
            node_data = sweep.nodes[node.name] = self._node_map(node)
        return {"node": node_data, "fleet": sweep.fleet}

    def _nodes_with_links(self, sweep: _Sweep) -> set[str]:
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
        return links_of | {n for n in looked if self.history.moving_links(n, sweep.now)}

    def _targets(
        self, sweep: _Sweep
    ) -> Iterator[tuple[str, str, Scope, tuple[Rule, ...], dict[str, Any]]]:
        """(node, key, scope, rules, data) of every target with rules to evaluate this tick.

        The nodes with a target marked changed (an event, a change of state) come first: a tick
        that an Xid woke also evaluates the samples of the last 0.2 s (some 1,000 targets at
        4,096 nodes), and the fault's incident was found wherever its node fell among them.
        """
        nodes = self.fleet.view()
        marked = {n for n, _ in sweep.wanted}
        rest = sweep.swept | sweep.whole | {n for n, _ in sweep.touched}
        links_of = self._nodes_with_links(sweep)
        for name in chain(marked, rest - marked):
            node = nodes.get(name)
            if node is None:
                continue
            links = name in links_of
            base: dict[str, Any] | None = None  # the node's and the fleet's maps, once needed
            key = node_key(name)
            if rules := self._rules_for(sweep, name, key, Scope.NODE):
                base = self._base_map(sweep, node)
                yield name, key, Scope.NODE, rules, base
            for gpu in node.gpus.values():
                key = gpu_key(name, gpu.index)
                rank = self.jobs.rank_on(name, gpu.uuid) if self.jobs is not None else {}
                gpu_data = None
                if rules := self._rules_for(sweep, name, key, Scope.GPU, ranked=bool(rank)):
                    base = base or self._base_map(sweep, node)
                    gpu_data = self._gpu_map(gpu)
                    yield name, key, Scope.GPU, rules, {**base, "gpu": gpu_data, "rank": rank}
                for link, values in gpu.link_signals.items() if links else ():
                    lkey = link_key(name, gpu.index, link)
                    if not (rules := self._rules_for(sweep, name, lkey, Scope.NVLINK)):
                        continue
                    base = base or self._base_map(sweep, node)
                    gpu_data = gpu_data or self._gpu_map(gpu)
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
                if rules := self._rules_for(sweep, name, pkey, Scope.IB_PORT):
                    base = base or self._base_map(sweep, node)
                    yield name, pkey, Scope.IB_PORT, rules, {**base, "port": self._port_map(port)}
