"""The wheel, built without git, installs into a fresh venv from a wheelhouse with no index and
runs from outside the source tree (docs/deploy.md, "Without a clone or a network").

The module builds it the way docs/deploy.md tells an operator to: `pip wheel --wheel-dir WHEELS .`
in a copy of the tree that has no `.git` (fleetwatch's wheel and every runtime dependency, from
the index pip is configured with), then `pip install --no-index --find-links WHEELS fleetwatch`
into a venv of its own. Every command runs with a `git` first on PATH that records its calls, and
no test passes if anything called it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

# The first test also builds the wheelhouse: on a cold pip cache that downloads about 40 MB.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
# A checkout's git metadata, venv, caches and build outputs: what a source archive lacks.
NOT_SOURCE = shutil.ignore_patterns(
    ".git",
    ".venv",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
    ".hypothesis",
)
PACKAGES = ("fleetwatch", "agent", "collector", "rules", "cli", "dashboards")
# Files the packages read at run time (importlib.resources) or ship for people: rules, the Xid
# catalog, scenarios, the metrics catalog, the wire contract and its stubs, the dashboards.
DATA = ("*.yaml", "*.toml", "*.proto", "*.pyi", "*.json")
FAKE_GIT = '#!/bin/sh\necho "git $*" >> "{calls}"\nexit 1\n'


@dataclass(frozen=True)
class Installed:
    """fleetwatch installed from its wheelhouse into ``venv``; commands run in ``cwd``."""

    wheel: Path
    venv: Path
    cwd: Path
    env: dict[str, str]
    git_calls: Path

    def run(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """``argv[0]`` from the venv's bin/, outside the tree; fails if it called git."""
        done = subprocess.run(
            [str(self.venv / "bin" / argv[0]), *argv[1:]],
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert not self.git_calls.exists(), self.git_calls.read_text()
        return done

    def fleetwatch(self, *argv: str, timeout: float = 60) -> tuple[int, str]:
        """``fleetwatch ARGV``: its exit status and its stdout and stderr together."""
        done = self.run("fleetwatch", *argv, timeout=timeout)
        return done.returncode, done.stdout + done.stderr


def no_pip_settings() -> dict[str, str]:
    """This environment without pip's settings: no config file, no index, no find-links."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    return env | {"PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def pip(*argv: str, env: dict[str, str], cwd: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pip", *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    base = tmp_path_factory.mktemp("wheel")
    source = base / "source"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCE, symlinks=True)
    assert not (source / ".git").exists()
    fake_bin, git_calls = base / "fake-bin", base / "git-calls"
    fake_bin.mkdir()
    (fake_bin / "git").write_text(FAKE_GIT.format(calls=git_calls))
    (fake_bin / "git").chmod(0o755)
    path = f"{fake_bin}{os.pathsep}{os.environ['PATH']}"
    # docs/deploy.md's recipe, on the connected machine: the wheel and its dependencies.
    wheels = base / "wheels"
    pip(
        "wheel",
        "--quiet",
        "--wheel-dir",
        str(wheels),
        ".",
        env=os.environ | {"PATH": path},
        cwd=source,
    )
    assert not git_calls.exists(), git_calls.read_text()
    (wheel,) = wheels.glob("fleetwatch-*.whl")
    # On the "air-gapped" node: a venv of its own, filled from the wheelhouse alone. The venv
    # has no pip; this interpreter's pip installs into it (--python), which saves seconds.
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    pip(
        "--python",
        str(venv / "bin" / "python"),
        "install",
        "--quiet",
        "--no-index",
        "--find-links",
        str(wheels),
        "fleetwatch",
        env=no_pip_settings() | {"PATH": path},
        cwd=base,
    )
    cwd = base / "elsewhere"
    cwd.mkdir()
    env = {
        "PATH": f"{fake_bin}{os.pathsep}{venv / 'bin'}{os.pathsep}/usr/bin{os.pathsep}/bin",
        "HOME": str(cwd),
        "LANG": "C.UTF-8",
        "TMPDIR": str(base),
    }
    return Installed(wheel=wheel, venv=venv, cwd=cwd, env=env, git_calls=git_calls)


class TestWheel:
    def test_holds_every_data_file_of_the_packages_and_no_tests(self, installed):
        """Each rule file, the Xid catalog, scenario, metrics catalog, proto, stub and dashboard
        JSON of the source tree is package data in the wheel; tests and benchmarks are not."""
        names = set(zipfile.ZipFile(installed.wheel).namelist())
        data = {
            path.relative_to(ROOT).as_posix()
            for package in PACKAGES
            for pattern in DATA
            for path in (ROOT / package).rglob(pattern)
            if "__pycache__" not in path.parts
        }
        assert "rules/builtin/xid_catalog.yaml" in data
        assert "dashboards/json/fleetwatch-fleet-overview.json" in data
        assert sorted(data - names) == []
        assert [n for n in names if n.startswith(("tests/", "bench/", "docs/", "deploy/"))] == []

    def test_metadata_has_the_version_of_pyproject(self, installed):
        """The wheel's name and METADATA carry pyproject's static version (nothing from git)."""
        assert installed.wheel.name == f"fleetwatch-{VERSION}-py3-none-any.whl"
        metadata = zipfile.ZipFile(installed.wheel).read(f"fleetwatch-{VERSION}.dist-info/METADATA")
        assert f"\nVersion: {VERSION}\n" in metadata.decode()


class TestInstalled:
    def test_imports_come_from_the_venv_not_the_tree(self, installed):
        """Every package, and its version, is the installed copy under the new venv."""
        code = (
            "import importlib.metadata, agent, cli, collector, dashboards, fleetwatch, rules\n"
            "print(importlib.metadata.version('fleetwatch'), fleetwatch.__version__)\n"
            "for m in (agent, cli, collector, dashboards, fleetwatch, rules): print(m.__file__)\n"
        )
        done = installed.run("python", "-c", code)
        assert done.returncode == 0, done.stderr
        versions, *files = done.stdout.splitlines()
        assert versions == f"{VERSION} {VERSION}"
        assert len(files) == 6
        for file in files:
            assert Path(file).is_relative_to(installed.venv), file

    def test_version(self, installed):
        """`fleetwatch --version` says pyproject's version."""
        assert installed.fleetwatch("--version") == (0, f"fleetwatch {VERSION}\n")

    def test_rules_check_loads_the_builtin_rules_and_catalog(self, installed):
        """The built-in rules and the Xid catalog they read load from the installed package."""
        code, out = installed.fleetwatch("rules", "check")
        assert code == 0, out
        assert re.fullmatch(r"built-in rules: \d+ rules, no problems\n", out), out

    def test_config_check_passes_the_example_collector_config(self, installed):
        """deploy/config/collector.toml, copied out of the tree with its TLS files made by the
        installed `fleetwatch certs`, checks clean."""
        pki, etc = installed.cwd / "pki", installed.cwd / "etc"
        commands = [
            ("certs", "ca", "--out", str(pki / "ca")),
            ("certs", "collector", "--ca", str(pki / "ca"), "--out", str(pki), "localhost"),
        ]
        for argv in commands:
            code, out = installed.fleetwatch(*argv)
            assert code == 0, out
        (etc / "tls").mkdir(parents=True)
        shutil.copy(pki / "ca" / "ca.pem", etc / "tls" / "ca.pem")
        shutil.copy(pki / "collector-localhost.pem", etc / "tls" / "collector.pem")
        shutil.copy(pki / "collector-localhost.key", etc / "tls" / "collector.key")
        example = (ROOT / "deploy" / "config" / "collector.toml").read_text()
        config = installed.cwd / "collector.toml"
        config.write_text(example.replace("/etc/fleetwatch/", f"{etc}/"))
        code, out = installed.fleetwatch("config", "check", "collector.toml")
        assert code == 0, out
        assert out.startswith("collector.toml: collector config OK: listen 0.0.0.0:7070 (mTLS)")
        assert "rules (built-in)" in out

    def test_demo_runs_a_short_simulated_cluster(self, installed):
        """`fleetwatch demo` plays the built-in scenario (package data) on 4 nodes for 8 s and
        ends with its summary."""
        code, out = installed.fleetwatch("demo", "--nodes", "4", "--duration", "8", timeout=100)
        assert code == 0, out
        assert "actions taken:" in out
        assert "final fleet health:" in out
        assert re.search(r"^  node-04 ", out, re.MULTILINE), out
