"""GET /summary and GET /summary/<route>[/<key>].

vmpooler's daily boot, clone and tag statistics over ``from``..``to`` (YYYY-MM-DD, default
today, UTC on the Redis server's clock), computed by :mod:`vmpool.api.summary` from the
store's daily hashes."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, date, datetime
from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from vmpool.api.deps import ApiState, State
from vmpool.api.errors import Rejected
from vmpool.api.responses import not_ok, reply
from vmpool.api.summary import (
    MAX_DAYS,
    day_range,
    summary_body,
    tag_summary,
    task_summary,
)
from vmpool.state.records import decode_hash

__all__ = ["router"]

router = APIRouter()

TASKS = ("boot", "clone", "tag")
_DATE_RE = re.compile(r"\d{4}-\d{2}-\d{2}")


def _dates(st: ApiState, request: Request) -> list[str]:
    """The days asked for, checked as vmpooler checks them (its messages, in JSON here)."""
    today = datetime.fromtimestamp(st.store.server_time(), UTC).date()
    given = [request.query_params.get(k) or today.isoformat() for k in ("from", "to")]
    parsed: list[date] = []
    for text in given:
        try:
            if not _DATE_RE.fullmatch(text):
                raise ValueError(text)
            parsed.append(date.fromisoformat(text))
        except ValueError:
            shown = text[:40]
            raise Rejected(
                400, message=f"Invalid date format '{shown}', must match YYYY-MM-DD."
            ) from None
    start, end = parsed
    if end < start:
        raise Rejected(400, message="Date range is invalid, 'to' cannot come before 'from'.")
    if start > today:
        raise Rejected(400, message="Date range is invalid, 'from' must be in the past.")
    if (end - start).days >= MAX_DAYS:
        raise Rejected(400, message=f"Date range is invalid, at most {MAX_DAYS} days.")
    return day_range(start, end)


def _read(st: ApiState, tasks: tuple[str, ...], dates: list[str]) -> dict[str, Any]:
    """task -> date -> that day's hash, in one round trip."""
    pipe = st.clients.text.pipeline(transaction=False)
    for task in tasks:
        for day in dates:
            pipe.hgetall(st.keys.summary_day(task, day))
    replies = iter(pipe.execute())
    return {task: {day: decode_hash(next(replies)) for day in dates} for task in tasks}


@router.get("/summary")
async def get_summary(request: Request, st: State) -> Response:
    def body() -> Response:
        days = _read(st, TASKS, _dates(st, request))
        return reply(200, summary_body(days))

    return await run_in_threadpool(body)


@router.get("/summary/{route}")
@router.get("/summary/{route}/{key}")
async def get_summary_route(
    route: str, request: Request, st: State, key: str | None = None
) -> Response:
    def body() -> Response:
        dates = _dates(st, request)
        if route not in TASKS:
            return not_ok(404)
        days: Mapping[str, Any] = _read(st, (route,), dates)[route]
        if route == "tag":
            return reply(200, tag_summary(days, key or None))
        return reply(200, task_summary(route, days, key or None))

    return await run_in_threadpool(body)
