"""The options every ``fleetwatch`` command takes the same way, wherever they are typed.

``--log-level`` and ``--log-format`` go with every command; ``--api`` and ``--token-file`` with
every command that talks to the collector's API; ``-o json|wide|table`` (``--json`` is
``-o json``) with every command that prints something a script may read. Each may come before
the command (``fleetwatch --api URL incidents``) or anywhere after it (``fleetwatch incidents
--node n1 -o json``): :func:`share` adds them to every parser with no default, and :func:`finish`
fills in the defaults after parsing, so that a value typed before the command is not replaced
by a subcommand's default.

:func:`parse` also answers an option no command knows with the usage of the command it was
typed for (argparse alone answers with the top-level usage), and :data:`EXAMPLES` gives each
command's help a few examples.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Sequence

__all__ = ["API_COMMANDS", "EXAMPLES", "OUTPUTS", "WATCHED", "finish", "parse", "share"]

OUTPUTS: Final = ("table", "wide", "json")
# Commands that talk to the collector's API (their subcommands too).
API_COMMANDS: Final = frozenset(
    {
        "incidents",
        "actions",
        "jobs",
        "nodes",
        "events",
        "drains",
        "silence",
        "preflight",
        "lifecycle",
        "reliability",
    }
)
# Commands whose output a script may read: API_COMMANDS and these.
_OUTPUT_ALSO: Final = frozenset({"scan", "rules", "config"})
# Command paths outside API_COMMANDS that talk to the API too.
_API_ALSO: Final = frozenset({("rules", "eval"), ("evidence",)})
# List commands that take --watch (command path as typed).
WATCHED: Final = frozenset(
    {
        ("incidents",),
        ("actions",),
        ("jobs",),
        ("nodes",),
        ("events",),
        ("drains",),
        ("silence", "list"),
        ("preflight", "history"),
    }
)
DEFAULT_WATCH_S: Final = 2.0

EXAMPLES: Final[dict[tuple[str, ...], str]] = {
    ("incidents",): """\
  fleetwatch incidents                        open incidents, newest first
  fleetwatch incidents --node node-07 --since 6h --all
  fleetwatch incidents --rule gpu_lost -o wide
  fleetwatch incidents -o json | jq '.incidents[].target'
  fleetwatch incidents --watch                every 2 s until Ctrl-C""",
    ("actions",): """\
  fleetwatch actions --node node-07           what fleetwatch did to node-07
  fleetwatch actions --since 2026-12-02T03:00 --until 2026-12-02T04:00""",
    ("jobs",): """\
  fleetwatch jobs                             every job: tokens/s, MFU, stragglers
  fleetwatch jobs 4242                        one job, rank by rank
  fleetwatch jobs 4242 --dump                 gather its ranks' stacks now""",
    ("nodes",): """\
  fleetwatch nodes                            every node, with what is wrong
  fleetwatch nodes node-07                    incidents, drain, events, actions, GPUs""",
    ("events",): """\
  fleetwatch events --node node-07 --since 1h
  fleetwatch events --kind xid --limit 200 -o json""",
    ("lifecycle",): """\
  fleetwatch lifecycle node-07                where node-07 stands, and every move it made
  fleetwatch lifecycle node-07 repair --reason "GPU 3 swap, ticket 4411"
  fleetwatch lifecycle node-07 repaired       released if fleetwatch drained it
  fleetwatch lifecycle node-07 rma --reason 'board sent back'""",
    ("reliability",): """\
  fleetwatch reliability                      the fleet's last 30 days, and its lemon nodes
  fleetwatch reliability node-07 --window 7d  one node's times between incidents and repairs
  fleetwatch reliability -o json | jq .fleet.gpu_time_lost_ratio""",
    ("evidence",): """\
  fleetwatch evidence node-07                 ./fleetwatch-evidence-node-07-<UTC time>.tar.gz
  fleetwatch evidence node-07 --since 30d -o node-07-rma.tar.gz
  fleetwatch evidence node-07 -o - | tar tzf -""",
    ("drains",): """\
  fleetwatch drains                           what fleetwatch holds drained
  fleetwatch drains release node-07 --reason 'cable replaced' --require-preflight""",
    ("silence",): """\
  fleetwatch silence add --node node-07 --duration 2h --reason 'RMA #123'
  fleetwatch silence add --rule ib_link_flapping --duration 30m --starts-in 1h
  fleetwatch silence list
  fleetwatch silence remove 12""",
    ("preflight",): """\
  fleetwatch preflight run --level quick --dry-run
  fleetwatch preflight run --nodes node-01,node-02
  fleetwatch preflight run --node node-03 --node node-04
  fleetwatch preflight show""",
    ("silence", "add"): """\
  fleetwatch silence add --node node-07 --duration 2h --reason 'RMA #123'
  fleetwatch silence add --rule ib_link_flapping --duration 30m --starts-in 1h
  fleetwatch silence add --node node-07 --rule gpu_thermal_slowdown --duration 1d
  fleetwatch silence add --all --duration 15m --reason 'fabric maintenance'""",
    ("silence", "list"): """\
  fleetwatch silence list --node node-07      the silences that cover node-07""",
    ("silence", "remove"): """\
  fleetwatch silence remove 12""",
    ("drains", "release"): """\
  fleetwatch drains release node-07 --reason 'GPU 3 reseated'
  fleetwatch drains release node-07 --require-preflight""",
    ("preflight", "run"): """\
  fleetwatch preflight run --dry-run          the plan and how long it would take
  fleetwatch preflight run --level standard""",
    ("preflight", "show"): """\
  fleetwatch preflight show                   the newest run
  fleetwatch preflight show 17 -o json""",
    ("preflight", "history"): """\
  fleetwatch preflight history --node node-07""",
    ("rules", "check"): """\
  fleetwatch rules check /etc/fleetwatch/rules.d/*.yaml
  fleetwatch rules check new.yaml -o json""",
    ("rules", "eval"): """\
  fleetwatch rules eval                       the running rules, on the fleet now
  fleetwatch rules eval --file new.yaml       a new rule file, before it is installed""",
    ("rules", "test"): """\
  fleetwatch rules test rules/default_test.yaml
  fleetwatch rules test my_rules_test.yaml -o json""",
    ("config", "check"): """\
  fleetwatch config check /etc/fleetwatch/collector.toml
  fleetwatch config check --agent node.toml --collector collector.toml""",
    ("rules",): """\
  fleetwatch rules check                      the built-in rules
  fleetwatch rules check /etc/fleetwatch/rules.d/*.yaml
  fleetwatch rules test rules/default_test.yaml""",
    ("config",): """\
  fleetwatch config check                     /etc/fleetwatch/agent.toml and collector.toml
  fleetwatch config check --collector new.toml --env-file /etc/fleetwatch/env""",
    ("demo",): """\
  fleetwatch demo                             the built-in scenario
  fleetwatch demo --nodes 16 --duration 60
  fleetwatch demo --preflight""",
    ("agent",): """\
  fleetwatch agent --config /etc/fleetwatch/agent.toml
  fleetwatch agent --simulate --collector 127.0.0.1:7070""",
    ("collector",): """\
  fleetwatch collector --config /etc/fleetwatch/collector.toml""",
    ("certs",): """\
  fleetwatch certs ca --out ca/
  fleetwatch certs node node-07 --ca ca/ --out node-07/""",
}


def _subparsers(
    parser: argparse.ArgumentParser,
) -> argparse._SubParsersAction[argparse.ArgumentParser] | None:
    for action in parser._actions:  # noqa: SLF001 - argparse keeps no public list
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            return action
    return None


def _walk(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every parser under ``parser`` (itself first), with the command path that reaches it."""
    yield path, parser
    sub = _subparsers(parser)
    if sub is not None:
        for name, child in sub.choices.items():
            yield from _walk(child, (*path, name))


def _option(parser: argparse.ArgumentParser, flag: str) -> argparse.Action | None:
    return parser._option_string_actions.get(flag)  # noqa: SLF001


def _add(parser: argparse.ArgumentParser, *, api: bool, output: bool) -> None:
    """The shared options on one parser, none with a default (:func:`finish` fills them in)."""
    quiet = argparse.SUPPRESS
    wanted: list[tuple[tuple[str, ...], dict[str, object]]] = [
        (
            ("--log-level",),
            {"help": "debug, info, warning or error (default: the config's, or info)"},
        ),
        (
            ("--log-format",),
            {
                "choices": ("json", "console"),
                "help": "json for journald/log shippers, console for a terminal "
                "(default: console when stderr is a terminal, json otherwise)",
            },
        ),
    ]
    if api:
        wanted += [
            (
                ("--api",),
                {
                    "help": "collector API address (default $FLEETWATCH_API or http://127.0.0.1:9470)"
                },
            ),
            (
                ("--token-file",),
                {
                    "metavar": "FILE",
                    "type": Path,
                    "help": "file holding the collector's API token, sent with changes "
                    "(default: $FLEETWATCH_API_TOKEN)",
                },
            ),
        ]
    if output:
        wanted += [
            (
                ("-o", "--output"),
                {
                    "choices": OUTPUTS,
                    "help": "table (default), wide (every column, nothing cut) or json",
                },
            ),
            (("--json",), {"action": "store_true", "help": "the same as -o json"}),
        ]
    for flags, options in wanted:
        existing = _option(parser, flags[-1])
        if existing is not None:
            existing.default = quiet
            continue
        parser.add_argument(*flags, default=quiet, **options)  # type: ignore[arg-type]


def share(parser: argparse.ArgumentParser) -> None:
    """Give every parser under ``parser`` the shared options, and each command its examples."""
    for path, each in _walk(parser):
        # No abbreviations: "--node" must never be read as "--nodes" (or, with a new option
        # some day, as something else than it was yesterday).
        each.allow_abbrev = False
        command = path[0] if path else ""
        api = not path or command in API_COMMANDS or path in _API_ALSO
        output = not path or command in API_COMMANDS or command in _OUTPUT_ALSO
        _add(each, api=api, output=output)
        if path in WATCHED:
            each.add_argument(
                "--watch",
                nargs="?",
                type=float,
                const=DEFAULT_WATCH_S,
                default=None,
                metavar="SECONDS",
                help=f"print again every SECONDS (default {DEFAULT_WATCH_S:g}) until Ctrl-C",
            )
        examples = EXAMPLES.get(path)
        if examples:
            each.epilog = f"examples:\n{examples}"
            each.formatter_class = argparse.RawDescriptionHelpFormatter


def finish(args: argparse.Namespace, environ: Mapping[str, str]) -> argparse.Namespace:
    """Fill in the shared options' defaults; ``output`` is ``json`` when ``--json`` was given."""
    from cli.api import DEFAULT_API  # noqa: PLC0415 - keep start-up lean

    defaults: dict[str, object] = {
        "log_level": None,
        "log_format": None,
        "api": environ.get("FLEETWATCH_API", DEFAULT_API),
        "token_file": None,
        "output": None,
        "json": False,
    }
    for name, value in defaults.items():
        if not hasattr(args, name):
            setattr(args, name, value)
    if args.json:
        args.output = "json"
    args.output = args.output or "table"
    args.json = args.output == "json"
    if not hasattr(args, "watch"):
        args.watch = None
    return args


def chosen(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The deepest parser of the command typed (``fleetwatch silence add`` -> ``add``'s)."""
    while (sub := _subparsers(parser)) is not None:
        name = getattr(args, sub.dest, None) if sub.dest != argparse.SUPPRESS else None
        if name is None or name not in sub.choices:
            break
        parser = sub.choices[name]
    return parser


def command_path(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[str, ...]:
    """The command as typed, e.g. ``("silence", "list")``."""
    path: list[str] = []
    while (sub := _subparsers(parser)) is not None:
        name = getattr(args, sub.dest, None)
        if name is None or name not in sub.choices:
            break
        path.append(name)
        parser = sub.choices[name]
    return tuple(path)


def parse(
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    environ: Mapping[str, str],
) -> argparse.Namespace:
    """Parse ``argv``; an unknown argument is answered with its command's usage (exit 2)."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        chosen(parser, args).error(f"unrecognized arguments: {' '.join(extra)}")
    return finish(args, environ)
