"""The HTTP API's token: changes need it, reads do not, and the CLI sends it."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any

import pytest

from cli.main import main
from collector.main import CollectorService
from fleetwatch.clock import SystemClock
from tests.integration.fleet_harness import api

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable
    from pathlib import Path

    from collector.config import CollectorConfig

pytestmark = pytest.mark.integration

TOKEN = "0123456789abcdef-api-token"  # noqa: S105 - a test token
WRONG = "not-the-token"
TOKEN_VAR = "FLEETWATCH_TEST_COLLECTOR_TOKEN"  # noqa: S105 - a variable name
# node-7 has not said Hello to these collectors: forced (an unknown node is refused).
SILENCE = {"node": "node-7", "duration": "2h", "reason": "cable swap", "force": True}


async def call(service: CollectorService, method: str, path: str, body: object = None, **kw: Any):
    """``api`` off the event loop: a change is written through the loop's journal writer."""
    return await asyncio.to_thread(api, service, method, path, body, **kw)


async def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = await asyncio.to_thread(main, list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def refused(service: CollectorService, reason: str) -> float:
    """``fleetwatch_api_requests_refused_total{reason}`` as a scrape shows it."""
    url = f"http://127.0.0.1:{service.http_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    line = f'fleetwatch_api_requests_refused_total{{reason="{reason}"}} '
    return float(next(row for row in text.splitlines() if row.startswith(line)).split()[-1])


@pytest.fixture
async def guarded(
    collector_config: Callable[..., CollectorConfig], tmp_path: Path
) -> AsyncIterator[CollectorService]:
    """A collector whose API token is in a file."""
    token_file = tmp_path / "api.token"
    token_file.write_text(f"{TOKEN}\n")
    service = CollectorService(collector_config(api_token_file=token_file), SystemClock())
    await service.start()
    try:
        yield service
    finally:
        await service.stop(grace=None)


class TestTokenOverHttp:
    async def test_changes_need_the_token(self, guarded: CollectorService):
        """No token and a wrong one are 401 with a JSON error and change nothing; the right
        one adds and ends a silence; reads need no token; every refusal is counted."""
        status, body = await call(guarded, "POST", "/api/v1/silences", SILENCE)
        assert (status, body) == (401, {"error": body["error"]})
        assert "Authorization: Bearer" in body["error"]
        status, body = await call(guarded, "POST", "/api/v1/silences", SILENCE, token=WRONG)
        assert (status, body) == (401, {"error": "the API token is not valid"})
        status, body = await call(guarded, "GET", "/api/v1/silences")
        assert (status, body) == (200, {"silences": []})
        status, body = await call(guarded, "POST", "/api/v1/silences", SILENCE, token=TOKEN)
        assert status == 201
        silence_id = body["id"]
        _, body = await call(guarded, "GET", "/api/v1/silences")
        assert [(silence_id, "node-7", "cable swap")] == [
            (s["id"], s["node"], s["reason"]) for s in body["silences"]
        ]
        status, _ = await call(guarded, "DELETE", f"/api/v1/silences/{silence_id}")
        assert status == 401
        _, body = await call(guarded, "GET", "/api/v1/silences")
        assert len(body["silences"]) == 1
        status, body = await call(guarded, "DELETE", f"/api/v1/silences/{silence_id}", token=TOKEN)
        assert (status, body) == (200, {"removed": silence_id})
        status, _ = await call(guarded, "POST", "/api/v1/drains/node-1/release", {})
        assert status == 401
        assert refused(guarded, "missing_token") == 3.0
        assert refused(guarded, "bad_token") == 1.0
        assert refused(guarded, "no_token_configured") == 0.0

    async def test_a_401_asks_for_a_bearer_token(self, guarded: CollectorService):
        """The refusal carries WWW-Authenticate: Bearer, as RFC 6750 asks."""
        url = f"http://127.0.0.1:{guarded.http_port}/api/v1/silences"
        req = urllib.request.Request(url, data=b"{}", method="POST")
        with pytest.raises(urllib.error.HTTPError) as caught:
            await asyncio.to_thread(urllib.request.urlopen, req, timeout=5)
        with caught.value as exc:
            assert (exc.code, exc.headers["WWW-Authenticate"]) == (401, "Bearer")


class TestCliToken:
    async def test_cli_sends_the_token_from_the_environment(
        self, collector_config, tmp_path: Path, capsys, monkeypatch
    ):
        """With the token in the collector's api_token_env variable and in the user's
        FLEETWATCH_API_TOKEN, `fleetwatch silence add|remove` work; without it the CLI exits 2
        with the 401 and a hint; --token-file works too."""
        cfg = collector_config(api_token_env=TOKEN_VAR)
        service = CollectorService(cfg, SystemClock(), environ={TOKEN_VAR: TOKEN})
        await service.start()
        api_arg = f"--api=http://127.0.0.1:{service.http_port}"
        try:
            monkeypatch.delenv("FLEETWATCH_API_TOKEN", raising=False)
            code, _, err = await cli(capsys, "silence", api_arg, "add", "--all", "--duration=1h")
            assert code == 2
            assert "401" in err
            assert "set $FLEETWATCH_API_TOKEN or pass --token-file" in err
            code, out, _ = await cli(capsys, "silence", api_arg, "list")
            assert (code, out.strip()) == (0, "no silences")
            monkeypatch.setenv("FLEETWATCH_API_TOKEN", TOKEN)
            code, out, _ = await cli(capsys, "silence", api_arg, "add", "--all", "--duration=1h")
            assert code == 0
            silence_id = int(out.split()[1])
            monkeypatch.setenv("FLEETWATCH_API_TOKEN", WRONG)
            token_file = tmp_path / "my.token"
            token_file.write_text(f"{TOKEN}\n")
            code, out, _ = await cli(
                capsys, "silence", api_arg, f"--token-file={token_file}", "remove", str(silence_id)
            )
            assert (code, out.strip()) == (0, f"silence {silence_id} removed")
            code, _, err = await cli(capsys, "drains", api_arg, "release", "node-1")
            assert code == 2
            assert "401 the API token is not valid" in err
            assert TOKEN not in err
        finally:
            await service.stop(grace=None)

    async def test_an_unreadable_token_file_is_a_one_line_error(self, capsys, tmp_path: Path):
        """A --token-file that is missing or empty stops the CLI before any request."""
        missing = tmp_path / "missing.token"
        code, _, err = await cli(
            capsys, "silence", "--api=http://127.0.0.1:9", f"--token-file={missing}", "remove", "1"
        )
        assert code == 2
        assert f"cannot read the API token file {missing}: No such file or directory" in err
        empty = tmp_path / "empty.token"
        empty.write_text("\n")
        code, _, err = await cli(
            capsys, "silence", "--api=http://127.0.0.1:9", f"--token-file={empty}", "remove", "1"
        )
        assert code == 2
        assert f"the API token file {empty} is empty" in err


class TestWithoutToken:
    async def test_off_loopback_without_a_token_changes_are_refused(self, collector_config):
        """The API bound to every address with no token configured: reads work, a change even
        from loopback is 403 naming the missing keys, and counted."""
        everywhere = "0.0.0.0:0"
        service = CollectorService(collector_config(http=everywhere), SystemClock())
        await service.start()
        try:
            status, body = await call(service, "POST", "/api/v1/silences", SILENCE, token=TOKEN)
            assert status == 403
            assert "api_token_file or api_token_env" in body["error"]
            status, body = await call(service, "GET", "/api/v1/silences")
            assert (status, body) == (200, {"silences": []})
            assert refused(service, "no_token_configured") == 1.0
        finally:
            await service.stop(grace=None)

    async def test_on_loopback_without_a_token_changes_work(self, collector):
        """Today's behaviour stays: loopback API, no token, a loopback client may change."""
        status, body = await call(collector, "POST", "/api/v1/silences", SILENCE)
        assert status == 201
        status, _ = await call(collector, "DELETE", f"/api/v1/silences/{body['id']}")
        assert status == 200
