"""POST /api/v1/jobs/<id>/dump: the route that gathers a job's evidence on demand."""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

import pytest

from collector.api import jobs as jobs_api
from collector.api.incidents import ApiError
from collector.api.jobs import JobDesk
from collector.testing import job_world


class FakeDesk(JobDesk):
    """Answers what it is told, remembering which jobs it was asked for."""

    def __init__(self, answer: dict[str, Any] | None) -> None:
        super().__init__(job_world().book)
        self.answer = answer
        self.asked: list[str] = []

    def dump(self, job_id: str) -> dict[str, Any] | None:
        self.asked.append(job_id)
        return self.answer


class TestDumpRoute:
    @pytest.mark.parametrize(
        ("method", "path", "claimed"),
        [
            ("POST", "/api/v1/jobs/llama/dump", True),
            ("POST", "/api/v1/jobs/slurm/1234/dump", True),
            ("POST", "/api/v1/jobs//dump", False),
            ("GET", "/api/v1/jobs/llama/dump", False),
            ("POST", "/api/v1/jobs/llama", False),
        ],
    )
    def test_only_a_post_naming_a_job_is_claimed(self, method, path, claimed):
        assert jobs_api.claims(method, path) is claimed

    def test_the_evidence_of_the_job_named_is_answered(self):
        """The id is unquoted, and may hold slashes (a job id may)."""
        desk = FakeDesk({"verdict": "rank 2 waits in ..."})
        status, answer = jobs_api.change("/api/v1/jobs/run%2F7/dump", b"{}", desk)
        assert (status, answer) == (
            HTTPStatus.OK,
            {"job": "run/7", "evidence": {"verdict": "rank 2 waits in ..."}},
        )
        assert desk.asked == ["run/7"]

    def test_an_unknown_job_is_404_and_no_broker_409(self):
        assert jobs_api.change("/api/v1/jobs/x/dump", b"", FakeDesk(None))[0] == (
            HTTPStatus.NOT_FOUND
        )
        assert jobs_api.change("/api/v1/jobs/x/dump", b"", FakeDesk({}))[0] == (HTTPStatus.CONFLICT)

    def test_a_body_with_keys_or_no_desk_is_refused(self):
        with pytest.raises(ApiError) as keys:
            jobs_api.change("/api/v1/jobs/x/dump", b'{"rank": 1}', FakeDesk({}))
        assert keys.value.status == HTTPStatus.BAD_REQUEST
        with pytest.raises(ApiError) as none:
            jobs_api.change("/api/v1/jobs/x/dump", b"{}", None)
        assert none.value.status == HTTPStatus.NOT_FOUND

    def test_the_desk_waits_for_the_agents_longer_than_other_changes(self):
        """The agents have 15 s to dump: the HTTP thread waits that and a margin, not 4 s."""
        assert JobDesk.wait_s > 20.0
