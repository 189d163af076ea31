from collections import Counter
from http import HTTPStatus

import pytest
from structlog.testing import capture_logs

from collector.api.auth import ChangeGuard, parse_tokens

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

    def test_who_a_change_came_from_is_what_the_server_knows(self, tmp_path):
        """The token it carried ("token", or "token NAME" for a named one); a loopback client
        whose socket the kernel's table does not show: "loopback"; a remote one: only the token."""
        here, there = ("127.0.0.1", 40000), ("127.0.0.1", 8080)
        g = ChangeGuard(
            token=TOKEN.encode(), listen_host=EVERYWHERE, refused=Counter(), proc_root=tmp_path
        )
        assert g.identity(here, there, f"Bearer {TOKEN}") == "token, loopback"
        assert g.identity(("10.0.0.9", 4000), there, f"Bearer {TOKEN}") == "token"
        named = ChangeGuard(
            token=b"alice tok-a\nci-bot tok-b\n",
            listen_host=EVERYWHERE,
            refused=Counter(),
            proc_root=tmp_path,
        )
        assert named.identity(("10.0.0.9", 4000), there, "Bearer tok-b") == "token ci-bot"
        alone = ChangeGuard(
            token=None, listen_host="127.0.0.1", refused=Counter(), proc_root=tmp_path
        )
        assert alone.identity(here, there, None) == "loopback"

    def test_each_named_token_admits_and_others_are_refused(self):
        """A token file with several named tokens: each one passes, a near miss does not."""
        g, refused = guard(b"# on-call\nalice tok-alice-1\n\nci-bot tok-ci-22\n", EVERYWHERE)
        assert check(g, "10.0.0.9", "Bearer tok-alice-1") is None
        assert check(g, "10.0.0.9", "Bearer tok-ci-22") is None
        refusal = check(g, "10.0.0.9", "Bearer tok-ci-2")
        assert refusal is not None
        assert refusal.reason == "bad_token"
        assert refused == Counter({"bad_token": 1})


class TestParseTokens:
    def test_one_token_has_no_name(self):
        assert parse_tokens(b"  s3cret  \n") == {b"s3cret": ""}

    def test_named_tokens_with_comments_and_blank_lines(self):
        secret = b"# who may change things\nalice  tok-a\n\n  ci-bot\ttok-b  \n"
        assert parse_tokens(secret) == {b"tok-a": "alice", b"tok-b": "ci-bot"}

    @pytest.mark.parametrize(
        ("secret", "message"),
        [
            (b"alice tok-a\nbob\n", "line 2: expected NAME TOKEN, found 1 fields"),
            (b"alice tok-a extra\n", "line 1: expected NAME TOKEN, found 3 fields"),
            (b"al/ice tok-a\nbob tok-b\n", "line 1: a token's name is letters"),
            (b"alice tok-a\nalice tok-b\n", "line 2: the name alice is given twice"),
            (b"alice tok-a\nbob tok-a\n", "line 2: bob's token is the same as alice's"),
            (b"# only a comment\n\n", "no token in it"),
        ],
    )
    def test_a_malformed_file_names_the_line_never_a_token(self, secret, message):
        with pytest.raises(ValueError, match=message) as caught:
            parse_tokens(secret)
        assert "tok-" not in str(caught.value)

    def test_too_many_tokens(self):
        secret = "".join(f"user{i} tok-{i}\n" for i in range(1001)).encode()
        with pytest.raises(ValueError, match="1001 tokens: at most 1000"):
            parse_tokens(secret)
