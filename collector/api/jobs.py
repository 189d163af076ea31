"""The job route of the JSON API that acts: gathering a job's evidence on demand.

    POST /api/v1/jobs/<id>/dump    {}: ask the agents of the job's nodes for each rank's process
                                   state and stack now, and answer {"job": id, "evidence": ...}
                                   (as ``evidence`` in ``GET /api/v1/jobs/<id>``)

It is a change: the agents run a stack dumper on the ranks' processes. The server lets it through
the same Host, Origin, token and Content-Type checks as every other change before it gets here.
The reads (``GET /api/v1/jobs``, ``/api/v1/jobs/<id>``) are the server's.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import unquote

from collector.api.incidents import ApiError, json_object
from collector.incidents.service import _LoopBridge
from collector.jobs.evidence import DUMP_TIMEOUT_S, GUARD_S

if TYPE_CHECKING:
    from collector.jobs.book import JobBook

PREFIX: Final = "/api/v1/jobs/"
SUFFIX: Final = "/dump"


class JobDesk(_LoopBridge):
    """Gathers a job's evidence for the HTTP thread, on the event loop."""

    what = "the job desk"
    # The agents' time to dump, and the loop's to take the request up: the CLI waits longer.
    wait_s = DUMP_TIMEOUT_S + GUARD_S + 4.0

    def __init__(self, book: JobBook) -> None:
        """Bind to the running loop with :meth:`bind` before use."""
        super().__init__()
        self._book = book

    def dump(self, job_id: str) -> dict[str, Any] | None:
        """The job's evidence, gathered now (``{}``: no agent can be asked; None: no such job)."""
        return self._call(self._book.dump(job_id))


def claims(method: str, path: str) -> bool:
    """Whether this module answers the change."""
    return (
        method == "POST"
        and path.startswith(PREFIX)
        and path.endswith(SUFFIX)
        and len(path) > len(PREFIX) + len(SUFFIX)
    )


def change(path: str, body: bytes, desk: JobDesk | None) -> tuple[HTTPStatus, object]:
    """Answer a POST this module :func:`claims`."""
    if desk is None:
        raise ApiError(HTTPStatus.NOT_FOUND, "this collector does not follow jobs")
    if json_object(body, "a dump"):
        raise ApiError(HTTPStatus.BAD_REQUEST, "a dump takes no keys: send {}")
    job_id = unquote(path.removeprefix(PREFIX).removesuffix(SUFFIX))
    evidence = desk.dump(job_id)
    if evidence is None:
        return HTTPStatus.NOT_FOUND, {"error": f"no job {job_id[:200]!r}"}
    if not evidence:
        return HTTPStatus.CONFLICT, {"error": "this collector cannot ask agents for dumps"}
    return HTTPStatus.OK, {"job": job_id, "evidence": evidence}
