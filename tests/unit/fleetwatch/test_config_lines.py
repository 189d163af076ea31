import tomllib
from pathlib import Path

import pytest

from agent.config import load_agent_config
from agent.exceptions import ConfigError as AgentConfigError
from collector.config import load_collector_config
from collector.exceptions import ConfigError as CollectorConfigError
from fleetwatch.config_lines import FileProblem, key_line, locate, toml_position

COLLECTOR = """\
# fleetwatch collector
[collector]
listen = "0.0.0.0:7070"
heartbeat_interval = 5
"rules_interval" = 1

[collector.actions]
dry_run = false
notify.pager = { url = "https://pager.example/hook" }

[collector.actions.drain_webhook]
url = "https://drainer.example/fleetwatch"
secret_file = "/etc/fleetwatch/drain.secret"
"""


class TestKeyLine:
    @pytest.mark.parametrize(
        ("key", "line"),
        [
            ("listen", 3),
            ("heartbeat_interval", 4),
            ("rules_interval", 5),  # a quoted key
            ("actions", 7),  # a table of its own
            ("actions.dry_run", 8),  # a key of a sub-table
            ("actions.notify.pager", 9),  # a dotted key
            ("actions.drain_webhook", 11),
            ("actions.drain_webhook.secret_file", 13),
        ],
    )
    def test_finds_the_line_that_sets_a_key(self, key, line):
        """Keys in the table, in sub-tables, dotted and quoted, and tables, each at its line."""
        assert key_line(COLLECTOR, "collector", key) == line

    def test_a_key_not_set_has_no_line(self):
        """A key the file does not set, or one of another table, has no line."""
        assert key_line(COLLECTOR, "collector", "journal") is None
        assert key_line(COLLECTOR, "agent", "listen") is None
        assert key_line(COLLECTOR, "collector", "actions.notify.pager.secret_file") is None

    def test_a_file_without_the_table(self):
        """The daemons read a file without its table as the table: its top keys count."""
        assert key_line("# agent\npoll_interval = 2\n", "agent", "poll_interval") == 2


class TestLocate:
    def test_toml_syntax_error_has_its_line_and_column(self):
        """tomllib's own position is taken from its message."""
        with pytest.raises(tomllib.TOMLDecodeError) as caught:
            tomllib.loads("[agent]\npoll_interval = \n")
        message = str(caught.value)
        assert toml_position(message) == (2, 17)
        problem = locate("agent.toml", "", "agent", message)
        assert (problem.line, problem.column) == (2, 17)
        assert str(problem).startswith("agent.toml:2:17: ")

    @pytest.mark.parametrize(
        ("text", "line"),
        [
            ('[collector]\nlisten = "h:1"\nheartbeat_interval = "fast"\n', 3),
            ('[collector]\nlisten = "h:1"\n\n[collector.actions]\ndry_run = "no"\n', 5),
            ("[collector]\nlisten = 'h:1'\nbogus = 1\n", 3),
            ("[collector]\n[collector.actions.drain_webhook]\nurl = 'u'\nsecret_env = 'x y'\n", 4),
            ("[collector]\njournal = '/j.db'\nhttp = 'nowhere'\n", 3),
            ("[collector]\nrules = 'one.yaml'\n", 2),
        ],
    )
    def test_the_collectors_own_errors_find_their_key(self, tmp_path: Path, text, line):
        """What the collector's loader says about a value points at the line that set it."""
        path = tmp_path / "collector.toml"
        path.write_text(text)
        with pytest.raises(CollectorConfigError) as caught:
            load_collector_config(path, {})
        problem = locate(str(path), text, "collector", str(caught.value))
        assert line == problem.line, str(caught.value)

    def test_the_agents_errors_find_their_key(self, tmp_path: Path):
        """The agent's loader's messages name keys the same way."""
        text = '[agent]\ncollector = "c:1"\n\ngpu_reset = "false"\n'
        path = tmp_path / "agent.toml"
        path.write_text(text)
        with pytest.raises(AgentConfigError) as caught:
            load_agent_config(path, {})
        assert locate(str(path), text, "agent", str(caught.value)).line == 4

    def test_a_message_naming_no_key_has_no_line(self):
        """Without a key the file sets, the problem names the file alone."""
        problem = locate("c.toml", COLLECTOR, "collector", "collector config: something odd")
        assert problem == FileProblem("c.toml", "collector config: something odd")
        assert str(problem) == "c.toml: collector config: something odd"

    def test_a_path_in_the_message_is_not_taken_for_a_key(self):
        """Words of the file's own path, or of a value after a colon, do not count as keys."""
        text = "[collector]\nrules = ['x.yaml']\n"
        problem = locate("/srv/rules/c.toml", text, "collector", "/srv/rules/c.toml: no table")
        assert problem.line is None
        assert str(problem) == "/srv/rules/c.toml: no table"
