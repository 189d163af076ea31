"""Incidents forwarded to Alertmanager, as Prometheus' notifier forwards its alerts.

The incident service tells the :class:`AlertForwarder` of each incident it journals as firing or
resolved, and of each firing one it takes back at start (:meth:`AlertForwarder.changed`). The
forwarder sends in rounds, one ``POST /api/v2/alerts`` per Alertmanager with every alert of the
round (in batches of :data:`MAX_BATCH`): a round at once when an incident fires or resolves
(changes less than :data:`PROMPT_GAP_S` apart share it), and a full round every
``resend_interval`` with every alert that fires and every one resolved in the last
:data:`KEEP_RESOLVED_S`. A firing alert ends :data:`ENDS_AFTER_RESENDS` resend intervals after
its send, so Alertmanager resolves it by itself when the sends stop (the collector died); a
resolved one ends when its incident resolved.

What is sent: incidents of rules at or above ``min_severity``, not in shadow mode, neither
silenced nor suppressed when they were journaled (as the dispatcher runs no action for those, so
nobody is paged for them); an alert that stops qualifying (a reload raised ``min_severity``,
changed a rule's labels, the incident's rule was removed) is sent once more as ended now.

The HTTP (:mod:`collector.actions.alertmanager_http`) runs in a worker thread
(``asyncio.to_thread``), so the event loop never blocks; every Alertmanager is sent to at once,
and one that does not answer holds up no other. A failed send is counted, logged, and sent
again: at the next round, at the latest :data:`RETRY_S` later when no Alertmanager took it.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol

import structlog

from collector.actions.alertmanager_alerts import alert_for, rule_labels
from fleetwatch.clock import unix_ms, wait_for_event

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from collector.actions.alertmanager_alerts import Alert
    from collector.actions.alertmanager_config import AlertmanagerConfig
    from collector.store.incidents import IncidentRow
    from fleetwatch.clock import Clock
    from rules.model import Rule

log = structlog.get_logger("collector.actions.alertmanager")

KEEP_RESOLVED_S: Final = 900.0  # resolved alerts are sent again for 15 min, as Prometheus does
ENDS_AFTER_RESENDS: Final = 4  # Prometheus: 4 x max(evaluation interval, resend delay)
MAX_BATCH: Final = 1000  # alerts per request; a round with more sends several
RETRY_S: Final = 5.0  # after a round no Alertmanager took, the next comes this soon at the latest
PROMPT_GAP_S: Final = 0.05  # changes this close together go in one round
LOG_EVERY_S: Final = 60.0  # an Alertmanager's failures are logged at most this often

Fingerprint = tuple[tuple[str, str], ...]


class AlertPoster(Protocol):
    """Where a batch of alerts goes: an Alertmanager's API (a fake one in tests)."""

    url: str  # names it in metrics and logs

    def post(self, body: bytes) -> str | None:
        """Send one batch (a JSON array of alerts); None when taken, else why not.

        Runs in a worker thread; must return within its own timeout and never raise.
        """
        ...


@dataclass(slots=True)
class _Ended:
    """An alert sent as ended (resolved), again at each full round until ``until``."""

    alert: Alert
    ends_ms: int
    until: float  # monotonic
    sent: bool = False


class AlertForwarder:
    """Keeps Alertmanager's alerts in step with the incidents the service carries."""

    def __init__(
        self,
        *,
        config: AlertmanagerConfig,
        endpoints: tuple[AlertPoster, ...],
        clock: Clock,
        firing: Callable[[], Mapping[str, Rule]],
    ) -> None:
        """``firing``: the incidents firing now, by id, with their rule (read at each round).

        Nothing is sent until :meth:`start`.
        """
        self._config = config
        self._endpoints = endpoints
        self._clock = clock
        self._firing = firing
        self._known: dict[str, IncidentRow] = {}  # firing incidents as last journaled
        self._sent: dict[str, Alert] = {}  # what Alertmanager took for each, last
        self._ended: dict[Fingerprint, _Ended] = {}
        self._dirty: set[str] = set()  # changed since the last round
        self._full_next = False
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._told_labels: set[tuple[str, str]] = set()  # (rule, label) refused, logged once
        self.sent: Counter[str] = Counter()  # alerts each Alertmanager took, by its URL
        self.failures: Counter[str] = Counter()  # requests that failed, by URL
        self.last_success: dict[str, float] = {}  # Unix time of each one's last taken request
        self._logged_at: dict[str, float] = {}  # monotonic time of each one's last failure logged
        self._unlogged: Counter[str] = Counter()  # failures since that line

    @property
    def endpoints(self) -> tuple[AlertPoster, ...]:
        """The Alertmanagers sent to now."""
        return self._endpoints

    def held(self) -> tuple[int, int]:
        """Alerts sent as firing, and as resolved (still sent again), now."""
        return len(self._sent), len(self._ended)

    def changed(self, row: IncidentRow, rule: Rule) -> None:
        """An incident was journaled (or taken back at start); must not block."""
        if row.phase == "firing":
            self._known[row.id] = row
            self._dirty.add(row.id)
        else:
            known = self._known.pop(row.id, None)
            if known is None:
                return  # one that never fired (pending, dropped): nothing to say
            self._dirty.discard(row.id)
            alert = self._sent.pop(row.id, None)  # ended under the labels it went out with
            if alert is None and self._endpoints:  # it may be in flight now: end it anyway
                alert = self._alert(known, rule)
            if alert is not None:
                ends = row.resolved_ms if row.resolved_ms is not None else unix_ms(self._clock)
                self._ended[alert.fingerprint] = _Ended(
                    alert, ends, self._clock.monotonic() + KEEP_RESOLVED_S
                )
        self._wake.set()

    def configure(self, config: AlertmanagerConfig, endpoints: tuple[AlertPoster, ...]) -> None:
        """Take a reloaded configuration: a full round follows at once, under the new labels."""
        self._config, self._endpoints = config, endpoints
        if not endpoints:
            self._sent.clear()
            self._ended.clear()
        self._full_next = True
        self._wake.set()

    def start(self) -> None:
        """Send in the background: a full round at once, then as incidents change."""
        self._task = asyncio.create_task(self._run(), name="alertmanager")

    async def stop(self) -> None:
        """Stop sending; Alertmanager resolves what fires when its ``endsAt`` passes."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def _alert(self, row: IncidentRow, rule: Rule) -> Alert | None:
        """The incident's alert, or None when it is not sent.

        Not sent: below ``min_severity``, silenced or suppressed when journaled, or of a rule in
        shadow mode (it acts on nothing, and paging someone is acting).
        """
        config = self._config
        if not config.forwards(rule.severity.value) or rule.shadow:
            return None
        if row.silenced_by or row.suppressed_by:
            return None
        for name in rule_labels(rule)[1]:
            if (rule.name, name) not in self._told_labels:
                self._told_labels.add((rule.name, name))
                log.warning(
                    "alertmanager_rule_label_skipped",
                    rule=rule.name,
                    label=name,
                    why="not a label name, or one fleetwatch sets itself",
                )
        return alert_for(row, rule, config.labels, config.external_url)

    def _end(self, incident_id: str, ends_ms: int) -> None:
        alert = self._sent.pop(incident_id)
        until = self._clock.monotonic() + KEEP_RESOLVED_S
        self._ended[alert.fingerprint] = _Ended(alert, ends_ms, until)

    async def _run(self) -> None:
        """Round after round: full ones every ``resend_interval``, prompt ones on changes."""
        next_full = self._clock.monotonic()
        retry_at: float | None = None
        while True:
            now = self._clock.monotonic()
            due = next_full if retry_at is None else min(next_full, retry_at)
            if now < due and not self._full_next:
                await wait_for_event(self._wake, due - now, self._clock)
            if self._wake.is_set():
                await self._clock.sleep(PROMPT_GAP_S)  # what changes with it goes along
                self._wake.clear()
            full = self._full_next or self._clock.monotonic() >= next_full
            if full:
                self._full_next = False
                next_full = self._clock.monotonic() + self._config.resend_interval_s
            try:
                took = await self.send_round(full=full)
            except Exception:  # a bug must not end the forwarding
                log.exception("alertmanager_round_failed")
                took = False
            wait = min(RETRY_S, self._config.resend_interval_s)
            retry_at = None if took else self._clock.monotonic() + wait

    async def send_round(self, *, full: bool) -> bool:
        """Send what is due: everything (``full``), else what changed or did not get through.

        Returns whether an Alertmanager took it (True when nothing was due).
        """
        now_ms = unix_ms(self._clock)
        firing = self._firing()
        for gone in [i for i in self._known if i not in firing]:
            del self._known[gone]  # its rule was removed, or a peer carries it on
        if not self._endpoints:
            self._dirty.clear()
            return True
        due = self._firing_due(firing, now_ms, full=full)
        ended = self._ended_due(due, full=full)
        self._dirty.clear()
        ends_ms = now_ms + int(ENDS_AFTER_RESENDS * self._config.resend_interval_s * 1000)
        bodies = [e.alert.body(e.ends_ms) for e in ended]
        bodies += [a.body(ends_ms) for a in due.values()]
        if not bodies:
            return True
        if not await self._post_all(bodies):
            self._dirty.update(due)  # again at the next round
            return False
        self._sent.update({i: a for i, a in due.items() if i in self._known})
        for end in ended:
            end.sent = True
        return True

    def _firing_due(
        self, firing: Mapping[str, Rule], now_ms: int, *, full: bool
    ) -> dict[str, Alert]:
        """The firing alerts to send now; those that stopped qualifying are ended."""
        for gone in [i for i in self._sent if i not in self._known]:
            self._end(gone, now_ms)
        due: dict[str, Alert] = {}
        for incident_id, row in self._known.items():
            alert = self._alert(row, firing[incident_id])
            before = self._sent.get(incident_id)
            if before is not None and (alert is None or alert.fingerprint != before.fingerprint):
                self._end(incident_id, now_ms)  # ended under the labels it had
                before = None
            if alert is not None and (full or before is None or incident_id in self._dirty):
                due[incident_id] = alert
        return due

    def _ended_due(self, due: Mapping[str, Alert], *, full: bool) -> list[_Ended]:
        """The ended alerts to send now (each once, then at full rounds); drop the old ones.

        One whose labels fire again (a new incident of the rule on the target) is dropped: sent
        after the firing one, it would end that one.
        """
        mono = self._clock.monotonic()
        live = {a.fingerprint for a in (*self._sent.values(), *due.values())}
        ended: list[_Ended] = []
        for fingerprint, end in list(self._ended.items()):
            if mono >= end.until or fingerprint in live:
                del self._ended[fingerprint]
            elif full or not end.sent:
                ended.append(end)
        return ended

    async def _post_all(self, bodies: list[dict[str, object]]) -> bool:
        """Every batch to every Alertmanager at once; whether one of them took them all."""
        batches = [bodies[i : i + MAX_BATCH] for i in range(0, len(bodies), MAX_BATCH)]
        encoded = [json.dumps(b, separators=(",", ":")).encode() for b in batches]
        sizes = [len(b) for b in batches]
        took = await asyncio.gather(*(self._post(e, encoded, sizes) for e in self._endpoints))
        return any(took)

    async def _post(self, endpoint: AlertPoster, batches: list[bytes], sizes: list[int]) -> bool:
        for body, size in zip(batches, sizes, strict=True):
            try:
                error = await asyncio.to_thread(endpoint.post, body)
            except Exception as exc:  # noqa: BLE001 - a poster's bug is this send's failure
                error = f"{type(exc).__name__}: {exc}"
            if error is not None:
                self._failed(endpoint.url, size, error)
                return False
            self.sent[endpoint.url] += size
        self.last_success[endpoint.url] = self._clock.now()
        if self._logged_at.pop(endpoint.url, None) is not None:
            unlogged = self._unlogged.pop(endpoint.url, 0)
            log.info("alertmanager_send_recovered", alertmanager=endpoint.url, unlogged=unlogged)
        log.debug("alertmanager_sent", alertmanager=endpoint.url, alerts=sum(sizes))
        return True

    def _failed(self, url: str, alerts: int, error: str) -> None:
        """Count a failed request; log it, at most every :data:`LOG_EVERY_S` per Alertmanager.

        An Alertmanager that is down fails every round (every :data:`RETRY_S` when it is the
        only one): the metric counts each, the log says it once a minute, with how many more.
        """
        self.failures[url] += 1
        now = self._clock.monotonic()
        last = self._logged_at.get(url)
        if last is not None and now - last < LOG_EVERY_S:
            self._unlogged[url] += 1
            return
        self._logged_at[url] = now
        log.warning(
            "alertmanager_send_failed",
            alertmanager=url,
            alerts=alerts,
            error=error,
            unlogged=self._unlogged.pop(url, 0),  # failures since the last line
        )
