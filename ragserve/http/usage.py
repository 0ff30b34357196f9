"""Metering every API request and admitting those of keys with limits (docs/architecture.md §7).

A pure ASGI middleware inside authentication (it reads the key's ``Principal``), for the same
reason as ``ragserve.http.telemetry``: no ``BaseHTTPMiddleware`` on the hot path. Every request
but the open probes and the playground's assets is counted (and, for a key with limits, admitted
first: one call to the owner of the ledger; refused, a 429 that names the limit with ``Retry-After``
and OpenAI's ``x-ratelimit-*`` headers, which an admitted request's response carries too). Routes
add what they know to the request's :class:`RequestUsage` (``usage_of``): its indexes (``allow``),
tokens, documents; the middleware hands it to the meter once the response has been sent, so
counting never delays a response and a stream is never cut off.
"""

from __future__ import annotations

import logging

from starlette.requests import Request

from ragserve.http.asgi import ASGIApp, ASGIMessage, Receive, Scope, Send
from ragserve.http.errors import error_bytes, ratelimit_headers, route_path, send_error
from ragserve.http.security import OPEN_PATHS, OPEN_PREFIXES, principal_of
from ragserve.service.usage import KeyLimits, RateLimitError, RequestUsage, UsageMeter

log = logging.getLogger(__name__)

USAGE = "ragserve.usage"  # where the request's RequestUsage is kept in the request state


def usage_of(request: Request | Scope) -> RequestUsage | None:
    """The usage record of this request; None for one that is not metered (the open paths, or an
    application built without the middleware)."""
    scope = request.scope if isinstance(request, Request) else request
    found = scope.get("state", {}).get(USAGE)
    return found if isinstance(found, RequestUsage) else None


class UsageMiddleware:
    def __init__(self, app: ASGIApp, meter: UsageMeter):
        self.app = app
        self.meter = meter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = route_path(scope) if scope["type"] == "http" else ""
        if scope["type"] != "http" or path in OPEN_PATHS or path.startswith(OPEN_PREFIXES):
            await self.app(scope, receive, send)
            return
        principal = principal_of(scope)
        record = RequestUsage(principal.name, principal.limited)
        extra: list[tuple[bytes, bytes]] = []
        if principal.limited:
            try:
                decision = await self.meter.admit(principal.name, KeyLimits.of(principal))
            except Exception:  # the ledger's owner cannot answer: refused, not let through uncounted
                log.exception("could not admit a request of key %r", principal.name)
                body = error_bytes(
                    path,
                    "The usage ledger that enforces this key's limits is not reachable; try again shortly.",
                    type_="server_error",
                    code="usage_unavailable",
                )
                await send_error(send, 503, body, [(b"retry-after", b"1")])
                return
            extra = ratelimit_headers(decision)
            if not decision.allowed:
                err = RateLimitError(principal.name, decision)
                body = error_bytes(path, err.message, type_=err.type, code=err.code, openai_too=True)
                await send_error(send, 429, body, [(b"retry-after", str(err.retry_after).encode()), *extra])
                return
        scope.setdefault("state", {})[USAGE] = record
        status = 0

        async def metered_send(message: ASGIMessage) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                if extra:
                    message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        try:
            await self.app(scope, receive, metered_send)
        finally:
            self.meter.finish_soon(record, failed=not 0 < status < 400)  # after the response
