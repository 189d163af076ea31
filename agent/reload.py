"""The agent's reload: read ``agent.toml`` again, apply what can change live, warn for the rest.

What a running agent can take at once (:data:`LIVE_KEYS`): the poll and heartbeat intervals
(unless the collector has set them: its ``Config`` wins until the agent reconnects, as it would
at start) and the log level. Everything else needs a restart, because it names what the agent
opened at start (sources, the spool, the job socket, the stream and its TLS files); each such
key that differs is named in a warning and keeps its running value.

A file with a problem changes nothing: the agent logs the problem with its file and line and
tells the collector through two node samples, ``agent_config_last_reload_successful`` (0 or 1)
and ``agent_config_reload_failures`` (a count), which it sends with its own health samples.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Final

import structlog

from agent.config import AgentConfig
from agent.exceptions import ConfigError
from fleetwatch.config_file import short_repr
from fleetwatch.config_lines import config_problem
from fleetwatch.model import Target
from fleetwatch.reload import ReloadTally, changed_keys, one_line

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from agent.link.intervals import Intervals
    from agent.outbox.changes import LiveSamples
    from fleetwatch.clock import Clock
    from fleetwatch.sd_notify import SdNotifier

log = structlog.get_logger("agent.reload")

LIVE_KEYS: Final = ("poll_interval", "heartbeat_interval", "log_level")
RESTART_KEYS: Final = tuple(
    f.name for f in dataclasses.fields(AgentConfig) if f.name not in LIVE_KEYS
)
OK_SIGNAL: Final = "agent_config_last_reload_successful"
FAILURES_SIGNAL: Final = "agent_config_reload_failures"
_INTERVALS: Final = (("poll_interval", "poll"), ("heartbeat_interval", "heartbeat"))


class AgentReloader:
    """Reloads the agent's configuration on request (SIGHUP); all or nothing."""

    def __init__(  # noqa: PLR0913 - what a reload reads from and writes to
        self,
        *,
        cfg: AgentConfig,
        load: Callable[[], AgentConfig],
        path: Path | None,
        intervals: Intervals,
        live: LiveSamples,
        clock: Clock,
        set_log_level: Callable[[str], None] | None = None,
        notifier: SdNotifier | None = None,
        status: Callable[[], str | None] = lambda: None,
    ) -> None:
        """Start from ``cfg`` (what the agent runs with) and publish the reload samples.

        ``load`` reads the configuration as at start (the file at ``path`` and the command
        line's values); ``intervals`` and ``live`` are the agent's own; ``set_log_level`` applies
        a new ``log_level``. ``status`` is the line ``systemctl status`` shows, or None while the
        agent is not ready yet (systemd then hears nothing of a reload: READY=1 must wait for
        the first poll).
        """
        self.cfg = cfg
        self._load = load
        self._path = path
        self._intervals = intervals
        self._live = live
        self._clock = clock
        self._set_log_level = set_log_level
        self._notifier = notifier
        self._status = status
        self.tally = ReloadTally(last_success_unix=clock.now())
        self._publish()

    def _publish(self) -> None:
        """Hand the outcome to the link with the agent's other node samples."""
        node = Target.node()
        self._live.update(
            {
                (node, OK_SIGNAL): int(self.tally.successful),
                (node, FAILURES_SIGNAL): self.tally.counts["failure"],
            },
        )

    def reload(self) -> bool:
        """Read the configuration again and apply it; return whether it is in use."""
        notifier = self._notifier if self._status() is not None else None
        if notifier is not None:
            notifier.reloading(self._clock.monotonic(), "reloading configuration")
        try:
            new = self._load()
        except ConfigError as exc:
            problem = config_problem(self._path, "agent", str(exc))
            error = one_line(str(problem))
            log.error(
                "config_reload_failed",
                file=problem.file,
                line=problem.line,
                column=problem.column,
                error=error,
                kept="the configuration before",
            )
            self.tally.failure(error)
        else:
            self._apply(new)
        self._publish()
        status = self._status()
        if notifier is not None and status is not None:
            if not self.tally.successful:
                status += (
                    f"; last reload failed, running the config before: {self.tally.last_error}"
                )
            notifier.ready(status)
        return self.tally.successful

    def _apply(self, new: AgentConfig) -> None:
        old = self.cfg
        for key in changed_keys(old, new, RESTART_KEYS):
            log.warning(
                "config_reload_needs_restart",
                key=key,
                running=short_repr(getattr(old, key)),
                configured=short_repr(getattr(new, key)),
            )
        for key, attr in _INTERVALS:
            value, running = getattr(new, key), getattr(self._intervals, attr)
            if running != getattr(old, key):
                log.info("interval_set_by_collector", key=key, running=running, configured=value)
            else:
                setattr(self._intervals, attr, value)
        if new.log_level != old.log_level and self._set_log_level is not None:
            self._set_log_level(new.log_level or "info")
        self.cfg = dataclasses.replace(new, **{k: getattr(old, k) for k in RESTART_KEYS})
        self.tally.success(self._clock.now())
        log.info(
            "config_reloaded",
            changed=changed_keys(old, new, LIVE_KEYS),
            poll_interval=self._intervals.poll,
            heartbeat_interval=self._intervals.heartbeat,
        )
