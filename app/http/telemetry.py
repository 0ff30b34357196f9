"""What the HTTP layer reports (ARCHITECTURE §7). The Ray Serve shell implements it with
``ray.serve.metrics``; tests use the recording or null implementation."""

from __future__ import annotations

from typing import Any, Protocol


class Telemetry(Protocol):
    def request(self, route: str, status: int, mode: str = "", reason: str = "") -> None: ...

    def latency(self, stage: str, seconds: float) -> None: ...

    def chat_tokens(self, context_tokens: int, history_tokens: int, history_dropped: int) -> None: ...

    def indexed(self, documents: int) -> None: ...

    def upstream_error(self, kind: str) -> None: ...


class NullTelemetry:
    def request(self, route: str, status: int, mode: str = "", reason: str = "") -> None:
        pass

    def latency(self, stage: str, seconds: float) -> None:
        pass

    def chat_tokens(self, context_tokens: int, history_tokens: int, history_dropped: int) -> None:
        pass

    def indexed(self, documents: int) -> None:
        pass

    def upstream_error(self, kind: str) -> None:
        pass


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
                self.telemetry.request(route(), message["status"],
                                       headers.get(b"x-rag-mode", b"").decode("latin-1"),
                                       headers.get(b"x-rag-reason", b"").decode("latin-1"))
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        except Exception:
            if not started:
                self.telemetry.request(route(), 500)
            raise
