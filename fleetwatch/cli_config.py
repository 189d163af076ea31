"""``fleetwatch config check``: what the daemons check at start, run before a restart needs it.

An agent file is checked as ``fleetwatch agent`` loads it (the ``[agent]`` table, the Xid
catalog it names, and its TLS files); a collector file as ``fleetwatch collector`` does (the
``[collector]`` table with its actions and jobs, the rule files, the Xid catalog, its TLS files,
every webhook's secret and the API token, each from its file or environment variable). TLS
files must be readable PEM, each key must belong to its certificate, an agent's certificate
must name its node, and a certificate that has expired or is not valid yet is a problem too. A
file passes when the daemon would start with it (and could connect, as far as its certificates
go).
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from collector.exceptions import CollectorError
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


@dataclass(frozen=True, slots=True)
class Outcome:
    """What checking one file as one kind found: a summary when clean, else the problems."""

    summary: str
    problems: tuple[str, ...] = ()


def read_env_file(path: Path) -> tuple[dict[str, str], list[str]]:
    """Read ``KEY=VALUE`` lines as systemd's ``EnvironmentFile=`` does (the simple subset).

    Blank lines and lines starting with ``#`` or ``;`` are skipped; a value in matching quotes
    loses them. Returns the variables and the problems, which name lines, never values.
    """
    try:
        text = path.read_text("utf-8")
    except OSError as exc:
        return {}, [f"{path}: cannot read the environment file: {exc.strerror}"]
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
        return [], f"{path}: cannot read: {exc.strerror}"
    except tomllib.TOMLDecodeError as exc:
        return [], f"{path}: invalid TOML: {exc}"
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
    from agent.config import load_agent_config  # noqa: PLC0415 - each kind loads its own code
    from agent.exceptions import AgentError  # noqa: PLC0415
    from agent.tls import tls_material  # noqa: PLC0415

    try:
        cfg = load_agent_config(path, {})
    except AgentError as exc:
        return Outcome("", (str(exc),))
    problems = _catalog_and_tls(
        cfg.xid_catalog, lambda: tls_material(cfg), AgentError, "agent config", clock
    )
    summary = (
        f"node {cfg.node}, collector{'s' if len(cfg.targets) > 1 else ''} "
        f"{', '.join(cfg.targets)} ({_transport(cfg)}), "
        f"poll every {cfg.poll_interval:g} s, "
        f"kernel log {cfg.kmsg_path or 'off'}, GPU resets {'on' if cfg.gpu_reset else 'off'}"
    )
    return Outcome(summary, tuple(problems))


def check_collector(path: Path, environ: Mapping[str, str], clock: Clock) -> Outcome:
    """Load ``path`` as the collector does at start, with ``environ`` for webhook secrets."""
    from collector.config import load_collector_config  # noqa: PLC0415
    from collector.ingest.tls import tls_material  # noqa: PLC0415
    from rules.loader import load_rules  # noqa: PLC0415 - CEL loads only when needed

    try:
        cfg = load_collector_config(path, {})
    except CollectorError as exc:
        return Outcome("", (str(exc),))
    problems: list[str] = []
    rule_count = 0
    try:
        rule_count = len(load_rules(list(cfg.rules)).rules)
    except RulesError as exc:
        problems.extend(f"rules: {line}" for line in str(exc).splitlines())
    problems += _catalog_and_tls(
        cfg.xid_catalog,
        lambda: tls_material(cfg.server_tls()),
        CollectorError,
        "collector config",
        clock,
    )
    actions = cfg.actions
    hooks = [(f"actions.notify.{name}", hook) for name, hook in actions.notify.items()]
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
    drainers = {"slurm": actions.slurm.enabled, "webhook": actions.drain_webhook is not None}
    summary = (
        f"listen {cfg.listen} ({_transport(cfg)}), http {cfg.http} ({_api_changes(cfg)}), "
        f"journal {cfg.journal_config().where()}, "
        f"{rule_count} rules{'' if cfg.rules else ' (built-in)'}, "
        f"drains via {' and '.join(k for k, on in drainers.items() if on) or 'nothing'}, "
        f"{len(actions.notify)} notify channels{', dry run' if actions.safety.dry_run else ''}"
    )
    return Outcome(summary, tuple(problems))


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
    for path in env_files:
        values, env_problems = read_env_file(path)
        env.update(values)
        problems.extend(env_problems)
    targets, target_problems = _targets(files, agent, collector)
    problems.extend(target_problems)
    checkers: dict[str, Callable[[Path], Outcome]] = {
        "agent": lambda path: check_agent(path, clock),
        "collector": lambda path: check_collector(path, env, clock),
    }
    for kind, path in targets:
        outcome = checkers[kind](path)
        if outcome.problems:
            problems.extend(_located(path, p) for p in outcome.problems)
        else:
            print(f"{path}: {kind} config OK: {outcome.summary}", file=out)
    for problem in problems:
        print(problem, file=err)
    return 2 if problems else 0


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
