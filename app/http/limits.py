"""Request limits: each one configurable and each a clear 4xx (issue: reliability and security).

The body size is enforced while the body streams in, so a client cannot make the server buffer
more than the limit (a missing or lying ``Content-Length`` does not help). The other limits are
checked on the parsed request, where the message can name the field and the allowed maximum.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.http.security import ASGIApp, Message, Receive, Scope, Send, error_body, route_path, send_json
from app.service.errors import ServiceError


class PayloadTooLargeError(ServiceError):
    status = 413


class LimitExceededError(ServiceError):
    status = 400


@dataclass(frozen=True)
class RequestLimits:
    """The limits the HTTP layer enforces; built from :class:`app.config.Settings`."""

    max_request_bytes: int = 32 * 1024 * 1024
    max_documents_per_request: int = 1000
    max_document_chars: int = 1_000_000
    max_chat_messages: int = 1000
    max_top_k: int = 100
    max_list_limit: int = 100

    @classmethod
    def from_settings(cls, settings: Any) -> RequestLimits:
        return cls(**{f: getattr(settings, f) for f in cls.__dataclass_fields__})

    def document_count(self, n: int, field: str = "documents") -> None:
        if n > self.max_documents_per_request:
            raise PayloadTooLargeError(
                f"{field}: {n} items in one request; at most {self.max_documents_per_request} "
                "are accepted, send them in several requests", param=field)

    def documents(self, texts: list[str], field: str = "documents") -> None:
        self.document_count(len(texts), field)
        for i, text in enumerate(texts):
            if len(text) > self.max_document_chars:
                raise PayloadTooLargeError(
                    f"{field}[{i}].text has {len(text)} characters; at most {self.max_document_chars} are "
                    "accepted, split the document", param=f"{field}[{i}].text")

    def messages(self, n: int) -> None:
        if n > self.max_chat_messages:
            raise LimitExceededError(f"messages: {n} messages; at most {self.max_chat_messages} are accepted",
                                     param="messages")

    def top_k(self, value: int | None, field: str = "top_k") -> None:
        if value is not None and value > self.max_top_k:
            raise LimitExceededError(f"{field} must be at most {self.max_top_k}, got {value}", param=field)

    def list_limit(self, value: int) -> None:
        if value > self.max_list_limit:
            raise LimitExceededError(f"limit must be at most {self.max_list_limit}, got {value}", param="limit")


class _BodyTooLarge(Exception):
    pass


class BodySizeMiddleware:
    """Answers 413 when the request body exceeds ``max_bytes``, declared or streamed."""

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    def _message(self) -> str:
        return f"Request body too large: the limit is {self.max_bytes} bytes."

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = route_path(scope)
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared > self.max_bytes:
                    await send_json(send, 413, error_body(path, self._message(), type_="invalid_request_error",
                                                          code="request_too_large"))
                    return
        seen = 0
        exceeded = False
        replaced = False

        async def counting_receive() -> Message:
            nonlocal seen, exceeded
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    exceeded = True
                    raise _BodyTooLarge
            return message

        async def guarded_send(message: Message) -> None:
            # The framework may turn the receive error into its own 400; the client gets the 413.
            nonlocal replaced
            if exceeded:
                if message["type"] == "http.response.start" and not replaced:
                    replaced = True
                    await send_json(send, 413, error_body(path, self._message(), type_="invalid_request_error",
                                                          code="request_too_large"))
                return
            await send(message)

        try:
            await self.app(scope, counting_receive, guarded_send)
        except _BodyTooLarge:
            if not replaced:
                await send_json(send, 413, error_body(path, self._message(), type_="invalid_request_error",
                                                      code="request_too_large"))
