"""A fleet process that fails ends the demo with one line saying which, not a traceback."""

import io

import pytest

from cli.demo import run
from cli.demo.fleet_procs import FleetProcessError
from fleetwatch.testing import FakeClock


def test_a_failed_fleet_process_is_one_line_and_exit_1(monkeypatch, capsys):
    async def fails(*_args: object, **_kwargs: object) -> None:
        msg = "the fleet process of node-01.. ended (exit status 1)"
        raise FleetProcessError(msg)

    monkeypatch.setattr(run, "run_demo", fails)
    code = run.main(run.DemoOptions(nodes=2, duration=5), FakeClock(), io.StringIO())
    assert code == 1
    assert capsys.readouterr().err == (
        "fleetwatch demo: the fleet process of node-01.. ended (exit status 1)\n"
    )


def test_other_errors_are_not_swallowed(monkeypatch):
    async def breaks(*_args: object, **_kwargs: object) -> None:
        raise KeyError("a bug")

    monkeypatch.setattr(run, "run_demo", breaks)
    with pytest.raises(KeyError):
        run.main(run.DemoOptions(nodes=2, duration=5), FakeClock(), io.StringIO())
