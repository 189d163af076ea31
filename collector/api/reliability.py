"""``GET /api/v1/reliability[?node=NAME&window=30d]``: the fleet's or a node's reliability.

Time between incidents, time to repair, GPU time lost, remediations and lemons.
``window`` is a duration (``30d`` by default, from ``1h`` to ``365d``); the counts a lemon is
judged by are always the last 7 days'. The collector computes the answer from its journal on
the API's thread (collector.reliability); docs/oncall.md "Reliability and lemon nodes" says
what each figure is.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Final

from collector.api.query import BadRequestError
from fleetwatch.config_file import short_repr
from rules.durations import parse_duration

if TYPE_CHECKING:
    from collections.abc import Callable

    from collector.api.query import Params

__all__ = ["MAX_WINDOW_S", "MIN_WINDOW_S", "PATH", "get", "window_s"]

PATH: Final = "/api/v1/reliability"
DEFAULT_WINDOW_S: Final = 30 * 86_400.0
MIN_WINDOW_S: Final = 3600.0
MAX_WINDOW_S: Final = 365 * 86_400.0


def window_s(params: Params) -> float:
    """The ``window`` parameter in seconds (30 days when not given)."""
    text = params.text("window")
    if text is None:
        return DEFAULT_WINDOW_S
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        msg = f"query parameter window={short_repr(text, 40)} is not a duration (30d, 12h, 90m)"
        raise BadRequestError(msg) from exc
    if not MIN_WINDOW_S <= seconds <= MAX_WINDOW_S:
        msg = f"query parameter window={short_repr(text, 40)} must be from 1h to 365d"
        raise BadRequestError(msg)
    return seconds


def get(
    params: Params, answer: Callable[[str | None, float], dict[str, Any] | None] | None
) -> tuple[HTTPStatus, object]:
    """Answer the endpoint through ``answer(node or None, window seconds)``.

    404 for a node nobody knows (``answer`` gives None), or when this collector keeps none.
    """
    seconds = window_s(params)
    if answer is None:
        return HTTPStatus.NOT_FOUND, {"error": "this collector keeps no reliability figures"}
    node = params.text("node")
    found = answer(node, seconds)
    if found is None:
        return HTTPStatus.NOT_FOUND, {"error": f"no node named {short_repr(node or '', 80)}"}
    return HTTPStatus.OK, found
