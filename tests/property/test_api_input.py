"""What an HTTP client controls in a request to the collector's API: headers, path, body.

Any ``Host``, ``Origin``, ``Content-Type`` or ``Content-Length``, any silence id and any body
give an answer or an ApiError with a short message (a 4xx), never another exception: an
exception escaping here would be a 500 with a traceback. What passes stays in range for the
journal (ids and times within 64 bits).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from hypothesis import example, given
from hypothesis import strategies as st

from collector.api.browsers import HostNames, content_type_refusal, split_authority
from collector.api.incidents import MAX_BODY, MAX_ID, ApiError, body_length, change
from tests.property.hostile import WEIRD_TEXT, assert_clear, deep, nested, tried

if TYPE_CHECKING:
    from collector.store.incidents import SilenceRow

TARGET = "api_input"
NAMES = HostNames.build(listen_host="127.0.0.1", allowed=("fleet.example.com",))
HEADER = st.one_of(st.none(), WEIRD_TEXT, st.text(max_size=300))
INT64 = 2**63 - 1


class Writer:
    """Takes silences as the journal would, checking they fit its 64-bit columns."""

    def add(self, row: SilenceRow) -> int:
        for value in (row.starts_ms, row.ends_ms, row.created_ms):
            assert -INT64 <= value <= INT64, row
        return 1

    def remove(self, silence_id: int, by: str = "") -> bool:  # noqa: ARG002
        assert 1 <= silence_id <= MAX_ID
        return True


class Drains:
    """Releases any node."""

    def drains(self) -> dict[str, object]:
        return {}

    def release(self, node: str, reason: str, by: str = "") -> bool:
        assert isinstance(node, str)
        assert len(reason) <= 500
        del by
        return True

    def move(self, node: str, move: str, reason: str, by: str = "") -> dict[str, Any]:
        assert isinstance(node, str)
        assert len(reason) <= 500
        del by
        return {"node": node, "state": move, "previous": "in_service"}


class TestHeaders:
    @given(host=HEADER, origin=HEADER, ctype=HEADER, length=st.integers(0, MAX_BODY))
    @example(host="[::1]:99999", origin="http://[::1", ctype="application/json;", length=0)
    @example(host="a" * 10_000, origin="http://" + "a" * 10_000 + ":80", ctype=None, length=1)
    def test_any_header_is_a_yes_or_a_refusal(self, host, origin, ctype, length):
        tried(TARGET)
        authority = split_authority(host) if host is not None else None
        assert authority is None or authority[0]
        for refusal in (
            NAMES.host_refusal(host),
            NAMES.origin_refusal(origin, host),
            content_type_refusal("POST", ctype, length),
        ):
            if refusal is not None:
                assert 400 <= refusal.status < 500
                assert_clear(refusal.message, limit=400)

    @given(values=st.lists(st.one_of(WEIRD_TEXT, st.integers().map(str)), max_size=3))
    @example(values=["abc"])
    @example(values=["1_0"])
    @example(values=[" +5"])
    @example(values=["9" * 5_000])
    @example(values=["٣"])
    def test_any_content_length_is_a_length_in_range_or_a_400(self, values):
        tried(TARGET)
        try:
            length = body_length(values)
        except ApiError as exc:
            assert exc.status in (400, 413)
            assert_clear(exc, "Content-Length", "larger than", limit=400)
        else:
            assert 0 <= length <= MAX_BODY


class TestChanges:
    @given(text=st.one_of(WEIRD_TEXT, st.integers().map(str), st.just(str(10**30))))
    @example(text=str(2**63))
    @example(text="0")
    @example(text="٣")
    def test_any_silence_id_is_removed_or_a_400(self, text):
        tried(TARGET)
        try:
            change("DELETE", f"/api/v1/silences/{text}", b"", writer=Writer(), now=1e9)
        except ApiError as exc:
            assert exc.status == 400
            assert_clear(exc, "silence id", limit=400)

    @given(
        body=st.one_of(
            st.binary(max_size=200),
            nested().map(lambda v: json.dumps(v).encode()),
            st.integers(1, 30_000).map(lambda n: deep(n).encode()),
            st.integers(1, 7_000).map(lambda n: deep(n, '{"node":', "}").encode()),
        ),
        path=st.sampled_from(["/api/v1/silences", "/api/v1/drains/node-1/release"]),
    )
    @example(body=b"\xff\xfe\xfa", path="/api/v1/silences")
    @example(body=b'{"duration": 1e308}', path="/api/v1/silences")
    @example(body=b'{"duration": "1h", "starts_in": NaN}', path="/api/v1/silences")
    def test_any_body_is_a_change_or_a_400(self, body, path):
        tried(TARGET)
        try:
            change("POST", path, body, writer=Writer(), now=1e9, drains=Drains())
        except ApiError as exc:
            assert exc.status == 400
            assert_clear(exc, limit=400)
