"""The server span of every request (docs/architecture.md §7, "Traces").

Pure ASGI, outermost, for the reason ``ragserve.http.telemetry.RequestCountingMiddleware`` gives.
With tracing off it hands the request on untouched.
"""

from __future__ import annotations

from typing import Any

from opentelemetry.trace import SpanKind, Status, StatusCode

from ragserve import tracing

#: The response header that names the request's trace (W3C Trace Context: the server span's
#: ``traceparent``; a client that sent one gets its own trace id back).
TRACEPARENT = b"traceparent"


class TracingMiddleware:
    """One SERVER span per HTTP request, after the HTTP semantic conventions, child of the client's
    ``traceparent`` when it sent one. It is named ``{method} {route template}`` once routed, carries
    the RAG mode and reason the application answered with (``X-RAG-Mode``/``X-RAG-Reason``) and ends
    with the last byte of the body (a stream's too), or when the request fails."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if not tracing.ENABLED or scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method = scope.get("method", "")
        incoming = {}
        for k, v in scope.get("headers", []):
            if k in (b"traceparent", b"tracestate"):
                incoming[k.decode("latin-1")] = v.decode("latin-1")
        attributes: dict[str, Any] = {
            "http.request.method": method,
            "url.path": tracing.bounded(scope.get("path", "")),
            "url.scheme": scope.get("scheme", "http"),
        }
        server = scope.get("server")
        if server:
            attributes["server.address"] = str(server[0])
            if server[1] is not None:
                attributes["server.port"] = int(server[1])
        span = tracing.start(method, attributes, SpanKind.SERVER, parent=tracing.extract(incoming))
        header = tracing.traceparent(span)
        status = 0

        async def traced_send(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = list(message.get("headers", []))
                found = {k.lower(): v for k, v in headers}
                mode = found.get(b"x-rag-mode", b"").decode("latin-1")
                reason = found.get(b"x-rag-reason", b"").decode("latin-1") or None
                tracing.set_attributes(
                    span,
                    {
                        "http.response.status_code": status,
                        "ragserve.rag_mode": mode or None,
                        # a passthrough's reason (no_index, tools...); a RAG answer's (not_covered)
                        "ragserve.passthrough_reason" if mode == "passthrough" else "ragserve.rag_reason": reason,
                    },
                )
                if header is not None:
                    headers.append((TRACEPARENT, header.encode("latin-1")))
                    message = {**message, "headers": headers}
            await send(message)

        try:
            with tracing.use(span):
                await self.app(scope, receive, traced_send)
        except BaseException as e:
            tracing.failed(span, e)
            raise
        finally:
            route = getattr(scope.get("route"), "path", None)
            try:
                if route:
                    span.set_attribute("http.route", route)
                    span.update_name(f"{method} {route}")
                if status >= 500:
                    span.set_status(Status(StatusCode.ERROR))
            finally:
                span.end()
