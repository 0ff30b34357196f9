"""The request-body size limit, enforced while the body streams in, so a client cannot make the
server buffer more than the limit (a missing or lying ``Content-Length`` does not help). The other
limits are checked on parsed requests, where the message can name the field: ``ragserve.service.limits``.
"""

from __future__ import annotations

from collections.abc import Mapping

from ragserve.http.asgi import ASGIApp, ASGIMessage, Receive, Scope, Send
from ragserve.http.errors import error_bytes, route_path, send_error


class _BodyTooLarge(Exception):
    pass


class BodySizeMiddleware:
    """Answers 413 when the request body exceeds ``max_bytes``, declared or streamed; a path in
    ``path_limits`` (exact, without the route prefix) has its own limit instead: an upload route
    whose route checks its file's size itself, while it streams to disk (``POST /v1/files``)."""

    def __init__(self, app: ASGIApp, max_bytes: int, path_limits: Mapping[str, int] | None = None):
        self.app = app
        self.max_bytes = max_bytes
        self.path_limits = dict(path_limits or {})

    @staticmethod
    def _message(limit: int) -> str:
        return f"Request body too large: the limit is {limit} bytes."

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = route_path(scope)
        limit = self.path_limits.get(path, self.max_bytes)
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared > limit:
                    await send_error(
                        send,
                        413,
                        error_bytes(
                            path, self._message(limit), type_="invalid_request_error", code="request_too_large"
                        ),
                    )
                    return
        seen = 0
        exceeded = False
        replaced = False

        async def counting_receive() -> ASGIMessage:
            nonlocal seen, exceeded
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    exceeded = True
                    raise _BodyTooLarge
            return message

        async def guarded_send(message: ASGIMessage) -> None:
            # The framework may turn the receive error into its own 400; the client gets the 413.
            nonlocal replaced
            if exceeded:
                if message["type"] == "http.response.start" and not replaced:
                    replaced = True
                    await send_error(
                        send,
                        413,
                        error_bytes(
                            path, self._message(limit), type_="invalid_request_error", code="request_too_large"
                        ),
                    )
                return
            await send(message)

        try:
            await self.app(scope, counting_receive, guarded_send)
        except _BodyTooLarge:
            if not replaced:
                await send_error(
                    send,
                    413,
                    error_bytes(path, self._message(limit), type_="invalid_request_error", code="request_too_large"),
                )
