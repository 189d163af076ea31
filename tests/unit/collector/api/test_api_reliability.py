"""GET /api/v1/reliability: its window is checked, an unknown node is a 404."""

import re
from http import HTTPStatus

import pytest

from collector.api.query import BadRequestError, Params
from collector.api.reliability import get, window_s

PATH = "/api/v1/reliability"


def params(query: str) -> Params:
    return Params.read(PATH, query, 1_800_000_000.0)


class TestWindow:
    def test_thirty_days_unless_asked(self):
        assert window_s(params("")) == 30 * 86400.0
        assert window_s(params("window=7d")) == 7 * 86400.0
        assert window_s(params("window=1h30m")) == 5400.0

    @pytest.mark.parametrize(
        ("query", "says"),
        [
            ("window=soon", "window='soon' is not a duration (30d, 12h, 90m)"),
            ("window=30m", "window='30m' must be from 1h to 365d"),
            ("window=366d", "window='366d' must be from 1h to 365d"),
            ("window=400d", "window='400d' is not a duration"),
        ],
    )
    def test_a_bad_window_is_a_400(self, query, says):
        with pytest.raises(BadRequestError, match=re.escape(says)):
            window_s(params(query))

    def test_other_parameters_are_refused(self):
        with pytest.raises(BadRequestError, match="unknown query parameter"):
            params("since=1d")


class TestGet:
    def test_the_answer_gets_the_node_and_the_window(self):
        asked = []

        def answer(node, seconds):
            asked.append((node, seconds))
            return {"ok": True}

        assert get(params("node=n1&window=2d"), answer) == (HTTPStatus.OK, {"ok": True})
        assert get(params(""), answer) == (HTTPStatus.OK, {"ok": True})
        assert asked == [("n1", 172800.0), (None, 30 * 86400.0)]

    def test_an_unknown_node_or_no_figures_is_a_404(self):
        status, body = get(params("node=n9"), lambda _n, _w: None)
        assert (status, body) == (HTTPStatus.NOT_FOUND, {"error": "no node named 'n9'"})
        status, body = get(params(""), None)
        assert status == HTTPStatus.NOT_FOUND
