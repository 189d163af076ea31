"""deploy/prometheus: promtool accepts the configuration and rules; the rules' tests pass."""

import shutil
import subprocess
from pathlib import Path

import pytest

PROMETHEUS = Path(__file__).parents[2] / "deploy" / "prometheus"


@pytest.fixture(scope="module")
def promtool() -> str:
    binary = shutil.which("promtool")
    assert binary, "promtool is missing: scripts/ensure-test-deps.sh installs prometheus"
    return binary


def run(promtool: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool, *args], capture_output=True, text=True, check=False, timeout=60
    )


class TestPromtool:
    def test_rules_are_clean(self, promtool):
        """`promtool check rules` accepts both rule files and finds every rule."""
        files = sorted(str(p) for p in (PROMETHEUS / "rules").glob("*.yml"))
        assert [Path(f).name for f in files] == [
            "fleetwatch-alerts.yml",
            "fleetwatch-recording.yml",
        ]
        result = run(promtool, "check", "rules", *files)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "FAILED" not in result.stdout + result.stderr

    def test_config_is_clean_and_loads_the_rules(self, promtool):
        """`promtool check config` accepts prometheus.yml and finds both rule files."""
        result = run(promtool, "check", "config", str(PROMETHEUS / "prometheus.yml"))
        assert result.returncode == 0, result.stdout + result.stderr
        assert "2 rule files found" in result.stdout + result.stderr

    def test_rule_unit_tests_pass(self, promtool):
        """`promtool test rules`: alerts fire when and as expected, recordings record."""
        result = run(
            promtool, "test", "rules", str(PROMETHEUS / "tests" / "fleetwatch-rules-test.yml")
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert "SUCCESS" in result.stdout + result.stderr
