"""Counting every response for the metrics (docs/architecture.md, "Metrics")."""

from __future__ import annotations

from typing import Any

from app.telemetry import Telemetry


class RequestCountingMiddleware:
    """Reports every response by route template, status and RAG mode/reason headers.

    Pure ASGI on purpose: Starlette's ``BaseHTTPMiddleware`` (``@app.middleware("http")``) runs
    each request through an extra task group and response wrapper, about a millisecond a request
    on this class of machine, which the passthrough path cannot afford."""

    def __init__(self, app: Any, telemetry: Telemetry):
        self.app = app
        self.telemetry = telemetry

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        def route() -> str:  # the router records the matched route in the shared scope
            return getattr(scope.get("route"), "path", "unmatched")

        async def counting_send(message: dict[str, Any]) -> None:
            nonlocal started
            if message["type"] == "http.response.start" and not started:
                started = True
                headers = {k.lower(): v for k, v in message.get("headers", [])}
                self.telemetry.request(
                    route(),
                    message["status"],
                    headers.get(b"x-rag-mode", b"").decode("latin-1"),
                    headers.get(b"x-rag-reason", b"").decode("latin-1"),
                )
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        except Exception:
            if not started:
                self.telemetry.request(route(), 500)
            raise
