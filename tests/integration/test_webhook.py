"""The webhook sender against the real receiver, over HTTP on loopback."""

import http.client
import json
import socket
from typing import Any

import pytest
from structlog.testing import capture_logs

import fleetwatch
from cli.dev.webhook_receiver import WebhookReceiver
from collector.actions.webhook import WebhookSender, verify
from fleetwatch.clock import Clock, SystemClock
from fleetwatch.testing import FakeClock, free_port

pytestmark = pytest.mark.integration

SECRET = b"integration-secret"
KEY = "drain:node-7:incident-42"
PAYLOAD = {"node": "node-7", "reason": "Xid 79 on GPU 3 (GPU fell off the bus)"}


@pytest.fixture
def clock():
    """Shared by sender and receiver: waits between attempts pass instantly, HTTP is real."""
    return FakeClock()


@pytest.fixture
def receiver(clock):
    with WebhookReceiver(clock=clock, secret=SECRET) as running:
        yield running


def sender_for(
    receiver: WebhookReceiver, clock: Clock, secret: bytes | None = SECRET, **options: Any
) -> WebhookSender:
    settings = {"backoff_initial_s": 1.0, "backoff_max_s": 8.0, "timeout_s": 2.0} | options
    return WebhookSender(f"{receiver.url}/hooks/drain", secret, clock, **settings)


class TestDelivery:
    async def test_signed_delivery_is_accepted_and_verifies(self, receiver, clock):
        """One request carries the documented envelope and headers, and its signature verifies."""
        result = await sender_for(receiver, clock).send(PAYLOAD, KEY, kind="drain_request")

        assert (result.delivered, result.status, result.attempts, result.error) == (
            True,
            200,
            1,
            None,
        )
        assert result.elapsed_s == 0.0
        [delivery] = receiver.deliveries()
        assert delivery.body == {
            "version": 1,
            "kind": "drain_request",
            "idempotency_key": KEY,
            "sent_at": clock.now(),
            "payload": PAYLOAD,
        }
        assert delivery.path == "/hooks/drain"
        assert delivery.idempotency_key == KEY
        assert delivery.headers["content-type"] == "application/json"
        assert delivery.headers["user-agent"] == f"fleetwatch/{fleetwatch.__version__}"
        assert delivery.headers["x-fleetwatch-idempotency-key"] == KEY
        assert delivery.headers["x-fleetwatch-timestamp"] == str(int(clock.now()))
        [request] = receiver.requests()
        assert verify(
            SECRET,
            request.headers["x-fleetwatch-timestamp"],
            request.body,
            request.headers["x-fleetwatch-signature"],
            now=clock.now(),
        )
        assert receiver.rejected == 0

    async def test_repeated_key_is_recorded_once(self, receiver, clock):
        """Sending the same action twice is harmless: the receiver answers 200 and keeps one."""
        sender = sender_for(receiver, clock)
        first = await sender.send(PAYLOAD, KEY)
        second = await sender.send(PAYLOAD, KEY)

        assert (first.delivered, second.delivered) == (True, True)
        assert len(receiver.deliveries()) == 1
        assert receiver.duplicates == 1

    async def test_wait_for_counts_deliveries(self, receiver, clock):
        """wait_for times out before a delivery and returns at once after it."""
        assert not receiver.wait_for(1, timeout_s=0.01)
        await sender_for(receiver, clock).send(PAYLOAD, KEY)
        assert receiver.wait_for(1, timeout_s=1.0)


class TestRetries:
    async def test_two_503s_then_success_with_one_key(self, receiver, clock):
        """After two 503s the third attempt lands; every attempt has the same key and body,
        a fresh timestamp and signature, and the receiver records one delivery."""
        receiver.fail_next(2, 503)
        result = await sender_for(receiver, clock).send(PAYLOAD, KEY)

        assert (result.delivered, result.status, result.attempts) == (True, 200, 3)
        assert result.elapsed_s == 3.0  # waited 1 s, then 2 s
        requests = receiver.requests()
        assert [r.status for r in requests] == [503, 503, 200]
        assert {r.headers["x-fleetwatch-idempotency-key"] for r in requests} == {KEY}
        assert len({r.body for r in requests}) == 1
        stamps = [int(r.headers["x-fleetwatch-timestamp"]) for r in requests]
        assert [b - stamps[0] for b in stamps] == [0, 1, 3]
        assert len({r.headers["x-fleetwatch-signature"] for r in requests}) == 3
        assert len(receiver.deliveries()) == 1

    async def test_400_is_not_retried(self, receiver, clock):
        """A client error other than 429 is final: one request, not delivered, error says why."""
        receiver.fail_next(1, 400)
        result = await sender_for(receiver, clock).send(PAYLOAD, KEY)

        assert (result.delivered, result.status, result.attempts) == (False, 400, 1)
        assert result.error is not None
        assert result.error.startswith("HTTP 400")
        assert "failure injected" in result.error
        assert len(receiver.requests()) == 1
        assert receiver.deliveries() == []

    async def test_429_retry_after_is_honoured(self, receiver, clock):
        """A 429 with Retry-After: 5 makes the sender wait 5 s, not its own 0.25 s."""
        receiver.fail_next(1, 429, retry_after="5")
        sender = sender_for(receiver, clock, backoff_initial_s=0.25)
        result = await sender.send(PAYLOAD, KEY)

        assert (result.delivered, result.attempts) == (True, 2)
        assert result.elapsed_s == 5.0
        stamps = [int(r.headers["x-fleetwatch-timestamp"]) for r in receiver.requests()]
        assert stamps[1] - stamps[0] == 5

    async def test_retry_after_is_bounded_by_backoff_max(self, receiver, clock):
        """A receiver asking for an hour's pause gets backoff_max_s at most."""
        receiver.fail_next(1, 429, retry_after="3600")
        result = await sender_for(receiver, clock, backoff_max_s=4.0).send(PAYLOAD, KEY)

        assert (result.delivered, result.attempts) == (True, 2)
        assert result.elapsed_s == 4.0

    async def test_5xx_gives_up_after_max_attempts(self, receiver, clock):
        """A receiver that keeps failing gets exactly max_attempts requests, then a result."""
        receiver.fail_next(10, 500)
        result = await sender_for(receiver, clock, max_attempts=3).send(PAYLOAD, KEY)

        assert (result.delivered, result.status, result.attempts) == (False, 500, 3)
        assert result.error is not None
        assert result.error.startswith("HTTP 500")
        assert len(receiver.requests()) == 3
        assert result.elapsed_s == 3.0

    async def test_receiver_down_fails_quickly_without_raising(self):
        """With nothing listening, the delivery ends after max_attempts with the connection
        error, on the real clock, in well under a second."""
        url = f"http://127.0.0.1:{free_port()}/hook"
        sender = WebhookSender(
            url, SECRET, SystemClock(), max_attempts=3, backoff_initial_s=0.01, backoff_max_s=0.02
        )
        result = await sender.send(PAYLOAD, KEY)

        assert (result.delivered, result.status, result.attempts) == (False, None, 3)
        assert result.error is not None
        assert "ConnectionRefusedError" in result.error
        assert result.elapsed_s < 2.0

    async def test_silent_receiver_times_out_and_is_retried(self):
        """A receiver that accepts the connection but never answers costs timeout_s per attempt."""
        with socket.socket() as listener:
            listener.bind(("127.0.0.1", 0))
            listener.listen(8)
            port = listener.getsockname()[1]
            sender = WebhookSender(
                f"http://127.0.0.1:{port}/hook",
                SECRET,
                SystemClock(),
                timeout_s=0.2,
                max_attempts=2,
                backoff_initial_s=0.01,
            )
            result = await sender.send(PAYLOAD, KEY)

        assert (result.delivered, result.status, result.attempts) == (False, None, 2)
        assert result.error is not None
        assert "TimeoutError" in result.error
        assert 0.4 <= result.elapsed_s < 2.0

    async def test_logs_name_no_secret_signature_or_path(self, receiver, clock):
        """Retry logs are key-value events that leave out the secret, signatures and URL path."""
        receiver.fail_next(1, 503)
        sender = WebhookSender(f"{receiver.url}/hooks/token-abc123", SECRET, clock)
        with capture_logs() as logs:
            result = await sender.send(PAYLOAD, KEY)

        assert result.delivered
        assert [e["event"] for e in logs] == ["webhook_attempt_failed", "webhook_delivered"]
        assert logs[0]["status"] == 503
        assert logs[0]["retry_in_s"] == 0.5
        text = repr(logs)
        assert SECRET.decode() not in text
        assert "token-abc123" not in text
        for request in receiver.requests():
            assert request.headers["x-fleetwatch-signature"].removeprefix("sha256=") not in text


def replay(receiver: WebhookReceiver, body: bytes, headers: dict[str, str]) -> int:
    """POST ``body`` with ``headers`` as they were captured (or altered); return the status."""
    connection = http.client.HTTPConnection("127.0.0.1", receiver.port, timeout=2)
    try:
        connection.request("POST", "/hooks/drain", body=body, headers=headers)
        response = connection.getresponse()
        response.read()
    finally:
        connection.close()
    return response.status


class TestReplay:
    async def test_replay_with_a_new_idempotency_header_is_handled_once(self, receiver, clock):
        """A captured drain request sent again inside the window, its unsigned idempotency header
        changed (or dropped), is not a new delivery: the receiver goes by the signed body's key."""
        await sender_for(receiver, clock).send(PAYLOAD, KEY, kind="drain_request")
        [captured] = receiver.requests()
        signed = {
            name: captured.headers[name]
            for name in ("content-type", "x-fleetwatch-timestamp", "x-fleetwatch-signature")
        }

        statuses = [
            replay(receiver, captured.body, signed | {"X-Fleetwatch-Idempotency-Key": f"{KEY}:{n}"})
            for n in range(3)
        ]
        statuses.append(replay(receiver, captured.body, signed))  # no header at all

        assert statuses == [400, 400, 400, 200]
        assert receiver.mismatched == 3
        assert receiver.duplicates == 1
        [delivery] = receiver.deliveries()
        assert delivery.idempotency_key == KEY
        assert delivery.body["payload"] == PAYLOAD

    def test_body_without_idempotency_key_is_refused(self, clock):
        """An envelope without its own key cannot be de-duplicated safely: 400, not recorded."""
        with WebhookReceiver(clock=clock) as open_receiver:
            body = json.dumps({"version": 1, "kind": "drain_request", "payload": {}}).encode()
            status = replay(open_receiver, body, {"X-Fleetwatch-Idempotency-Key": KEY})

            assert status == 400
            assert open_receiver.deliveries() == []


class TestSignatures:
    async def test_wrong_secret_is_rejected_and_not_retried(self, receiver, clock):
        """A signature made with another secret gets 401 once; nothing is recorded."""
        result = await sender_for(receiver, clock, secret=b"not-the-secret").send(PAYLOAD, KEY)

        assert (result.delivered, result.status, result.attempts) == (False, 401, 1)
        assert result.error is not None
        assert "signature does not match" in result.error
        assert receiver.rejected == 1
        assert receiver.deliveries() == []

    async def test_stale_timestamp_is_rejected(self, receiver, clock):
        """A sender whose clock is ten minutes behind is refused as a possible replay."""
        late_clock = FakeClock(start_unix=clock.now() - 600)
        result = await sender_for(receiver, late_clock).send(PAYLOAD, KEY)

        assert (result.delivered, result.status) == (False, 401)
        assert result.error is not None
        assert "outside the accepted window" in result.error
        assert receiver.deliveries() == []

    async def test_unsigned_sender_to_verifying_receiver_is_rejected(self, receiver, clock):
        """A receiver with a secret refuses requests that carry no signature."""
        result = await sender_for(receiver, clock, secret=None).send(PAYLOAD, KEY)

        assert (result.delivered, result.status, result.attempts) == (False, 401, 1)
        assert receiver.rejected == 1

    async def test_unsigned_sender_and_receiver(self, clock):
        """A receiver built without a secret accepts an unsigned sender's deliveries."""
        with WebhookReceiver(clock=clock) as open_receiver:
            result = await sender_for(open_receiver, clock, secret=None).send(PAYLOAD, KEY)
            [delivery] = open_receiver.deliveries()

        assert (result.delivered, result.status) == (True, 200)
        assert "x-fleetwatch-signature" not in delivery.headers
        assert delivery.body["payload"] == PAYLOAD

    def test_missing_headers_get_401_with_a_json_error(self, receiver):
        """A bare POST without signature headers is answered 401 with a JSON error body."""
        connection = http.client.HTTPConnection("127.0.0.1", receiver.port, timeout=2)
        try:
            connection.request("POST", "/hook", body=b"{}", headers={"Content-Type": "json"})
            response = connection.getresponse()
            answer = json.loads(response.read())
        finally:
            connection.close()

        assert response.status == 401
        assert "X-Fleetwatch-Signature" in answer["error"]
        assert receiver.rejected == 1
