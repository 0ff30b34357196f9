"""``GET /usage``: what each API key used, per index, for an admin key (docs/architecture.md §7)."""

from __future__ import annotations

import time
from datetime import UTC, date, datetime

from fastapi import APIRouter, Query, Request

from ragserve.api.usage import UsageReport
from ragserve.errors import ServiceError
from ragserve.http.errors import DOCUMENT_ERRORS
from ragserve.http.routes.common import allow
from ragserve.service.access import Role
from ragserve.service.usage import DAY_S, scoped_report
from ragserve.service.wiring import Services

_WHAT = (
    "send an ISO 8601 date (2026-01-31) or date and time (2026-01-31T12:00:00Z; without a zone, UTC), or unix seconds"
)


def parse_time(value: str, param: str) -> float:
    """Unix seconds from an ISO 8601 date or datetime (UTC unless it says) or a number of unix seconds;
    a 422 that says what to send."""
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            if len(text) == 10:
                day = date.fromisoformat(text)
                return datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp()
            moment = datetime.fromisoformat(text)
        except ValueError:
            raise ServiceError(
                f"{param}={value!r} is not a time: {_WHAT}", status=422, param=param, type_="invalid_request_error"
            ) from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        return moment.timestamp()
    if not 0 <= seconds < 1e11:
        raise ServiceError(
            f"{param}={value!r} is out of range: {_WHAT}", status=422, param=param, type_="invalid_request_error"
        )
    return seconds


def usage_router(services: Services) -> APIRouter:
    router = APIRouter(tags=["usage"], responses=DOCUMENT_ERRORS)

    @router.get("/usage")
    async def usage(
        request: Request,
        since: str | None = Query(
            None, max_length=64, description="Start (ISO 8601 date or datetime, or unix seconds); default: today, UTC."
        ),
        until: str | None = Query(None, max_length=64, description="End (exclusive); default: now."),
    ) -> UsageReport:
        """Requests, tokens (prompt, completion, embedding), documents and bytes per API key name and
        index, in hourly buckets: the hours that overlap [since, until). Needs the admin role; a key
        scoped to some indexes sees only their rows."""
        principal = allow(request, Role.ADMIN)
        now = time.time()
        start = parse_time(since, "since") if since is not None else now // DAY_S * DAY_S
        end = parse_time(until, "until") if until is not None else now
        if end < start:
            future = until is None  # only since was sent, and it is after now
            raise ServiceError(
                "since is in the future: send a time before now"
                if future
                else "until is before since: send a later until (or none, for now)",
                status=422,
                param="since" if future else "until",
                type_="invalid_request_error",
            )
        await services.meter.flush()  # what this replica still holds is counted too
        return scoped_report(await services.ingestion.usage.report(start, end), principal)

    return router
