from collections import Counter
from http import HTTPStatus

import pytest
from structlog.testing import capture_logs

from collector.api.auth import ChangeGuard

TOKEN = "s3cret-api-token"  # noqa: S105 - a test token
EVERYWHERE = "0.0.0.0"  # noqa: S104 - a listen address the guard is told of, not bound


def guard(token: bytes | None, host: str = "127.0.0.1") -> tuple[ChangeGuard, Counter[str]]:
    refused: Counter[str] = Counter()
    return ChangeGuard(token=token, listen_host=host, refused=refused), refused


def check(g: ChangeGuard, client: str = "127.0.0.1", authorization: str | None = None):
    return g.check(client=client, authorization=authorization, method="POST", path="/x")


class TestChangeGuard:
    def test_the_token_admits_any_client(self):
        """With a token, the right bearer token passes from loopback and from elsewhere alike."""
        g, refused = guard(TOKEN.encode(), EVERYWHERE)
        assert check(g, "127.0.0.1", f"Bearer {TOKEN}") is None
        assert check(g, "10.20.0.7", f"bearer  {TOKEN} ") is None
        assert refused == Counter()

    @pytest.mark.parametrize(
        ("authorization", "reason"),
        [
            (None, "missing_token"),
            ("", "missing_token"),
            (f"Basic {TOKEN}", "missing_token"),
            ("Bearer", "missing_token"),
            ("Bearer wrong", "bad_token"),
            (f"Bearer {TOKEN}x", "bad_token"),
            ("Bearer ", "missing_token"),
            ("Bearer \xe9", "bad_token"),
        ],
    )
    def test_a_missing_or_wrong_token_is_401(self, authorization, reason):
        """Loopback is no excuse once a token is set: no token or a wrong one is 401, counted."""
        g, refused = guard(TOKEN.encode())
        refusal = check(g, "127.0.0.1", authorization)
        assert refusal is not None
        assert (refusal.status, refusal.reason) == (HTTPStatus.UNAUTHORIZED, reason)
        assert refused == Counter({reason: 1})

    def test_without_a_token_loopback_only(self):
        """No token and a loopback listen address: loopback clients may, others get 403."""
        g, refused = guard(None, "127.0.0.1")
        assert check(g, "::1") is None
        refusal = check(g, "10.20.0.7")
        assert refusal is not None
        assert (refusal.status, refusal.reason) == (HTTPStatus.FORBIDDEN, "not_loopback")
        assert refused == Counter({"not_loopback": 1})

    def test_off_loopback_without_a_token_nobody_may(self):
        """No token and a non-loopback listen address: even loopback clients are refused, and
        the message says which keys would fix it."""
        g, refused = guard(None, EVERYWHERE)
        refusal = check(g, "127.0.0.1", f"Bearer {TOKEN}")
        assert refusal is not None
        assert (refusal.status, refusal.reason) == (HTTPStatus.FORBIDDEN, "no_token_configured")
        assert "api_token_file or api_token_env" in refusal.message
        assert refused == Counter({"no_token_configured": 1})

    def test_a_refusal_is_logged_without_the_token(self):
        """The log line names the reason, client and path, never what was sent."""
        g, _ = guard(TOKEN.encode())
        with capture_logs() as logs:
            check(g, "10.20.0.7", "Bearer guess-123")
        assert logs == [
            {
                "event": "api_request_refused",
                "log_level": "warning",
                "reason": "bad_token",
                "client": "10.20.0.7",
                "method": "POST",
                "path": "/x",
            }
        ]
        assert "guess-123" not in repr(logs)

    def test_an_empty_token_is_refused_at_construction(self):
        """An empty token would let an empty header through; it is a ValueError up front."""
        with pytest.raises(ValueError, match="must not be empty"):
            guard(b"")

    def test_who_a_change_came_from_is_what_the_server_knows(self):
        """The bearer token (one, naming nobody): "token"; loopback without one: "loopback"
        (a TCP peer's user is not known)."""
        assert guard(TOKEN.encode(), EVERYWHERE)[0].identity == "token"
        assert guard(None)[0].identity == "loopback"
