import dataclasses
from pathlib import Path

import pytest
from prometheus_client.registry import CollectorRegistry

from collector.actions.actuators import Actuators, LiveActuators
from collector.actions.ports import ActionOutcome
from collector.config import CollectorConfig, load_collector_config
from collector.incidents.evaluator import Evaluator
from collector.model.fleet import FleetModel
from collector.reload import (
    LIVE_KEYS,
    RESTART_KEYS,
    ConfigSource,
    ReloadCollector,
    ReloadError,
    read_candidate,
    rule_changes,
    successor,
)
from fleetwatch.reload import ReloadTally
from fleetwatch.testing import FakeClock
from rules.engine import Phase
from rules.loader import RulesFileError, load_rules, parse_rules
from rules.xid_catalog import load_catalog

FLEET_RULES = """\
version: 1
rules:
  - name: fleet_empty
    scope: fleet
    when: 'fleet.nodes == 0'
    severity: info
  - name: fleet_small
    scope: fleet
    when: 'fleet.nodes < 5'
    severity: info
"""


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.fixture
def files(tmp_path: Path) -> tuple[ConfigSource, Path]:
    """A collector config naming one rule file; the source reads it as at start."""
    rules = write(tmp_path / "site.yaml", FLEET_RULES)
    config = write(
        tmp_path / "collector.toml",
        f'[collector]\nlisten = "127.0.0.1:0"\nhttp = "127.0.0.1:0"\n'
        f'journal = "{tmp_path / "j.db"}"\nrules = ["{rules}"]\nrules_interval = 1\n',
    )
    return ConfigSource(config, {}), rules


def running(source: ConfigSource) -> CollectorConfig:
    return source.load()


class TestKeys:
    def test_every_key_is_live_or_needs_a_restart(self):
        """Each config key is decided: swapped by a reload, or kept until a restart."""
        names = {f.name for f in dataclasses.fields(CollectorConfig)}
        assert set(LIVE_KEYS) | set(RESTART_KEYS) == names
        assert not set(LIVE_KEYS) & set(RESTART_KEYS)
        assert {"listen", "http", "journal", "tls_cert", "insecure"} <= set(RESTART_KEYS)


class TestReadCandidate:
    def test_valid_files_give_the_new_rules(self, files):
        """A good config and rule file come back checked, with the new rule in."""
        source, rules = files
        now = running(source)
        write(rules, FLEET_RULES.replace("fleet_small", "fleet_tiny"))
        candidate = read_candidate(source, now, {}, FakeClock())
        assert [r.name for r in candidate.rules.rules] == ["fleet_empty", "fleet_tiny"]
        assert candidate.needs_restart == {}
        assert candidate.cfg == now

    def test_restart_only_keys_keep_their_running_values(self, files):
        """A changed listen address is reported with both values and not taken; a changed
        live key is."""
        source, _ = files
        now = running(source)
        text = source.path.read_text()
        write(source.path, text.replace('http = "127.0.0.1:0"', 'http = "127.0.0.1:9999"'))
        write(
            source.path, source.path.read_text().replace("rules_interval = 1", "rules_interval = 3")
        )
        candidate = read_candidate(source, now, {}, FakeClock())
        assert candidate.needs_restart == {"http": ("127.0.0.1:0", "127.0.0.1:9999")}
        assert candidate.cfg.http == "127.0.0.1:0"
        assert candidate.cfg.rules_interval == 3.0

    def test_a_bad_config_value_names_its_line(self, files):
        """A value the loader refuses comes back with the line that set it."""
        source, _ = files
        now = running(source)
        write(source.path, source.path.read_text() + 'missed_heartbeats = "three"\n')
        with pytest.raises(ReloadError) as caught:
            read_candidate(source, now, {}, FakeClock())
        [problem] = caught.value.problems
        assert (problem.file, problem.line) == (str(source.path), 7)
        assert "missed_heartbeats must be an integer" in problem.message

    def test_a_toml_syntax_error_names_line_and_column(self, files):
        """Broken TOML: the line and column tomllib found."""
        source, _ = files
        now = running(source)
        write(source.path, source.path.read_text() + "rules_interval = \n")
        with pytest.raises(ReloadError) as caught:
            read_candidate(source, now, {}, FakeClock())
        [problem] = caught.value.problems
        assert (problem.line, problem.column) == (7, 18)
        assert str(problem).startswith(f"{source.path}:7:18: ")

    def test_bad_cel_in_a_rule_names_the_rule_and_its_line(self, files):
        """A condition that does not compile: the rule file, the line of `when`, the rule."""
        source, rules = files
        now = running(source)
        write(rules, FLEET_RULES.replace("'fleet.nodes < 5'", "'fleet.nodes <'"))
        with pytest.raises(ReloadError) as caught:
            read_candidate(source, now, {}, FakeClock())
        [problem] = caught.value.problems
        assert (problem.file, problem.line) == (str(rules), 9)
        assert problem.message.startswith("rule fleet_small: bad condition:")

    def test_broken_yaml_names_line_and_column(self, files):
        """A rule file that is not YAML: where the parser stopped."""
        source, rules = files
        now = running(source)
        write(rules, "version: 1\nrules:\n  - name: [x\n")
        with pytest.raises(ReloadError) as caught:
            read_candidate(source, now, {}, FakeClock())
        [problem] = caught.value.problems
        assert (problem.line, problem.column) == (4, 1)
        assert "not valid YAML" in problem.message

    def test_a_bad_xid_catalog_entry_names_its_line(self, files, tmp_path: Path):
        """The catalog's checks name the Xid; the problem points at its line."""
        source, _ = files
        now = running(source)
        catalog = write(
            tmp_path / "xids.yaml",
            "version: 1\nxids:\n  13: {name: a, class: application, action: IGNORE, fatal: false}\n"
            "  79: {name: b, class: buss, action: RESTART_BM, fatal: true}\n",
        )
        write(source.path, source.path.read_text() + f'xid_catalog = "{catalog}"\n')
        with pytest.raises(ReloadError) as caught:
            read_candidate(source, now, {}, FakeClock())
        [problem] = caught.value.problems
        assert (problem.file, problem.line) == (str(catalog), 4)
        assert "Xid 79 class 'buss'" in problem.message

    def test_every_problem_of_every_file_is_listed(self, files, tmp_path: Path):
        """A bad rule and a catalog that is not YAML: both, each with its file."""
        source, rules = files
        now = running(source)
        write(rules, FLEET_RULES.replace("severity: info\n  - name", "severity: loud\n  - name"))
        catalog = write(tmp_path / "xids.yaml", "version: 1\nxids: {13: [\n")
        write(source.path, source.path.read_text() + f'xid_catalog = "{catalog}"\n')
        with pytest.raises(ReloadError) as caught:
            read_candidate(source, now, {}, FakeClock())
        where = [(p.file, p.line) for p in caught.value.problems]
        assert where == [(str(rules), 6), (str(catalog), 3)]

    def test_a_missing_webhook_secret_fails_the_reload(self, files):
        """Secrets are read before anything changes: an unset variable is a problem, at the
        line of the webhook's table."""
        source, _ = files
        now = running(source)
        write(
            source.path,
            source.path.read_text()
            + '\n[collector.actions.notify.pager]\nurl = "http://127.0.0.1:9/h"\n'
            'secret_env = "PAGER_SECRET"\n',
        )
        with pytest.raises(ReloadError) as caught:
            read_candidate(source, now, {}, FakeClock())
        [problem] = caught.value.problems
        assert problem.line == 10  # the secret_env line
        assert "PAGER_SECRET is not set" in problem.message
        candidate = read_candidate(source, now, {"PAGER_SECRET": "s3cret"}, FakeClock())
        assert candidate.actuators.notifier is not None

    def test_a_file_only_a_restart_reads_must_still_be_good(self, files, tmp_path: Path):
        """An API token file that cannot be read fails the reload (a restart would fail on
        it), though a reload would not use it."""
        source, _ = files
        now = running(source)
        missing = tmp_path / "api.token"
        write(source.path, source.path.read_text() + f'api_token_file = "{missing}"\n')
        with pytest.raises(ReloadError) as caught:
            read_candidate(source, now, {}, FakeClock())
        [problem] = caught.value.problems
        assert problem.line == 7
        assert "api_token_file" in problem.message
        write(missing, "t0ken\n")
        candidate = read_candidate(source, now, {}, FakeClock())
        assert candidate.needs_restart == {"api_token_file": (None, missing)}


class TestLoaderPositions:
    def test_yaml_errors_have_a_column_and_top_keys_their_line(self):
        """Syntax errors keep YAML's column; a bad version or rules key points at its line."""
        with pytest.raises(RulesFileError) as caught:
            parse_rules("version: 1\nrules:\n  - {name: x\n", "a.yaml")
        [problem] = caught.value.problems
        assert (problem.line, problem.column) == (4, 1)
        for text, line in (("# c\nversion: 2\nrules: []\n", 2), ("version: 1\n\nrules: 3\n", 3)):
            with pytest.raises(RulesFileError) as caught:
                parse_rules(text, "a.yaml")
            assert [p.line for p in caught.value.problems] == [line]


def evaluator(rules_text: str, clock: FakeClock) -> Evaluator:
    return Evaluator(
        rules=parse_rules(rules_text, "site.yaml"),
        fleet=FleetModel(),
        catalog=load_catalog(),
        clock=clock,
    )


class TestSuccessor:
    def test_open_incidents_of_rules_still_there_carry_on(self):
        """A reload that drops one rule and adds another: the incident of the rule that stays
        keeps its id and phase; the dropped rule's incident ends with it."""
        clock = FakeClock()
        old = evaluator(FLEET_RULES, clock)
        old.tick()
        before = {i.rule: i for i in old.engine.open_incidents()}
        assert {r: i.phase for r, i in before.items()} == {
            "fleet_empty": Phase.FIRING,
            "fleet_small": Phase.FIRING,
        }
        old.errors["fleet_empty"] = 2
        rules = parse_rules(FLEET_RULES.replace("fleet_small", "fleet_new"), "site.yaml")
        new, dropped = successor(old, rules, load_catalog())
        assert [i.rule for i in dropped] == ["fleet_small"]
        assert new.engine.get("fleet_empty", "fleet") == before["fleet_empty"]
        clock.advance(1)
        fired = [
            o.transition.incident.rule
            for o in new.tick()
            if o.transition.incident.phase == Phase.FIRING
        ]
        assert fired == ["fleet_new"]  # fleet_empty did not fire a second time
        assert new.errors == {"fleet_empty": 2}
        assert new.evaluations > old.evaluations

    def test_a_rule_whose_scope_changed_starts_over(self):
        """Same name, other scope: the old incident's target is not this rule's any more."""
        clock = FakeClock()
        old = evaluator(FLEET_RULES, clock)
        old.tick()
        node_rule = FLEET_RULES.replace(
            "scope: fleet\n    when: 'fleet.nodes < 5'", "scope: node\n    when: 'node.gpus < 5'"
        )
        new, dropped = successor(old, parse_rules(node_rule, "site.yaml"), load_catalog())
        assert [i.rule for i in dropped] == ["fleet_small"]
        assert new.engine.get("fleet_small", "fleet") is None

    def test_history_and_hooks_move_to_the_successor(self):
        """The events the windows read stay, the new rules' windows are kept, and the
        silencer and event hook the incident service set are carried over."""
        clock = FakeClock()
        old = evaluator(FLEET_RULES, clock)
        silencer = old.silencer = lambda _i, _r: "silence 7"
        hook = old.on_event = lambda: None
        counting = FLEET_RULES + (
            "  - name: replays\n    scope: gpu\n"
            '    when: \'increase("pcie_replay_count", "10m") > 5.0\'\n'
        )
        new, _ = successor(old, parse_rules(counting, "site.yaml"), load_catalog())
        assert new.history is old.history
        assert new.history.wants("pcie_replay_count")
        assert (new.silencer, new.on_event) == (silencer, hook)


class TestRuleChanges:
    def test_added_removed_changed_and_moved(self):
        """A rule that only moved down a line is not changed; one with a new condition is."""
        old = parse_rules(FLEET_RULES, "a.yaml")
        text = "# moved\n" + FLEET_RULES.replace("fleet_small", "fleet_tiny")
        text = text.replace("'fleet.nodes == 0'", "'fleet.nodes == 0 || false'")
        added, removed, changed = rule_changes(old, parse_rules(text, "a.yaml"))
        assert (added, removed, changed) == (["fleet_tiny"], ["fleet_small"], ["fleet_empty"])
        moved = parse_rules("\n\n" + FLEET_RULES, "a.yaml")
        assert rule_changes(old, moved) == ([], [], [])


class TestMetrics:
    def test_the_reload_families(self):
        """Prometheus's config_last_reload_* trio, from the tally."""
        tally = ReloadTally(last_success_unix=1_700_000_000.0)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(ReloadCollector(tally))
        get = registry.get_sample_value
        assert get("fleetwatch_config_last_reload_successful") == 1.0
        tally.failure("x")
        assert get("fleetwatch_config_last_reload_successful") == 0.0
        assert get("fleetwatch_config_reloads_total", {"result": "failure"}) == 1.0
        assert get("fleetwatch_config_reloads_total", {"result": "success"}) == 0.0
        assert get("fleetwatch_config_last_reload_success_timestamp_seconds") == 1_700_000_000.0


class _Recorder:  # a drain adapter and a notifier; what they got is in ``calls``
    name = "recorder"

    def __init__(self, label: str, calls: list[str], *, refused: bool = False) -> None:
        self.label, self.calls, self.refused = label, calls, refused

    async def drain(self, node: str, reason: str, key: str) -> ActionOutcome:  # noqa: ARG002
        self.calls.append(f"{self.label} drain {node}")
        return ActionOutcome(ok=not self.refused, detail=self.label, refused=self.refused)

    async def resume(self, node: str, key: str) -> ActionOutcome:  # noqa: ARG002
        self.calls.append(f"{self.label} resume {node}")
        return ActionOutcome(ok=True, detail=self.label)

    async def notify(
        self,
        channel: str,
        payload: dict[str, object],  # noqa: ARG002
        key: str,  # noqa: ARG002
    ) -> ActionOutcome:
        self.calls.append(f"{self.label} notify {channel}")
        return ActionOutcome(ok=True, detail=self.label)


class TestLiveActuators:
    async def test_a_swap_redirects_the_next_action(self):
        """Drains and notifications go to what the newest configuration built."""
        calls: list[str] = []
        first, second = _Recorder("a", calls), _Recorder("b", calls)
        live = LiveActuators(Actuators((first,), first))
        assert (await live.drainer.drain("n1", "r", "k")).detail == "a"
        live.swap(Actuators((first, second), second))
        both = await live.drainer.drain("n1", "r", "k")
        await live.notifier.notify("oncall", {}, "k")
        assert calls == ["a drain n1", "a drain n1", "b drain n1", "b notify oncall"]
        assert (both.ok, both.detail) == (True, "a; b")

    async def test_nothing_configured(self):
        """No adapters and no channels: the action fails, saying so."""
        live = LiveActuators(Actuators())
        drain = await live.drainer.drain("n1", "r", "k")
        notify = await live.notifier.notify("oncall", {}, "k")
        assert (drain.ok, drain.detail) == (False, "no drain adapter is configured")
        assert (notify.ok, notify.detail) == (False, "notify: no notify channel is configured")

    async def test_a_refusal_stays_a_refusal(self):
        """One adapter's refusal passes through as it is; all refusing is a refusal."""
        calls: list[str] = []
        live = LiveActuators(Actuators((_Recorder("a", calls, refused=True),)))
        assert (await live.drainer.drain("n1", "r", "k")).refused
        live.swap(Actuators((_Recorder("a", calls, refused=True), _Recorder("b", calls))))
        assert not (await live.drainer.drain("n1", "r", "k")).refused


def test_the_builtin_rules_load_as_a_reload_reads_them(tmp_path: Path):
    """No rule files: a reload reads the built-in rules, as the start does."""
    flags = {"journal": str(tmp_path / "j.db"), "listen": "127.0.0.1:7070"}
    source = ConfigSource(None, flags)
    now = load_collector_config(None, flags)
    candidate = read_candidate(source, now, {}, FakeClock())
    assert candidate.rules == load_rules()
