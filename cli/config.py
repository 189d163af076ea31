"""``fleetwatch config check``: what the daemons check at start, run before a restart needs it.

An agent file is checked as ``fleetwatch agent`` loads it (the ``[agent]`` table, the Xid
catalog it names, and its TLS files); a collector file as ``fleetwatch collector`` does (the
``[collector]`` table with its actions and jobs, the rule files, the Xid catalog, its TLS files,
every webhook's secret, Alertmanager's bearer token and CA file, and the API token, each from
its file or environment variable). TLS files must be readable PEM, each key must belong to its
certificate, an agent's certificate must name its node, and a certificate that has expired or
is not valid yet is a problem too. A file passes when the daemon would start with it (and could
connect, as far as its certificates go).

Every problem is listed, not only the first, each at its line as the collector's reload gives it
(:mod:`fleetwatch.config_lines`): a file that does not load is read again, its unknown keys
named one by one (with the known key they are closest to), a collector's parts checked on their
own (each part of ``actions``, ``alertmanager``, ``ingest``, ``jobs``), and the rest loaded
again without the keys each problem names until it loads (:mod:`cli.config_keys`), so the checks
that follow (rules, TLS, secrets) still run. Every TLS file that cannot be read is named. Values
a hostile or broken file holds (a key of megabytes) are shown cut, never whole. A secret file
(API token, journal password, webhook secret, Alertmanager token, ``--env-file``) that others can
read, that anyone but its owner can write, or that a group other than the service's
(``fleetwatch``) can read is a warning, not a problem; so is a collector whose rules drain or
notify with nothing configured to carry it out.
"""

from __future__ import annotations

import functools
import grp
import json
import re
import stat
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from cli.config_keys import Place, load_agent, load_collector
from collector.exceptions import CollectorError
from fleetwatch.config_file import not_utf8, shown_key, shown_keys, shown_path
from fleetwatch.config_lines import FileProblem, locate
from rules.exceptions import RulesError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence
    from typing import TextIO

    from agent.config import AgentConfig
    from collector.actions.config import ActionsConfig
    from collector.config import CollectorConfig
    from fleetwatch.clock import Clock
    from fleetwatch.tls import TlsMaterial
    from rules.model import RuleSet

KINDS: Final = ("agent", "collector")
DEFAULT_FILES: Final = {kind: Path(f"/etc/fleetwatch/{kind}.toml") for kind in KINDS}
_ENV_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SERVICE_GROUP: Final = "fleetwatch"  # the units' Group=; it may read the secret files
MAX_LINE: Final = 2_000  # the longest line the check prints; longer ones are cut
# Keys whose value a TLS check needs as written: when one was set aside, the check is skipped
# (its message would be about the default, not about the file).
_TLS_INPUTS: Final = {
    "agent": frozenset(
        {"tls_cert", "tls_key", "tls_ca", "tls_server_name", "insecure", "node"}
        | {"collector", "collectors"}
    ),
    "collector": frozenset({"tls_cert", "tls_key", "tls_client_ca", "insecure", "listen"}),
}


@dataclass(frozen=True, slots=True)
class Outcome:
    """What checking one file as one kind found: a summary when clean, else the problems.

    Warnings (a secret file others can read, rules whose actions nothing would carry out)
    are printed either way and fail nothing.
    """

    summary: str
    problems: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()


def _shown(problems: Iterable[FileProblem]) -> tuple[str, ...]:
    """Each problem as ``file:line: message``, the placed ones in the file's order first."""
    return tuple(str(p) for p in sorted(problems, key=lambda p: (p.line is None, p.line or 0)))


def read_env_file(path: Path) -> tuple[dict[str, str], list[str]]:
    """Read ``KEY=VALUE`` lines as systemd's ``EnvironmentFile=`` does (the simple subset).

    Blank lines and lines starting with ``#`` or ``;`` are skipped; a value in matching quotes
    loses them. Returns the variables and the problems, which name lines, never values.
    """
    try:
        text = path.read_text("utf-8")
    except OSError as exc:
        return {}, [f"{shown_path(path)}: cannot read the environment file: {exc.strerror}"]
    except UnicodeDecodeError as exc:
        return {}, [not_utf8(path, "the environment file", exc)]
    values: dict[str, str] = {}
    problems: list[str] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        key, sep, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not _ENV_NAME.fullmatch(key):
            problems.append(f"{path}:{number}: expected NAME=VALUE")
            continue
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":  # noqa: PLR2004
            value = value[1:-1]
        values[key] = value
    return values, problems


def file_kinds(path: Path) -> tuple[list[str], str | None]:
    """The kinds of config in ``path`` by its tables, or a problem saying why none."""
    try:
        raw = tomllib.loads(path.read_text("utf-8"))
    except OSError as exc:
        return [], f"{shown_path(path)}: cannot read: {exc.strerror}"
    except UnicodeDecodeError as exc:
        return [], not_utf8(path, "the config file", exc)
    except ValueError as exc:  # TOMLDecodeError, or an integer of thousands of digits
        message = f"{shown_path(path)}: invalid TOML: {str(exc)[:200]}"
        return [], str(locate(str(path), "", "", message))  # at the error's line and column
    kinds: list[str] = [kind for kind in KINDS if isinstance(raw.get(kind), dict)]
    if not kinds:
        return [], (
            f"{path}: has neither an [agent] nor a [collector] table; "
            "name its kind with --agent FILE or --collector FILE"
        )
    return kinds, None


def _catalog_problems(catalog: Path | None, place: Place) -> list[FileProblem]:
    """A problem loading the Xid catalog, which names its own file."""
    from rules.xid_catalog import load_catalog  # noqa: PLC0415

    try:
        load_catalog(catalog)
    except RulesError as exc:
        return [place.outside(str(exc))]
    return []


def _tls_problems(
    files: Sequence[tuple[str, Path | None]],
    material: Callable[[], TlsMaterial | None],
    error: type[Exception],
    what: str,
    clock: Clock,
) -> list[str]:
    """Problems of the TLS files, every unreadable one named (the loader stops at the first)."""
    unreadable: list[str] = []
    for key, path in files:
        if path is None:
            continue
        try:
            with path.open("rb"):
                pass
        except OSError as exc:
            unreadable.append(f"{what}: {key} {shown_path(path)}: {exc.strerror}")
    if unreadable:
        return unreadable
    try:
        loaded = material()
    except error as exc:
        return [str(exc)]
    return _validity(loaded, f"{what}: tls_cert", clock)


def check_agent(path: Path, clock: Clock) -> Outcome:
    """Load ``path`` as the agent does at start; certificates are checked for ``clock``'s now."""
    from agent.bmc_config import open_bmc  # noqa: PLC0415
    from agent.exceptions import AgentError  # noqa: PLC0415
    from agent.link.tls import tls_material  # noqa: PLC0415

    place = Place.of(path, "agent", "agent.bmc")
    cfg, problems, aside = load_agent(path, place)
    if cfg is None:
        return Outcome("", _shown(problems))
    problems += _catalog_problems(cfg.xid_catalog, place)
    if not aside & _TLS_INPUTS["agent"]:
        tls = [(key, getattr(cfg, key)) for key in ("tls_cert", "tls_key", "tls_ca")]
        found = _tls_problems(tls, lambda: tls_material(cfg), AgentError, "agent config", clock)
        problems += map(place.at, found)
    warnings: list[str] = []
    if cfg.bmc is not None:  # its credentials are read as at start (the BMC is not asked)
        try:
            open_bmc(cfg.bmc)
        except AgentError as exc:
            problems.append(place.at(str(exc)))
        warnings = _secret_file_warnings([("[agent.bmc] password_file", cfg.bmc.password_file)])
    bmc = f"BMC {cfg.bmc.protocol} {cfg.bmc.address}" if cfg.bmc else "BMC off"
    summary = (
        f"node {cfg.node}, collector{'s' if len(cfg.targets) > 1 else ''} "
        f"{', '.join(cfg.targets)} ({_transport(cfg)}), "
        f"poll every {cfg.poll_interval:g} s, "
        f"kernel log {cfg.kmsg_path or 'off'}, GPU resets {'on' if cfg.gpu_reset else 'off'}, "
        f"{bmc}"
    )
    return Outcome(summary, _shown(problems), tuple(warnings))


def check_collector(path: Path, environ: Mapping[str, str], clock: Clock) -> Outcome:
    """Load ``path`` as the collector does at start, with ``environ`` for webhook secrets."""
    from collector.ingest.tls import tls_material  # noqa: PLC0415

    place = Place.of(path, "collector", "collector.jobs", "collector.ingest")
    cfg, problems, aside = load_collector(path, place)
    if cfg is None:
        return Outcome("", _shown(problems))
    rules, found = _rules_and_gates(cfg, place)
    problems += found + _catalog_problems(cfg.xid_catalog, place)
    if not aside & _TLS_INPUTS["collector"]:
        tls = [("tls_cert", cfg.tls_cert), ("tls_key", cfg.tls_key)]
        tls.append(("tls_client_ca", cfg.tls_client_ca))
        found_tls = _tls_problems(
            tls, lambda: tls_material(cfg.server_tls()), CollectorError, "collector config", clock
        )
        problems += map(place.at, found_tls)
    actions = cfg.actions
    hooks = [
        (f"actions.{name}", hook)
        for name, hook in (
            ("drain_webhook", actions.drain_webhook),
            ("reboot_webhook", actions.reboot_webhook),
            ("rma_webhook", actions.rma_webhook),
        )
        if hook is not None
    ]
    hooks += [(f"actions.notify.{shown_key(name)}", hook) for name, hook in actions.notify.items()]
    checks: list[Callable[[Mapping[str, str]], object]] = [cfg.api_token]
    checks.append(cfg.journal_config().password)
    checks.append(cfg.alertmanager.endpoints)  # its bearer token and CA file
    checks += [functools.partial(hook.sender, clock, key) for key, hook in hooks]
    for check_secret in checks:
        try:
            check_secret(environ)
        except CollectorError as exc:
            problems.append(place.at(str(exc)))
    warnings = _secret_file_warnings(
        [
            ("api_token_file", cfg.api_token_file),
            ("journal_password_file", cfg.journal_password_file),
            ("alertmanager.bearer_token_file", cfg.alertmanager.bearer_token_file),
            *((f"{key}.secret_file", hook.secret_file) for key, hook in hooks),
        ]
    )
    if rules is not None and "actions" not in aside:
        warnings += _sink_warnings(actions, rules)
    drainers = {"slurm": actions.slurm.enabled, "webhook": actions.drain_webhook is not None}
    summary = (
        f"listen {cfg.listen} ({_transport(cfg)}), http {cfg.http} ({_api_changes(cfg)}), "
        f"journal {cfg.journal_config().where()}, "
        f"{0 if rules is None else len(rules.rules)} rules{'' if cfg.rules else ' (built-in)'}, "
        f"drains via {' and '.join(k for k, on in drainers.items() if on) or 'nothing'}, "
        f"{len(actions.notify)} notify channels"
        f"{_reboots_and_tickets(actions, rules)}"
        f"{', requeues jobs via slurm' if actions.slurm.requeue else ''}"
        f"{', dry run' if actions.safety.dry_run else ''}"
    )
    return Outcome(summary, _shown(problems), tuple(warnings))


def _rules_and_gates(
    cfg: CollectorConfig, place: Place
) -> tuple[RuleSet | None, list[FileProblem]]:
    """The rules (None when they do not load) and the problems of the rule and gates files."""
    from rules.gates_file import GatesFileError, load_gates  # noqa: PLC0415
    from rules.loader import load_rules  # noqa: PLC0415 - CEL loads only when needed

    rules, problems = None, []
    try:
        rules = load_rules(list(cfg.rules))
    except RulesError as exc:
        problems += [place.outside(f"rules: {line}") for line in str(exc).splitlines()]
    try:
        load_gates(cfg.preflight_gates)
    except GatesFileError as exc:
        lines = str(exc).splitlines()
        problems += [place.outside(f"preflight_gates: {line}") for line in lines]
    return rules, problems


def _reboots_and_tickets(actions: ActionsConfig, rules: RuleSet | None) -> str:
    """``, reboots via slurm and webhook, RMA tickets via webhook``.

    Reboots are named once a reboot webhook is set or a rule reboots (Slurm's would be there
    whenever it drains: saying so on every line says nothing).
    """
    named = {
        spec.name
        for rule in (rules.rules if rules is not None else ())
        for spec in (*rule.actions, *(rule.escalation.actions if rule.escalation else ()))
    }
    rebooters = {"slurm": actions.slurm.enabled, "webhook": actions.reboot_webhook is not None}
    shown = " and ".join(k for k, on in rebooters.items() if on) or "nothing"
    reboots = actions.reboot_webhook is not None or "reboot_node" in named
    said = f", reboots via {shown}" if reboots else ""
    return said + (", RMA tickets via webhook" if actions.rma_webhook is not None else "")


def _sink_warnings(actions: ActionsConfig, rules: RuleSet) -> list[str]:
    """Rules that drain, reboot, open tickets or notify with nothing to carry it out: what then.

    A drain goes through Slurm and/or a drain webhook, a notification through the webhook of
    the rule's channel, else of ``default``. Without one, the action is journaled as failed
    and goes no further: easy to miss until the day it matters.
    """
    drains: set[str] = set()
    named: dict[str, set[str]] = {"reboot_node": set(), "rma_ticket": set()}
    channels: dict[str, set[str]] = {}  # a channel rules notify: those rules
    for rule in rules.rules:
        for spec in (*rule.actions, *(rule.escalation.actions if rule.escalation else ())):
            drain_first = spec.name == "reset_gpu" and spec.params.get("drain_first") is True
            if spec.name in named:
                named[spec.name].add(rule.name)
            if spec.name == "drain_node" or drain_first:
                drains.add(rule.name)
            elif spec.name == "notify":
                channels.setdefault(str(spec.params.get("channel", "default")), set()).add(
                    rule.name
                )
    warnings: list[str] = []
    if drains and not (actions.slurm.enabled or actions.drain_webhook is not None):
        warnings.append(
            f"no drain sink: {_some(drains)} drain nodes, but [collector.actions.slurm] is not "
            "enabled and there is no [collector.actions.drain_webhook]: each drain is journaled "
            "as failed and reaches no scheduler, which keeps placing jobs on the node; set "
            "enabled = true under [collector.actions.slurm], or a url under "
            "[collector.actions.drain_webhook]"
        )
    warnings += _repair_warnings(actions, named)
    unheard = sorted(c for c in channels if c not in actions.notify)
    if unheard and "default" not in actions.notify:
        why = "no [collector.actions.notify.<channel>] is set"
        if actions.notify:
            why = f"channel(s) {shown_keys(unheard)} have no table there and there is no default"
        notifying = {name for channel in unheard for name in channels[channel]}
        warnings.append(
            f"no notify sink: {_some(notifying)} notify, but {why}: each notification is "
            "journaled as failed and reaches nobody; set a url under "
            "[collector.actions.notify.default]"
        )
    return warnings


def _repair_warnings(actions: ActionsConfig, named: dict[str, set[str]]) -> list[str]:
    """Rules that reboot nodes or open RMA tickets (``named``) with nothing to do it."""
    warnings: list[str] = []
    if named["reboot_node"] and not (actions.slurm.enabled or actions.reboot_webhook is not None):
        warnings.append(
            f"no reboot sink: {_some(named['reboot_node'])} reboot nodes, but "
            "[collector.actions.slurm] is not enabled and there is no "
            "[collector.actions.reboot_webhook]: each reboot is journaled as failed; set "
            "enabled = true under [collector.actions.slurm] (with a RebootProgram in "
            "slurm.conf), or a url under [collector.actions.reboot_webhook]"
        )
    if named["rma_ticket"] and actions.rma_webhook is None:
        warnings.append(
            f"no RMA sink: {_some(named['rma_ticket'])} open RMA tickets, but there is no "
            "[collector.actions.rma_webhook]: each ticket is journaled as failed and reaches "
            "nobody; set a url under [collector.actions.rma_webhook]"
        )
    return warnings


def _some(names: set[str], shown: int = 3) -> str:
    """``23 rules (a, b, c and 20 more)``, ``1 rule (a)``."""
    first = sorted(names)[:shown]
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return f"{len(names)} rule{'s' if len(names) > 1 else ''} ({', '.join(first)}{more})"


def _secret_file_warnings(files: Sequence[tuple[str, Path | None]]) -> list[str]:
    """A warning for each secret file more people can read (or write) than the service."""
    warnings: list[str] = []
    for key, path in files:
        if path is None:
            continue
        problem = secret_file_problem(path)
        if problem is not None:
            warnings.append(f"{key} {shown_path(path)} {problem}")
    return warnings


def secret_file_problem(path: Path, *, group_may_read: bool = True) -> str | None:
    """Why a secret file is too open, or None when it is not (or cannot be looked at).

    Too open: readable or writable by others, writable by its group, or readable by a group
    other than :data:`SERVICE_GROUP` (``root:fleetwatch`` mode ``0640`` is what docs/deploy.md
    asks for; ``group_may_read=False`` wants ``0600``, as the unit's environment file).
    """
    try:
        info = path.stat()
    except OSError:
        return None  # reading it reports that
    mode = stat.S_IMODE(info.st_mode)
    group = _group_name(info.st_gid)
    others = mode & (stat.S_IROTH | stat.S_IWOTH)
    group_reads = mode & stat.S_IRGRP and (not group_may_read or group != SERVICE_GROUP)
    if not (others or mode & stat.S_IWGRP or group_reads):
        return None
    who = "others" if others else f"group {group}"
    advice = "0640 with group fleetwatch" if group_may_read else "0600"
    return f"is open to {who} (mode {mode:04o}); make it {advice}"


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def _targets(
    files: Sequence[Path], agent: Sequence[Path], collector: Sequence[Path]
) -> tuple[list[tuple[str, Path]], list[str]]:
    targets = [("agent", p) for p in agent] + [("collector", p) for p in collector]
    problems: list[str] = []
    if not (files or targets):
        targets = [(kind, p) for kind, p in DEFAULT_FILES.items() if p.exists()]
        if not targets:
            shown = " or ".join(map(str, DEFAULT_FILES.values()))
            problems.append(f"no config files given, and no {shown}")
    for path in files:
        kinds, problem = file_kinds(path)
        targets.extend((kind, path) for kind in kinds)
        if problem is not None:
            problems.append(problem)
    return targets, problems


def check(  # noqa: PLR0913 - what to check, where secrets come from, where to say it
    files: Sequence[Path],
    *,
    agent: Sequence[Path] = (),
    collector: Sequence[Path] = (),
    env_files: Sequence[Path] = (),
    environ: Mapping[str, str],
    clock: Clock,
    out: TextIO,
    err: TextIO,
    output: str = "table",
) -> int:
    """Check every file; 0 when all are clean, else 2. Each problem is one line on ``err``.

    With ``output="json"`` nothing goes to ``err``: one JSON object on ``out`` says it all
    (``{"ok": ..., "files": [{"path", "kind", "ok", "summary", "problems", "warnings"}],
    "problems": [...], "warnings": [...]}``, the last two for what belongs to no one file: an
    environment file, a file that could not be told apart).

    ``files`` are told apart by their ``[agent]`` and ``[collector]`` tables (a file with both
    is checked as both); ``agent`` and ``collector`` files are taken as that kind. With none at
    all, the default files under /etc/fleetwatch that exist are checked. ``env_files`` add
    variables to ``environ``, as the unit's ``EnvironmentFile=`` does for the collector.
    """
    env = dict(environ)
    problems: list[str] = []
    warnings: list[str] = []
    for path in env_files:
        values, env_problems = read_env_file(path)
        env.update(values)
        problems.extend(env_problems)
        too_open = secret_file_problem(path, group_may_read=False)
        if too_open is not None:
            warnings.append(f"{shown_path(path)}: warning: the environment file {too_open}")
    targets, target_problems = _targets(files, agent, collector)
    problems.extend(target_problems)
    checkers: dict[str, Callable[[Path], Outcome]] = {
        "agent": lambda path: check_agent(path, clock),
        "collector": lambda path: check_collector(path, env, clock),
    }
    checked: list[dict[str, object]] = []
    for kind, path in targets:
        outcome = checkers[kind](path)
        located = [_located(path, p) for p in outcome.problems]
        checked.append(_as_json(kind, path, outcome, located))
        if output == "json":
            continue
        warnings.extend(f"{path}: warning: {w}" for w in outcome.warnings)
        problems.extend(located)
        if not located:
            print(f"{path}: {kind} config OK: {outcome.summary}", file=out)
    failed = bool(problems) or any(not entry["ok"] for entry in checked)
    if output == "json":
        answer = {
            "ok": not failed,
            "files": checked,
            "problems": [_bounded(p) for p in problems],
            "warnings": [_bounded(w) for w in warnings],
        }
        print(json.dumps(answer), file=out)
    else:
        for line in [*warnings, *problems]:
            print(_bounded(line), file=err)
    return 2 if failed else 0


def _as_json(kind: str, path: Path, outcome: Outcome, located: list[str]) -> dict[str, object]:
    return {
        "path": str(path),
        "kind": kind,
        "ok": not located,
        "summary": outcome.summary if not located else "",
        "problems": [_bounded(p) for p in located],
        "warnings": [_bounded(w) for w in outcome.warnings],
    }


def _bounded(line: str) -> str:
    """``line``, cut at :data:`MAX_LINE` characters: the last guard against a value echoed whole."""
    if len(line) <= MAX_LINE:
        return line
    return f"{line[: MAX_LINE - 40]}... ({len(line) - MAX_LINE + 40} characters cut)"


def _validity(material: TlsMaterial | None, key: str, clock: Clock) -> list[str]:
    problem = None if material is None else material.validity_problem(clock.now(), key)
    return [] if problem is None else [problem]


def _transport(cfg: AgentConfig | CollectorConfig) -> str:
    if cfg.tls_cert is not None:
        return "mTLS"
    return "plaintext, insecure = true" if cfg.insecure else "plaintext, loopback"


def _api_changes(cfg: CollectorConfig) -> str:
    """Who may change state through the HTTP API (as :mod:`collector.api.auth` decides)."""
    from collector.config import split_host_port  # noqa: PLC0415
    from fleetwatch.tls import is_loopback  # noqa: PLC0415

    if cfg.api_token_file is not None or cfg.api_token_env is not None:
        return "changes with the API token"
    if is_loopback(split_host_port(cfg.http, "http")[0]):
        return "changes from loopback"
    return "changes refused: no API token"


def _located(path: Path, problem: str) -> str:
    """Name the config file first, once."""
    return problem if problem.startswith(f"{path}:") else f"{path}: {problem}"
