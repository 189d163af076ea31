"""The GETs' query parameters (issue 42): each endpoint takes its own, and times in three forms."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from collector.api.query import TAKES, BadRequestError, Params, endpoint, parse_time

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC).timestamp()


def read(name: str, text: str) -> Params:
    return Params.read(name, text, NOW)


class TestEndpoints:
    @pytest.mark.parametrize(
        ("path", "name"),
        [
            ("/metrics", "/metrics"),
            ("/metrics/fleet", "/metrics/fleet"),
            ("/metrics/shards/3", "/metrics/shards/<n>"),
            ("/api/v1/scrape_targets", "/api/v1/scrape_targets"),
            ("/api/v1/nodes", "/api/v1/nodes"),
            ("/api/v1/nodes/node-07", "/api/v1/nodes/<name>"),
            ("/api/v1/nodes/node-07/evidence", "/api/v1/nodes/<name>/evidence"),
            ("/api/v1/nodes/evidence", "/api/v1/nodes/<name>"),
            ("/api/v1/nodes/node-07/evidence/x", "/api/v1/nodes/<name>"),
            ("/api/v1/nodes/node-07/lifecycle", "/api/v1/nodes/<name>/lifecycle"),
            ("/api/v1/events", "/api/v1/events"),
            ("/api/v1/incidents", "/api/v1/incidents"),
            ("/api/v1/actions", "/api/v1/actions"),
            ("/api/v1/silences", "/api/v1/silences"),
            ("/api/v1/drains", "/api/v1/drains"),
            ("/api/v1/jobs", "/api/v1/jobs"),
            ("/api/v1/jobs/slurm/1234", "/api/v1/jobs/<id>"),
            ("/api/v1/preflight", "/api/v1/preflight"),
            ("/api/v1/preflight/latest", "/api/v1/preflight/<id>"),
            ("/api/v1/reliability", "/api/v1/reliability"),
            ("/healthz", None),
            ("/api/v1/nope", None),
            ("/metrics/other", None),
        ],
    )
    def test_each_get_path_is_one_endpoint(self, path, name):
        """Every GET path but /healthz belongs to one endpoint of the table; unknown ones none."""
        assert endpoint(path) == name

    def test_the_table_is_the_contract(self):
        """The parameters each endpoint takes, as the CLI is written against them."""
        assert {k: sorted(v) for k, v in TAKES.items() if v} == {
            "/api/v1/nodes/<name>/evidence": ["since"],
            "/api/v1/nodes/<name>/lifecycle": ["since"],
            "/api/v1/events": ["after", "kind", "limit", "node", "order", "since", "until"],
            "/api/v1/incidents": ["limit", "node", "open", "rule", "since", "until"],
            "/api/v1/actions": ["limit", "node", "since", "until"],
            "/api/v1/silences": ["node"],
            "/api/v1/drains": ["node"],
            "/api/v1/jobs": ["node"],
            "/api/v1/preflight": ["limit", "node"],
            "/api/v1/reliability": ["node", "window"],
        }


class TestUnknownParameters:
    def test_an_unknown_parameter_is_named_with_what_the_endpoint_takes(self):
        """Sorted, with the endpoint and its own parameters: today ?nodes= was ignored."""
        with pytest.raises(BadRequestError) as err:
            read("/api/v1/incidents", "foo=1&nodes=x&bar=&limit=5")
        assert str(err.value) == (
            "unknown query parameter(s) bar, foo, nodes for /api/v1/incidents; it takes limit, "
            "node, open, rule, since, until"
        )

    def test_an_endpoint_without_parameters_takes_none(self):
        """/metrics (Prometheus sends none), a node, a job: any parameter is refused."""
        for name in ("/metrics", "/api/v1/nodes/<name>", "/api/v1/jobs/<id>"):
            with pytest.raises(BadRequestError) as err:
                read(name, "x")
            assert str(err.value) == f"unknown query parameter(s) x for {name}; it takes none"
        assert read("/metrics", "").values == {}

    def test_names_are_cut_and_at_most_ten_named(self):
        """A name of 5,000 characters is cut to 40; of 15 unknown names, 10 are named."""
        long = "a" * 5000
        with pytest.raises(BadRequestError) as err:
            read("/api/v1/silences", "&".join([f"{long}=1", *(f"p{i:02}=1" for i in range(14))]))
        assert str(err.value) == (
            f"unknown query parameter(s) {'a' * 37}..., p00, p01, p02, p03, p04, p05, p06, p07, "
            "p08 and 5 more for /api/v1/silences; it takes node"
        )

    def test_a_name_that_is_not_printable_is_quoted(self):
        with pytest.raises(BadRequestError) as err:
            read("/api/v1/drains", "a%0Ab=1")
        assert "'a\\nb'" in str(err.value)

    def test_the_last_value_counts_and_an_empty_one_is_left_out(self):
        params = read("/api/v1/events", "node=a&node=b&kind=")
        assert params.text("node") == "b"
        assert params.text("kind") is None


class TestValues:
    def test_integers_in_range(self):
        params = read("/api/v1/events", "limit=20&after=x")
        assert params.integer("limit", 100, 1, 1000) == 20
        assert params.integer("missing", 7, 1, 10) == 7
        with pytest.raises(BadRequestError, match=r"after='x' is not a whole number"):
            params.integer("after", 0, 0, 10)
        for bad in ("0", "1001", "-1", "1_0", "\u0663", "9" * 30):
            with pytest.raises(BadRequestError, match="limit"):
                read("/api/v1/events", f"limit={bad}").integer("limit", 100, 1, 1000)

    def test_flags(self):
        """open=1|true|0|false; open=yes is refused rather than read as false."""
        assert read("/api/v1/incidents", "open=1").flag("open")
        assert read("/api/v1/incidents", "open=TRUE").flag("open")
        assert not read("/api/v1/incidents", "open=0").flag("open")
        assert not read("/api/v1/incidents", "").flag("open")
        with pytest.raises(BadRequestError, match="must be 1, true, 0 or false"):
            read("/api/v1/incidents", "open=yes").flag("open")

    def test_choices(self):
        params = read("/api/v1/events", "order=sideways")
        assert params.choice("kind", {"xid"}, None) is None
        with pytest.raises(BadRequestError, match="order='sideways' is not one of asc, desc"):
            params.choice("order", ("asc", "desc"), "asc")


class TestTimes:
    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            ("30m", NOW - 1800),
            ("2h", NOW - 7200),
            ("1d", NOW - 86400),
            ("90s", NOW - 90),
            ("1h30m", NOW - 5400),
            ("2026-12-02T03:00", datetime(2026, 12, 2, 3, tzinfo=UTC).timestamp()),
            ("2026-12-02T03:00:00Z", datetime(2026, 12, 2, 3, tzinfo=UTC).timestamp()),
            ("2026-12-02T03:00:00+01:00", datetime(2026, 12, 2, 2, tzinfo=UTC).timestamp()),
            ("2026-12-02", datetime(2026, 12, 2, tzinfo=UTC).timestamp()),
            ("1764644400", 1764644400.0),
            ("1764644400.25", 1764644400.25),
        ],
    )
    def test_the_three_forms(self, text, expected):
        """A duration back from now, ISO-8601 (no zone: UTC, whatever the host's zone), Unix s."""
        assert parse_time("since", text, NOW) == expected

    @pytest.mark.parametrize("text", ["yesterday", "2026-13-01", "-5m", "5 m", "1e9", "12:00"])
    def test_a_bad_time_names_the_parameter_and_the_forms(self, text):
        with pytest.raises(BadRequestError) as err:
            parse_time("until", text, NOW)
        assert str(err.value).startswith("query parameter until=")
        assert "a duration back from now (30m, 2h, 1d, 90s), an ISO-8601 time" in str(err.value)
        assert "Unix seconds" in str(err.value)

    def test_a_duration_out_of_range_says_so(self):
        with pytest.raises(BadRequestError, match=r"since: duration '400d' is out of range"):
            parse_time("since", "400d", NOW)

    def test_a_window_in_milliseconds_in_order(self):
        """since and until in Unix ms; since after until is a 400 naming both."""
        since, until = read("/api/v1/actions", "since=2h&until=2026-12-02T11:00Z").window()
        assert (since, until) == (int((NOW - 7200) * 1000), int((NOW - 3600) * 1000))
        assert read("/api/v1/actions", "").window() == (None, None)
        with pytest.raises(BadRequestError, match=r"since='1h' is after until='2h'"):
            read("/api/v1/actions", "since=1h&until=2h").window()
