"""``fleetwatch jobs JOB --dump``: the stacks grouped and the verdict, as the API answers them."""

from __future__ import annotations

import io
from typing import Any

import pytest

from cli import api as cli_api

TOKEN = "s3cret"  # noqa: S105 - a test token

SUSPECT = (
    "stack: waits in train (torch_job.py:126) while 3 ranks wait in all_reduce "
    "(distributed_c10d.py:3252)"
)
EVIDENCE: dict[str, Any] = {
    "gathered_at": 1767225600.0,
    "took_s": 1.25,
    "nodes": [
        {"node": "node-1", "took_s": 0.8, "ranks": 2, "error": ""},
        {"node": "node-2", "took_s": 1.2, "ranks": 2, "error": ""},
    ],
    "groups": [
        {
            "signature": [
                "all_reduce@/t/distributed_c10d.py:3252",
                "wrapper@/t/c10d_logger.py:83",
            ],
            "where": "all_reduce (distributed_c10d.py:3252)",
            "collective": True,
            "ranks": [0, 1, 3],
            "count": 3,
        },
        {
            "signature": ["train@/opt/torch_job.py:126"],
            "where": "train (torch_job.py:126)",
            "collective": False,
            "ranks": [2],
            "count": 1,
        },
    ],
    "unknown": [],
    "suspects": [
        {
            "rank": 2,
            "node": "node-2",
            "why": SUSPECT,
        }
    ],
    "verdict": "rank 2 waits in train (torch_job.py:126) while 3 ranks wait in all_reduce "
    "(distributed_c10d.py:3252)",
    "ranks": [],
}


def test_the_dump_prints_the_verdict_the_suspects_and_the_groups(monkeypatch):
    """It POSTs with the token, waits longer than a read, and prints a table of groups."""
    sent: list[tuple[Any, ...]] = []

    def call(api: str, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        sent.append((method, path, body, kw))
        return {"job": "run/7", "evidence": EVIDENCE}

    monkeypatch.setattr(cli_api, "call", call)
    out = io.StringIO()
    assert cli_api.jobs("http://x", "run/7", output="table", out=out, dump=True, token=TOKEN) == 0
    assert sent == [
        (
            "POST",
            "/api/v1/jobs/run%2F7/dump",
            {},
            {"token": TOKEN, "timeout_s": cli_api.DUMP_TIMEOUT_S},
        )
    ]
    lines = out.getvalue().splitlines()
    assert lines[0] == "job run/7: stacks gathered in 1.2 s (node-1 0.8 s, node-2 1.2 s)"
    assert lines[1] == EVIDENCE["verdict"]
    assert lines[2] == f"  suspect: rank 2 on node-2: {SUSPECT}"
    assert lines[3].split() == ["RANKS", "COUNT", "WAITS", "IN", "SIGNATURE"]
    assert lines[4].split()[:4] == ["0,1,3", "3", "all_reduce", "(distributed_c10d.py:3252)"]
    assert "(collective)" in lines[4]
    assert lines[5].split()[:2] == ["2", "1"]


def test_the_dump_needs_a_job():
    with pytest.raises(cli_api.ApiCallError, match="--dump needs a JOB"):
        cli_api.jobs("http://x", None, output="table", out=io.StringIO(), dump=True)
