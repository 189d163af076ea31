"""The rules route of the JSON API: a dry run of rules on the live fleet.

    POST /api/v1/rules/eval    {} (the running rules) or {"rules": "<a rule file's YAML>"}:
                               evaluate them once on every target now and answer what holds,
                               whether it would fire, and what each action would meet

It changes nothing (no incident, no action, no limit moves: collector/incidents/dry_run.py),
but it runs rules a caller wrote on every target, on the collector's loop: a POST, let through
the same Host, Origin, token and Content-Type checks as every change, so that any local user or
web page cannot make the collector spend its loop on it.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Final

from collector.api.incidents import ApiError, json_object
from collector.incidents.dry_run import dry_run
from collector.incidents.service import _LoopBridge
from rules.exceptions import RulesError
from rules.loader import parse_rules

if TYPE_CHECKING:
    from collections.abc import Callable

    from collector.incidents.dry_run import ActionCheck
    from collector.incidents.evaluator import Evaluator
    from rules.model import ActionSpec, RuleSet

PATH: Final = "/api/v1/rules/eval"
SOURCE: Final = "the request's rules"


class RulesDesk(_LoopBridge):
    """Runs a dry run of rules for the HTTP thread, on the event loop."""

    what = "the rules desk"
    # One pass of every rule over every target, on the loop, and the wait for the loop.
    wait_s = 10.0

    def __init__(
        self,
        evaluator: Callable[[], Evaluator],
        check: ActionCheck | None,
        expand: Callable[[tuple[ActionSpec, ...]], tuple[ActionSpec, ...]],
    ) -> None:
        """``evaluator()`` is the running one (a reload swaps it); bind before use."""
        super().__init__()
        self._evaluator = evaluator
        self._check = check
        self._expand = expand

    def evaluate(self, rules: RuleSet | None) -> dict[str, Any]:
        """The dry run of ``rules`` (None: the running rules), as JSON."""

        async def run() -> dict[str, Any]:
            live = self._evaluator()
            return dry_run(live, rules or live.rules, self._check, self._expand).to_json()

        return self._call(run())


def claims(method: str, path: str) -> bool:
    """Whether this module answers the change."""
    return method == "POST" and path == PATH


def change(body: bytes, desk: RulesDesk | None) -> tuple[HTTPStatus, object]:
    """Answer the POST: 400 with every problem of rules that do not load."""
    if desk is None:
        raise ApiError(HTTPStatus.NOT_FOUND, "this collector evaluates no rules")
    data = json_object(body, "a dry run")
    if set(data) - {"rules"}:
        raise ApiError(HTTPStatus.BAD_REQUEST, 'a dry run takes {} or {"rules": "<YAML>"}')
    text = data.get("rules")
    if text is not None and not isinstance(text, str):
        raise ApiError(HTTPStatus.BAD_REQUEST, "rules is the text of a rule file (YAML)")
    try:
        rules = parse_rules(text, SOURCE) if text is not None else None
    except RulesError as exc:
        raise ApiError(HTTPStatus.BAD_REQUEST, f"the rules do not load: {exc}"[:4000]) from exc
    return HTTPStatus.OK, desk.evaluate(rules)
