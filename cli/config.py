"""``fleetwatch config check``: what the daemons check at start, run before a restart needs it.

An agent file is checked as ``fleetwatch agent`` loads it (the ``[agent]`` table, the Xid
catalog it names, and its TLS files); a collector file as ``fleetwatch collector`` does (the
``[collector]`` table with its actions and jobs, the rule files, the Xid catalog, its TLS files,
every webhook's secret and the API token, each from its file or environment variable). TLS
files must be readable PEM, each key must belong to its certificate, an agent's certificate
must name its node, and a certificate that has expired or is not valid yet is a problem too. A
file passes when the daemon would start with it (and could connect, as far as its certificates
go).

Every problem is listed, not only the first: a collector file whose table does not load is
checked again table by table (the top-level keys, each part of ``actions``, ``ingest``,
``jobs``), so that each table's first problem shows. Values a hostile or broken file holds (a
key of megabytes) are shown cut, never whole. A secret file (API token, journal password,
webhook secret, ``--env-file``) that others can read, that anyone but its owner can write, or
that a group other than the service's (``fleetwatch``) can read is a warning, not a problem.
"""

from __future__ import annotations

import grp
import re
import stat
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from collector.exceptions import CollectorError
from fleetwatch.config_file import not_utf8, shown_key, shown_path
from rules.exceptions import RulesError

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import TextIO

    from agent.config import AgentConfig
    from collector.config import CollectorConfig
    from fleetwatch.clock import Clock
    from fleetwatch.tls import TlsMaterial

KINDS: Final = ("agent", "collector")
DEFAULT_FILES: Final = {kind: Path(f"/etc/fleetwatch/{kind}.toml") for kind in KINDS}
_ENV_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SERVICE_GROUP: Final = "fleetwatch"  # the units' Group=; it may read the secret files
MAX_LINE: Final = 2_000  # the longest line the check prints; longer ones are cut
_PARTS: Final = ("actions", "ingest", "jobs")  # sub-tables of [collector] checked on their own


@dataclass(frozen=True, slots=True)
class Outcome:
    """What checking one file as one kind found: a summary when clean, else the problems.

    Warnings (a secret file others can read) are printed either way and fail nothing.
    """

    summary: str
    problems: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()


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
        return [], f"{shown_path(path)}: invalid TOML: {str(exc)[:200]}"
    kinds: list[str] = [kind for kind in KINDS if isinstance(raw.get(kind), dict)]
    if not kinds:
        return [], (
            f"{path}: has neither an [agent] nor a [collector] table; "
            "name its kind with --agent FILE or --collector FILE"
        )
    return kinds, None


def _catalog_and_tls(
    catalog: Path | None,
    material: Callable[[], TlsMaterial | None],
    error: type[Exception],
    what: str,
    clock: Clock,
) -> list[str]:
    """Problems loading the Xid catalog and the TLS files (``error`` is the daemon's own)."""
    from rules.xid_catalog import load_catalog  # noqa: PLC0415

    problems: list[str] = []
    try:
        load_catalog(catalog)
    except RulesError as exc:
        problems.append(str(exc))
    try:
        loaded = material()
    except error as exc:
        problems.append(str(exc))
    else:
        problems.extend(_validity(loaded, f"{what}: tls_cert", clock))
    return problems


def check_agent(path: Path, clock: Clock) -> Outcome:
    """Load ``path`` as the agent does at start; certificates are checked for ``clock``'s now."""
    from agent.bmc_config import open_bmc  # noqa: PLC0415
    from agent.config import load_agent_config  # noqa: PLC0415 - each kind loads its own code
    from agent.exceptions import AgentError  # noqa: PLC0415
    from agent.link.tls import tls_material  # noqa: PLC0415

    try:
        cfg = load_agent_config(path, {})
    except AgentError as exc:
        return Outcome("", (str(exc),))
    problems = _catalog_and_tls(
        cfg.xid_catalog, lambda: tls_material(cfg), AgentError, "agent config", clock
    )
    warnings: list[str] = []
    if cfg.bmc is not None:  # its credentials are read as at start (the BMC is not asked)
        try:
            open_bmc(cfg.bmc)
        except AgentError as exc:
            problems.append(str(exc))
        warnings = _secret_file_warnings([("[agent.bmc] password_file", cfg.bmc.password_file)])
    bmc = f"BMC {cfg.bmc.protocol} {cfg.bmc.address}" if cfg.bmc else "BMC off"
    summary = (
        f"node {cfg.node}, collector{'s' if len(cfg.targets) > 1 else ''} "
        f"{', '.join(cfg.targets)} ({_transport(cfg)}), "
        f"poll every {cfg.poll_interval:g} s, "
        f"kernel log {cfg.kmsg_path or 'off'}, GPU resets {'on' if cfg.gpu_reset else 'off'}, "
        f"{bmc}"
    )
    return Outcome(summary, tuple(problems), tuple(warnings))


def check_collector(path: Path, environ: Mapping[str, str], clock: Clock) -> Outcome:
    """Load ``path`` as the collector does at start, with ``environ`` for webhook secrets."""
    from collector.ingest.tls import tls_material  # noqa: PLC0415
    from rules.gates_file import GatesFileError, load_gates  # noqa: PLC0415
    from rules.loader import load_rules  # noqa: PLC0415 - CEL loads only when needed

    cfg, problems = _load_collector(path)
    if cfg is None:
        return Outcome("", tuple(problems))
    rule_count = 0
    try:
        rule_count = len(load_rules(list(cfg.rules)).rules)
    except RulesError as exc:
        problems.extend(f"rules: {line}" for line in str(exc).splitlines())
    try:
        load_gates(cfg.preflight_gates)
    except GatesFileError as exc:
        problems.extend(f"preflight_gates: {line}" for line in str(exc).splitlines())
    problems += _catalog_and_tls(
        cfg.xid_catalog,
        lambda: tls_material(cfg.server_tls()),
        CollectorError,
        "collector config",
        clock,
    )
    actions = cfg.actions
    hooks = [(f"actions.notify.{shown_key(name)}", hook) for name, hook in actions.notify.items()]
    if actions.drain_webhook is not None:
        hooks.insert(0, ("actions.drain_webhook", actions.drain_webhook))
    for key, hook in hooks:
        try:
            hook.sender(clock, key, environ)
        except CollectorError as exc:
            problems.append(str(exc))
    for secret in (cfg.api_token, cfg.journal_config().password):
        try:
            secret(environ)
        except CollectorError as exc:
            problems.append(str(exc))
    warnings = _secret_file_warnings(
        [
            ("api_token_file", cfg.api_token_file),
            ("journal_password_file", cfg.journal_password_file),
            *((f"{key}.secret_file", hook.secret_file) for key, hook in hooks),
        ]
    )
    drainers = {"slurm": actions.slurm.enabled, "webhook": actions.drain_webhook is not None}
    summary = (
        f"listen {cfg.listen} ({_transport(cfg)}), http {cfg.http} ({_api_changes(cfg)}), "
        f"journal {cfg.journal_config().where()}, "
        f"{rule_count} rules{'' if cfg.rules else ' (built-in)'}, "
        f"drains via {' and '.join(k for k, on in drainers.items() if on) or 'nothing'}, "
        f"{len(actions.notify)} notify channels"
        f"{', requeues jobs via slurm' if actions.slurm.requeue else ''}"
        f"{', dry run' if actions.safety.dry_run else ''}"
    )
    return Outcome(summary, tuple(problems), tuple(warnings))


def _load_collector(path: Path) -> tuple[CollectorConfig | None, list[str]]:
    """The config as the collector loads it, or as much of it as loads, with every problem.

    The loader stops at its first problem. Then the table is read again and each part checked
    on its own (the top-level keys, each of ``_PARTS``; ``actions`` channel by channel), so a
    mistake in ``[collector.jobs]`` does not hide one in ``[collector.actions]``. The config
    returned then has the parts that passed (None when the top level fails), for the checks
    that follow.
    """
    from collector.config import (  # noqa: PLC0415
        CollectorConfig,
        load_collector_config,
        parse_ingest,
        parse_jobs,
    )
    from collector.exceptions import ConfigError  # noqa: PLC0415
    from fleetwatch.config_file import merge_config  # noqa: PLC0415

    try:
        return load_collector_config(path, {}), []
    except CollectorError as exc:
        first = str(exc)
    try:
        values = merge_config(path, "collector", {}, CollectorConfig, ConfigError)
    except CollectorError:
        return None, [first]  # the file or its keys: there are no parts to tell apart
    parts = {key: values.pop(key) for key in _PARTS if key in values}
    checks: dict[str, Callable[[object], object]] = {"ingest": parse_ingest, "jobs": parse_jobs}
    problems: list[str] = []
    for key, raw in parts.items():
        found = _actions_problems(raw) if key == "actions" else _problem(checks[key], raw)
        if found:
            problems.extend(found)
        else:
            values[key] = raw
    cfg = None
    try:
        cfg = load_collector_config(None, values)
    except CollectorError as exc:
        problems.insert(0, str(exc))
    if first not in problems:
        problems.insert(0, first)
    return cfg, list(dict.fromkeys(problems))


def _actions_problems(raw: object) -> list[str]:
    """Problems of ``[collector.actions]``: its own keys, the drain webhook, each channel."""
    from collector.actions.config import parse_actions  # noqa: PLC0415

    if not isinstance(raw, dict):
        return _problem(parse_actions, raw)
    table: dict[str, Any] = dict(raw)
    hooks = {"drain_webhook": table.pop("drain_webhook", None)}
    notify = table.pop("notify", None)
    problems = _problem(parse_actions, table)
    if hooks["drain_webhook"] is not None:
        problems += _problem(parse_actions, hooks)
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
) -> int:
    """Check every file; 0 when all are clean, else 2. Each problem is one line on ``err``.

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
    for kind, path in targets:
        outcome = checkers[kind](path)
        warnings.extend(f"{path}: warning: {w}" for w in outcome.warnings)
        if outcome.problems:
            problems.extend(_located(path, p) for p in outcome.problems)
        else:
            print(f"{path}: {kind} config OK: {outcome.summary}", file=out)
    for line in [*warnings, *problems]:
        print(_bounded(line), file=err)
    return 2 if problems else 0


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
