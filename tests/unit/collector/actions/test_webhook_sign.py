import hashlib
import hmac
from typing import Any

import pytest
from structlog.testing import capture_logs

from collector.actions.webhook import WebhookSender, encode_envelope, sign, verify
from fleetwatch.testing import FakeClock

SECRET = b"shared-secret-of-the-drain-endpoint"
BODY = b'{"idempotency_key":"k","kind":"notification","payload":{},"sent_at":1.0,"version":1}'
NOW = 1_767_225_600.0
TIMESTAMP = "1767225600"


def reference_signature(secret: bytes, timestamp: str, body: bytes) -> str:
    """The documented formula, written out independently of the code under test."""
    digest = hmac.new(secret, timestamp.encode("ascii") + b"." + body, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


class TestSign:
    def test_matches_an_independent_hmac(self):
        """The signature is "sha256=" and the hex HMAC-SHA256 of timestamp, a dot and the body."""
        assert reference_signature(SECRET, TIMESTAMP, BODY) == sign(SECRET, TIMESTAMP, BODY)

    def test_known_vector(self):
        """A fixed input gives a fixed signature (checked with `openssl dgst -sha256 -hmac key`)."""
        assert (
            sign(b"key", "1700000000", b"{}")
            == "sha256=9d713ed406bb7076d4123f0dc2c39d2df5c654ed4b0cd56b52c8b4c940bd63ae"
        )

    def test_every_signed_part_changes_the_signature(self):
        """Secret, timestamp and body all enter the signature."""
        base = sign(SECRET, TIMESTAMP, BODY)
        assert base != sign(SECRET + b"x", TIMESTAMP, BODY)
        assert base != sign(SECRET, "1767225601", BODY)
        assert base != sign(SECRET, TIMESTAMP, BODY + b" ")


class TestVerify:
    def test_accepts_a_fresh_valid_signature(self):
        """A signature made with the shared secret on the received bytes verifies."""
        signature = reference_signature(SECRET, TIMESTAMP, BODY)
        assert verify(SECRET, TIMESTAMP, BODY, signature, now=NOW)

    def test_rejects_a_tampered_body(self):
        """Changing one byte of the body after signing makes verification fail."""
        signature = sign(SECRET, TIMESTAMP, BODY)
        tampered = BODY.replace(b"notification", b"notificatioN")
        assert not verify(SECRET, TIMESTAMP, tampered, signature, now=NOW)

    def test_rejects_a_wrong_secret(self):
        """A signature made with another secret does not verify."""
        signature = sign(b"someone-else", TIMESTAMP, BODY)
        assert not verify(SECRET, TIMESTAMP, BODY, signature, now=NOW)

    def test_rejects_a_swapped_timestamp(self):
        """A valid signature cannot be re-used with a newer timestamp header."""
        signature = sign(SECRET, TIMESTAMP, BODY)
        assert not verify(SECRET, "1767225610", BODY, signature, now=NOW + 10)

    def test_rejects_stale_timestamps_outside_the_window(self):
        """A replay older than the tolerance is refused; one at the edge is still accepted."""
        signature = sign(SECRET, TIMESTAMP, BODY)
        assert verify(SECRET, TIMESTAMP, BODY, signature, now=NOW + 300)
        assert not verify(SECRET, TIMESTAMP, BODY, signature, now=NOW + 300.5)
        assert not verify(SECRET, TIMESTAMP, BODY, signature, now=NOW + 3600)
        assert not verify(SECRET, TIMESTAMP, BODY, signature, now=NOW + 61, tolerance_s=60)

    def test_rejects_timestamps_from_the_future(self):
        """A timestamp further ahead than the tolerance is refused too."""
        signature = sign(SECRET, TIMESTAMP, BODY)
        assert verify(SECRET, TIMESTAMP, BODY, signature, now=NOW - 300)
        assert not verify(SECRET, TIMESTAMP, BODY, signature, now=NOW - 301)

    @pytest.mark.parametrize(
        "timestamp", ["", "-5", "1e9", "12.5", " 1767225600", "١٧٦٧", "9" * 40]
    )
    def test_rejects_malformed_timestamps(self, timestamp):
        """Only plain ASCII digits count as a timestamp, even when the signature matches them."""
        signature = sign(SECRET, timestamp, BODY)
        assert not verify(SECRET, timestamp, BODY, signature, now=NOW)

    @pytest.mark.parametrize(
        "mangle",
        [str.upper, lambda s: s.removeprefix("sha256="), lambda s: f" {s}", lambda s: s[:-1]],
    )
    def test_signature_must_match_exactly(self, mangle):
        """The header must be the exact lower-case form with its prefix, nothing more or less."""
        signature = sign(SECRET, TIMESTAMP, BODY)
        assert verify(SECRET, TIMESTAMP, BODY, signature, now=NOW)
        assert not verify(SECRET, TIMESTAMP, BODY, mangle(signature), now=NOW)

    def test_compares_in_constant_time(self, monkeypatch):
        """The signature is compared with hmac.compare_digest, not ==."""
        calls = []
        original = hmac.compare_digest

        def spy(a, b):
            calls.append((a, b))
            return original(a, b)

        monkeypatch.setattr(hmac, "compare_digest", spy)
        signature = sign(SECRET, TIMESTAMP, BODY)
        assert verify(SECRET, TIMESTAMP, BODY, signature, now=NOW)
        assert [(signature.encode(), signature.encode())] == calls

    def test_negative_tolerance_is_a_programming_error(self):
        """A negative window raises instead of silently rejecting everything."""
        with pytest.raises(ValueError, match="tolerance_s"):
            verify(SECRET, TIMESTAMP, BODY, sign(SECRET, TIMESTAMP, BODY), now=NOW, tolerance_s=-1)


class TestEnvelope:
    def test_compact_sorted_json(self):
        """The body is compact JSON with keys sorted at every level, so it encodes one way."""
        body = encode_envelope(
            kind="drain_request",
            idempotency_key="drain:node-7:1",
            sent_at=1_767_225_600.12345,
            payload={"node": "node-7", "evidence": {"xid": 79, "gpu": 3}},
        )
        assert body == (
            b'{"idempotency_key":"drain:node-7:1","kind":"drain_request",'
            b'"payload":{"evidence":{"gpu":3,"xid":79},"node":"node-7"},'
            b'"sent_at":1767225600.123,"version":1}'
        )

    def test_non_ascii_is_escaped(self):
        """Text outside ASCII is escaped, so the signed bytes do not depend on an encoding."""
        body = encode_envelope(
            kind="notification", idempotency_key="k", sent_at=0, payload={"m": "é"}
        )
        assert b'"m":"\\u00e9"' in body

    def test_nan_is_refused(self):
        """NaN is not JSON; encoding refuses it instead of sending what receivers cannot parse."""
        with pytest.raises(ValueError, match="JSON"):
            encode_envelope(kind="k", idempotency_key="k", sent_at=0, payload={"x": float("nan")})


class TestSenderOptions:
    @pytest.mark.parametrize(
        ("options", "named"),
        [
            ({"url": "ftp://example.com/hook"}, "url"),
            ({"url": "example.com/hook"}, "url"),
            ({"url": "http:///hook"}, "url"),
            ({"url": "https://user:pw@example.com/hook"}, "url"),
            ({"url": "http://example.com:99999/hook"}, "url"),
            ({"secret": b""}, "secret"),
            ({"timeout_s": 0}, "timeout_s"),
            ({"timeout_s": float("inf")}, "timeout_s"),
            ({"max_attempts": 0}, "max_attempts"),
            ({"backoff_initial_s": -0.5}, "backoff_initial_s"),
            ({"backoff_max_s": float("nan")}, "backoff_max_s"),
            ({"backoff_initial_s": 5.0, "backoff_max_s": 1.0}, "backoff_max_s"),
        ],
    )
    def test_bad_options_name_themselves(self, options, named):
        """Each invalid option raises ValueError at construction, naming the option."""
        values: dict[str, Any] = {
            "url": "https://example.com/hook",
            "secret": SECRET,
            "clock": FakeClock(),
        }
        values.update(options)
        with pytest.raises(ValueError, match=named):
            WebhookSender(**values)

    def test_unsigned_sender_warns_once(self):
        """A sender without a secret logs one warning when built, naming only the endpoint."""
        with capture_logs() as logs:
            sender = WebhookSender(
                "https://chat.example.com/hooks/T0/secret-token", None, FakeClock()
            )
        assert [(e["event"], e["log_level"]) for e in logs] == [("webhook_unsigned", "warning")]
        assert logs[0]["endpoint"] == "https://chat.example.com"
        assert "secret-token" not in repr(logs)
        assert sender.endpoint == "https://chat.example.com"

    def test_signed_sender_does_not_warn(self):
        """A sender with a secret logs nothing when built."""
        with capture_logs() as logs:
            WebhookSender("http://127.0.0.1:9/hook", SECRET, FakeClock())
        assert logs == []

    @pytest.mark.parametrize(
        ("kind", "key"), [("Drain Request", "k"), ("drain_request", ""), ("x", "a b"), ("x", "\n")]
    )
    async def test_send_refuses_malformed_kind_or_key(self, kind, key):
        """A kind or idempotency key that could not travel safely is a programming error."""
        sender = WebhookSender("http://127.0.0.1:9/hook", SECRET, FakeClock())
        with pytest.raises(ValueError, match=r"kind|idempotency_key"):
            await sender.send({}, key, kind=kind)


class TestBackoff:
    def test_doubles_from_initial_up_to_the_cap(self):
        """Waits grow 0.5, 1, 2, 4, 8 and then stay at the cap."""
        sender = WebhookSender(
            "http://127.0.0.1:9/", SECRET, FakeClock(), backoff_initial_s=0.5, backoff_max_s=10
        )
        assert [sender._delay(n, None) for n in range(1, 8)] == [
            0.5,
            1.0,
            2.0,
            4.0,
            8.0,
            10.0,
            10.0,
        ]
        assert sender._delay(10_000, None) == 10.0

    def test_retry_after_wins_but_is_capped(self):
        """A receiver's Retry-After replaces the backoff, bounded by backoff_max_s."""
        sender = WebhookSender("http://127.0.0.1:9/", SECRET, FakeClock(), backoff_max_s=10)
        assert sender._delay(1, 3.0) == 3.0
        assert sender._delay(1, 3600.0) == 10.0
