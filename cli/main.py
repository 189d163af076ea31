"""The fleetwatch command: the daemons, the demo, and tools for people.

Daemons: agent, collector (SIGHUP, or systemctl reload, makes them read their files again).
Tools for on-call: nodes [NODE], incidents, events, actions, drains [release NODE],
silence add|list|remove, jobs [JOB [--dump]], preflight run|show|history, evidence NODE (one
archive of what is known about a node, for an RMA or a ticket). Tools for admins:
config check, certs ca|node|collector, rules check|test|eval (eval: what the running rules, or
a new file, would do on the live fleet), scan FILE (hardware faults in a saved log).

Options such as --api, --token-file, -o json|wide|table (--json) and --log-level may come
before or after the command. "fleetwatch COMMAND --help" shows each command's options and
examples.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import select
import signal
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from cli import certs as cli_certs
from cli import conventions
from cli import evidence as cli_evidence
from cli import fleet as cli_fleet
from cli import lifecycle as cli_lifecycle
from cli import preflight as cli_preflight
from cli import reliability as cli_reliability
from cli import scan as cli_scan
from cli.output import watch
from fleetwatch import __version__
from fleetwatch.clock import SystemClock
from fleetwatch.logs import LogFormat, configure_logging, default_log_format
from fleetwatch.reload import Hangups

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine, Sequence
    from typing import Any

    from agent.agent import Agent
    from agent.config import AgentConfig
    from fleetwatch.sd_notify import SdNotifier

log = structlog.get_logger("fleetwatch")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fleetwatch", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"fleetwatch {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    agent = sub.add_parser("agent", help="watch this node's GPUs, NVLinks and IB ports")
    agent.add_argument("--config", type=Path, help="TOML file with an [agent] table")
    agent.add_argument(
        "--collector",
        action="append",
        help="collector host:port, or a comma list; may repeat (default 127.0.0.1:7070)",
    )
    agent.add_argument("--node", help="node name (default: the host name)")
    agent.add_argument("--poll-interval", type=float, dest="poll_interval", help="seconds")
    agent.add_argument("--heartbeat-interval", type=float, dest="heartbeat_interval")
    agent.add_argument("--sysfs-root", dest="sysfs_root", help="default /sys")
    agent.add_argument("--kmsg", dest="kmsg_path", help="default /dev/kmsg; '' turns it off")
    agent.add_argument("--no-udev", dest="udev", action="store_const", const=False)
    agent.add_argument("--xid-catalog", dest="xid_catalog", help="YAML Xid catalog to use")
    agent.add_argument("--state-dir", dest="state_dir", help="default /var/lib/fleetwatch")
    agent.add_argument(
        "--job-socket",
        dest="job_socket",
        help="where training ranks report steps (default /run/fleetwatch/jobs.sock; '' off)",
    )
    agent.add_argument(
        "--simulate",
        action="store_true",
        help="read a simulated 8-GPU node instead of real hardware (for trying things out)",
    )

    collector = sub.add_parser("collector", help="receive agents' streams, journal, export")
    collector.add_argument("--config", type=Path, help="TOML file with a [collector] table")
    collector.add_argument("--listen", help="gRPC address (default 0.0.0.0:7070)")
    collector.add_argument("--http", help="metrics and JSON API address (default 0.0.0.0:9470)")
    collector.add_argument("--journal", help="SQLite journal file")
    collector.add_argument("--heartbeat-interval", type=float, dest="heartbeat_interval")
    collector.add_argument("--missed-heartbeats", type=int, dest="missed_heartbeats")

    demo = sub.add_parser("demo", help="run a simulated cluster with faults, on one machine")
    # --nodes, --duration and --scenario default to the scenario's own values.
    demo.add_argument("--nodes", type=int, help="simulated nodes (default: the scenario's)")
    demo.add_argument(
        "--duration",
        type=float,
        help="seconds; the scenario's timeline is stretched to fit (default: the scenario's)",
    )
    demo.add_argument("--scenario", type=Path, help="scenario file (default: the built-in demo)")
    demo.add_argument("--http-port", type=int, default=0, help="metrics/API port (default: any)")
    demo.add_argument("--workdir", type=Path, help="keep the journal and sysfs trees here")
    demo.add_argument(
        "--preflight",
        action="store_true",
        help="plant problems no counter shows, qualify the cluster and hold them out first",
    )
    _add_tool_parsers(sub)
    conventions.share(parser)
    return parser


def _add_time_filters(parser: argparse.ArgumentParser, what: str) -> None:
    """``--since`` and ``--until``: a duration back from now, an ISO-8601 time, or Unix seconds."""
    forms = "30m, 2h or 1d back from now, 2026-12-02T03:00 (UTC unless a zone is given), or Unix s"
    parser.add_argument("--since", metavar="WHEN", help=f"only {what} from WHEN on: {forms}")
    parser.add_argument("--until", metavar="WHEN", help=f"only {what} up to WHEN")


def _add_jobs_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    jobs = sub.add_parser("jobs", help="training jobs: throughput, MFU, stragglers, drops")
    jobs.add_argument("job", nargs="?", help="one job, rank by rank")
    jobs.add_argument("--node", help="only jobs with a rank on this node")
    jobs.add_argument(
        "--dump",
        action="store_true",
        help="ask the agents for each rank's stack now and group them (a change: sends the token)",
    )


def _add_tool_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    _add_config_parser(sub)
    cli_certs.add_parser(sub)
    cli_scan.add_parser(sub)
    rules = sub.add_parser(
        "rules", help="check rule files, run their tests, dry-run them on the fleet"
    )
    rules_sub = rules.add_subparsers(dest="rules_command", required=True)
    check = rules_sub.add_parser("check", help="validate rule files (exit 1 listing problems)")
    check.add_argument("files", nargs="*", type=Path, help="rule files (default: the built-in)")
    test = rules_sub.add_parser("test", help="run rule unit tests (exit 1 when one fails)")
    test.add_argument("files", nargs="+", type=Path, help="rule test files")
    dry = rules_sub.add_parser(
        "eval",
        help="what rules would do on the running fleet now: what fires, what each action "
        "would meet (run, skipped, deferred, dry run); changes nothing (sends the token)",
    )
    dry.add_argument(
        "--file", type=Path, metavar="RULES.yaml", help="rules to try (default: the running ones)"
    )

    api_help = f"collector API address (default $FLEETWATCH_API or {_default_api()})"
    incidents = sub.add_parser("incidents", help="list open incidents from the collector")
    incidents.add_argument("--all", action="store_true", help="resolved ones too")
    incidents.add_argument("--node", help="only this node's")
    incidents.add_argument("--rule", help="only this rule's")
    _add_time_filters(incidents, "incidents active")
    incidents.add_argument("--limit", type=int, default=100)

    actions = sub.add_parser("actions", help="list actions the collector took, and outcomes")
    actions.add_argument("--node", help="only this node's")
    _add_time_filters(actions, "actions taken")
    actions.add_argument("--limit", type=int, default=100)

    _add_jobs_parser(sub)
    cli_fleet.add_parsers(sub, _default_api(), api_help)
    cli_evidence.add_parser(sub)
    cli_lifecycle.add_parser(sub)
    cli_reliability.add_parser(sub)

    drains = sub.add_parser("drains", help="nodes fleetwatch drained; release one put back")
    drains.add_argument("--node", help="only this node")
    drains_sub = drains.add_subparsers(dest="drains_command")
    release = drains_sub.add_parser(
        "release", help="a node resumed outside fleetwatch: stop counting it toward the cap"
    )
    release.add_argument("node")
    release.add_argument("--reason", default="", help="journaled with the release")

    release.add_argument(
        "--require-preflight",
        action="store_true",
        help="release only if the node passed a quick pre-flight run since it was drained",
    )
    cli_preflight.add_parser(sub, _default_api())

    silence = sub.add_parser("silence", help="silences and maintenance windows: no actions run")
    silence_sub = silence.add_subparsers(dest="silence_command", required=True)
    add = silence_sub.add_parser(
        "add", help="silence a node's rules, a rule everywhere, or one rule on one node"
    )
    add.add_argument("--node", help="node name (with no --rule: every rule on it)")
    add.add_argument("--rule", help="rule name (with no --node: on every node)")
    add.add_argument(
        "--all",
        action="store_true",
        help="every rule on every node (a fleet-wide silence must be asked for by name)",
    )
    add.add_argument(
        "--force", action="store_true", help="a node or rule the collector does not know yet"
    )
    add.add_argument("--duration", required=True, help="how long, e.g. 2h or 30m")
    add.add_argument("--starts-in", default="0s", help="start later: a maintenance window")
    add.add_argument("--reason", default="", help="shown with the silence and its incidents")
    listing = silence_sub.add_parser("list", help="silences not over yet")
    listing.add_argument("--node", help="only silences that cover this node")
    remove = silence_sub.add_parser("remove", help="end a silence now")
    remove.add_argument("id", type=int)


def _add_config_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    config = sub.add_parser("config", help="check agent and collector config files")
    config_sub = config.add_subparsers(dest="config_command", required=True)
    check = config_sub.add_parser(
        "check", help="validate config files as the daemons do at start (exit 2 listing problems)"
    )
    check.add_argument(
        "files",
        nargs="*",
        type=Path,
        help="TOML files, told apart by their [agent] and [collector] tables "
        "(default: /etc/fleetwatch/agent.toml and collector.toml, those that exist)",
    )
    for kind in ("agent", "collector"):
        check.add_argument(
            f"--{kind}",
            action="append",
            type=Path,
            default=[],
            metavar="FILE",
            help=f"check FILE as the {kind}'s config (may repeat)",
        )
    check.add_argument(
        "--env-file",
        action="append",
        type=Path,
        default=[],
        dest="env_files",
        metavar="FILE",
        help="NAME=VALUE lines for secret_env variables (the unit's EnvironmentFile=)",
    )


def _default_api() -> str:
    from cli.api import DEFAULT_API  # noqa: PLC0415

    return os.environ.get("FLEETWATCH_API", DEFAULT_API)


async def _until_signal(
    run: Callable[[], Coroutine[Any, Any, None]], hangups: Hangups | None = None
) -> None:
    """Run ``run`` until it ends or SIGTERM/SIGINT arrives; SIGHUP goes to ``hangups``."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if hangups is not None:
        hangups.install(loop)
    task = asyncio.create_task(run())
    stopper = asyncio.create_task(stop.wait())
    await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    for t in (task, stopper):
        t.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    stopper.cancel()


def _log_setter(fmt: LogFormat) -> Callable[[str], None]:
    """Apply a reloaded log level, keeping the format the command line chose."""

    def set_level(level: str) -> None:
        configure_logging(level, fmt)
        log.info("log_level_set", level=level)

    return set_level


def _agent_status(agent: Agent) -> str | None:
    """What ``systemctl status`` shows for a ready agent (None before its first poll)."""
    if not agent.polls:
        return None
    inv = agent.sampler.inventory
    return (
        f"polling {len(inv.gpus)} GPUs and {len(inv.ib_ports)} IB ports "
        f"every {agent.intervals.poll:g} s"
    )


def _run_agent(args: argparse.Namespace) -> int:
    from agent.config import load_agent_config  # noqa: PLC0415 - keep start-up lean per command
    from agent.main import (  # noqa: PLC0415
        build_agent,
        fd_budget_for_process,
        real_hardware,
        require_nvidia_driver,
    )
    from agent.reload import AgentReloader  # noqa: PLC0415

    hangups = Hangups()
    hangups.catch_early()
    overrides = {
        k: getattr(args, k)
        for k in (
            "collector",
            "node",
            "poll_interval",
            "heartbeat_interval",
            "sysfs_root",
            "kmsg_path",
            "udev",
            "xid_catalog",
            "state_dir",
            "job_socket",
            "log_level",
        )
    }
    clock = SystemClock()
    with tempfile.TemporaryDirectory(prefix="fleetwatch-sim-") as tmp:

        def load() -> AgentConfig:
            cfg = load_agent_config(args.config, overrides)
            return dataclasses.replace(cfg, state_dir=Path(tmp) / "state") if args.simulate else cfg

        cfg = load()
        set_log_level = _log_setter(args.log_format)
        if cfg.log_level is not None and args.log_level is None:  # the file's, not the flag's
            set_log_level(cfg.log_level)
        if args.simulate:
            from agent.sim.cluster import sim_hardware  # noqa: PLC0415
            from agent.sim.hardware import SimNode  # noqa: PLC0415

            hardware = sim_hardware(SimNode(cfg.node, Path(tmp) / "sys", clock))
        else:
            require_nvidia_driver()
            hardware = real_hardware(cfg)
        notifier = _sd_notifier()
        agent = build_agent(
            cfg, hardware, clock, fd_budget=fd_budget_for_process(), notifier=notifier
        )
        reloader = AgentReloader(
            cfg=cfg,
            load=load,
            path=args.config,
            intervals=agent.intervals,
            live=agent.live,
            clock=clock,
            set_log_level=set_log_level,
            notifier=notifier,
            status=lambda: _agent_status(agent),
        )

        async def run() -> None:
            hangups.attach(reloader.reload)
            await agent.run()

        asyncio.run(_until_signal(run, hangups))
    return 0


def _run_collector(args: argparse.Namespace) -> int:
    from collector.main import CollectorService  # noqa: PLC0415
    from collector.reload import ConfigSource  # noqa: PLC0415

    hangups = Hangups()
    hangups.catch_early()
    overrides = {
        k: getattr(args, k)
        for k in ("listen", "http", "journal", "heartbeat_interval", "missed_heartbeats")
    }
    source = ConfigSource(args.config, {**overrides, "log_level": args.log_level})
    cfg = source.load()
    set_log_level = _log_setter(args.log_format)
    if cfg.log_level is not None and args.log_level is None:  # the file's, not the flag's
        set_log_level(cfg.log_level)

    async def serve() -> None:
        service = CollectorService(
            cfg,
            SystemClock(),
            environ=os.environ,
            notifier=_sd_notifier(),
            set_log_level=set_log_level,
        )
        await service.start()
        hangups.attach(lambda: service.reload(source))
        try:
            await service.wait()
        finally:
            await service.stop()

    asyncio.run(_until_signal(serve, hangups))
    return 0


def _sd_notifier() -> SdNotifier:
    """The notify socket and watchdog systemd passes, out of the environment children inherit."""
    from fleetwatch.sd_notify import SdNotifier  # noqa: PLC0415

    return SdNotifier.from_environ(os.environ, os.getpid())


def _run_demo(args: argparse.Namespace) -> int:
    from cli.demo.run import DemoOptions, main  # noqa: PLC0415

    opts = DemoOptions(
        nodes=args.nodes,
        duration=args.duration,
        http_port=args.http_port,
        workdir=args.workdir,
        scenario=args.scenario,
        preflight=args.preflight,
    )
    return main(opts, SystemClock(), sys.stdout)


def _run_rules(args: argparse.Namespace) -> int:
    from cli import rules as cli_rules  # noqa: PLC0415

    if args.rules_command == "eval":
        return cli_rules.evaluate(args.api, args.file, sys.stdout, _token(args), output=args.output)
    run = cli_rules.check if args.rules_command == "check" else cli_rules.test
    return run(args.files, sys.stdout, sys.stderr, output=args.output)


def _run_config(args: argparse.Namespace) -> int:
    from cli import config as cli_config  # noqa: PLC0415

    return cli_config.check(
        args.files,
        agent=args.agent,
        collector=args.collector,
        env_files=args.env_files,
        environ=os.environ,
        clock=SystemClock(),
        out=sys.stdout,
        err=sys.stderr,
        output=args.output,
    )


def _run_api_tool(args: argparse.Namespace) -> int:
    from cli import api as cli_api  # noqa: PLC0415

    out, api, output = sys.stdout, args.api, args.output
    if args.command == "incidents":
        return cli_api.incidents(
            api,
            show_all=args.all,
            limit=args.limit,
            output=output,
            out=out,
            node=args.node,
            rule=args.rule,
            since=args.since,
            until=args.until,
        )
    if args.command == "actions":
        return cli_api.actions(
            api,
            node=args.node,
            limit=args.limit,
            output=output,
            out=out,
            since=args.since,
            until=args.until,
        )
    if args.command == "jobs":
        token = _token(args) if args.dump else None
        return cli_api.jobs(
            api, args.job, output=output, out=out, dump=args.dump, token=token, node=args.node
        )
    if args.command == "drains":
        if args.drains_command == "release":
            return cli_api.release(
                api,
                args.node,
                args.reason,
                out,
                _token(args),
                require_preflight=args.require_preflight,
                output=output,
            )
        return cli_api.drains(api, output=output, out=out, node=args.node)
    return _run_silence(cli_api, args)


def _run_silence(cli_api: Any, args: argparse.Namespace) -> int:  # noqa: ANN401 - the module
    out, api, output = sys.stdout, args.api, args.output
    if args.silence_command == "add":
        if not (args.node or args.rule or args.all):
            msg = (
                "silence add needs --node, --rule or both; --all silences every rule on every "
                "node (say it if that is what you mean)"
            )
            raise ValueError(msg)
        if args.all and (args.node or args.rule):
            msg = "silence add: --all is every rule on every node; leave out --node and --rule"
            raise ValueError(msg)
        body: dict[str, Any] = {
            "node": args.node or "*",
            "rule": args.rule or "*",
            "duration": args.duration,
            "starts_in": args.starts_in,
            "reason": args.reason,
        }
        if args.all:
            body["all"] = True
        if args.force:
            body["force"] = True
        return int(cli_api.add_silence(api, body, out, _token(args), output=output))
    if args.silence_command == "remove":
        return int(cli_api.remove_silence(api, args.id, out, _token(args), output=output))
    return int(cli_api.silences(api, output=output, out=out, node=args.node))


def _run_preflight(args: argparse.Namespace) -> int:
    return cli_preflight.run_command(args, lambda: _token(args), sys.stdout)


def _token(args: argparse.Namespace) -> str | None:
    """The API token for a change: ``--token-file``, else ``$FLEETWATCH_API_TOKEN``."""
    from cli.api import read_token  # noqa: PLC0415

    return read_token(args.token_file, os.environ)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments and run a subcommand; errors in input end with a one-line message."""
    try:
        return _main(argv)
    except BrokenPipeError:
        if not _reader_gone():
            raise
        # `fleetwatch jobs | head -1`: stop quietly, as Unix tools do (the status a shell shows
        # for one that SIGPIPE ended); stdout goes to /dev/null so the exit's flush is quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE


def _main(argv: Sequence[str] | None) -> int:
    from agent.exceptions import AgentError  # noqa: PLC0415
    from cli.api import ApiCallError  # noqa: PLC0415
    from collector.exceptions import CollectorError, JournalUnreachableError  # noqa: PLC0415
    from fleetwatch.wire.validate import WireError  # noqa: PLC0415
    from rules.exceptions import RulesError  # noqa: PLC0415

    parser = _parser()
    args = conventions.parse(parser, argv, os.environ)
    args.log_format = args.log_format or default_log_format(sys.stderr)
    # The demo prints what the collector sees; its logs would only repeat it.
    level = (args.log_level or "info") if args.command in ("agent", "collector") else "error"
    configure_logging(level, args.log_format if args.command != "demo" else "console")
    runners = {
        "agent": _run_agent,
        "collector": _run_collector,
        "demo": _run_demo,
        "rules": _run_rules,
        "config": _run_config,
        "certs": cli_certs.run,
        "scan": cli_scan.run,
        "incidents": _run_api_tool,
        "actions": _run_api_tool,
        "silence": _run_api_tool,
        "drains": _run_api_tool,
        "jobs": _run_api_tool,
        "nodes": cli_fleet.run,
        "events": cli_fleet.run,
        "evidence": cli_evidence.run,
        "lifecycle": cli_lifecycle.run,
        "reliability": cli_reliability.run,
        "preflight": _run_preflight,
    }
    try:
        if args.watch is not None:
            return watch(lambda: runners[args.command](args), args.watch, sys.stdout)
        return runners[args.command](args)
    except JournalUnreachableError as exc:  # no configuration error: systemd tries again
        print(f"fleetwatch {args.command}: {exc}", file=sys.stderr)  # noqa: T201 - for people
        return 1
    except (AgentError, CollectorError, RulesError, WireError, ApiCallError, ValueError) as exc:
        print(f"fleetwatch {args.command}: {exc}", file=sys.stderr)  # noqa: T201 - for people
        return 2
    except KeyboardInterrupt:
        return 130


def _reader_gone() -> bool:
    """Whether stdout is a pipe or socket whose reader has closed it."""
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError):
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


if __name__ == "__main__":
    sys.exit(main())
