"""Shared fixtures: a real collector on loopback, with its journal in the test's tmp_path."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import pytest
import structlog

from cli.dev.pg_server import PgServer
from collector.config import CollectorConfig
from collector.main import CollectorService
from fleetwatch.clock import SystemClock
from fleetwatch.logs import configure_logging

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterator
    from pathlib import Path


def pytest_configure(config: pytest.Config) -> None:
    """Daemons' logs go to stderr as in production, so a command's stdout holds only its output."""
    configure_logging("debug", "console")


@pytest.fixture(autouse=True)
def _keep_logging_config() -> Iterator[None]:
    """Tests that call ``cli.main.main`` in-process reconfigure structlog (a level filter);
    put back what was there so later tests' log assertions see every level."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


@pytest.fixture
def collector_config(tmp_path: Path) -> Callable[..., CollectorConfig]:
    def make(**overrides: Any) -> CollectorConfig:
        values: dict[str, Any] = {
            "listen": "127.0.0.1:0",
            "http": "127.0.0.1:0",
            "journal": tmp_path / "journal.db",
            "heartbeat_interval": 0.5,
            "missed_heartbeats": 3,
        }
        values.update(overrides)
        return CollectorConfig(**values)

    return make


@pytest.fixture
async def collector(
    collector_config: Callable[..., CollectorConfig],
) -> AsyncIterator[CollectorService]:
    service = CollectorService(collector_config(), SystemClock())
    await service.start()
    try:
        yield service
    finally:
        await service.stop(grace=None)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """One throwaway PostgreSQL server for the whole run, started by the first test needing it.

    ``make test`` installs the server when it is missing (scripts/ensure-test-deps.sh); a machine
    without one fails these tests rather than skipping them.
    """
    server = PgServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pg_dsn(pg_server: PgServer) -> Iterator[str]:
    """A fresh, empty database for one test; dropped afterwards."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    dsn = pg_server.create_database(name)
    try:
        yield dsn
    finally:
        pg_server.drop_database(name)
