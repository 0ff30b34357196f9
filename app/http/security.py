"""API-key authentication for every route but the probes (issue: reliability and security).

A pure ASGI middleware rather than a FastAPI dependency, so that it also guards paths no route
matches (an unknown path answers 401, not 404, to a caller without a key) and the OpenAPI pages.
Keys are compared in constant time and never logged.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# Probes stay open: Kubernetes and Prometheus do not carry the clients' keys.
OPEN_PATHS = frozenset({"/health", "/metrics", "/ui", "/ui/"})
# The playground's page and assets (app/http/routes_extra.py): the page asks for a key, its API calls send it.
OPEN_PREFIXES = ("/ui/static/",)


def route_path(scope: Scope) -> str:
    """The request path without the Serve route prefix (``root_path``)."""
    path, root = scope.get("path", ""), scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root):] or "/"
    return path


def is_openai_path(path: str) -> bool:
    return path.startswith("/v1/")


def error_body(path: str, message: str, *, type_: str, code: str | None) -> bytes:
    """OpenAI error shape on /v1/*, ``{"detail": ...}`` on the document API (ARCHITECTURE §4)."""
    if is_openai_path(path):
        body: dict[str, Any] = {"error": {"message": message, "type": type_, "param": None, "code": code}}
    else:
        body = {"detail": message}
    return json.dumps(body).encode()


async def send_json(send: Send, status: int, body: bytes, headers: Iterable[tuple[bytes, bytes]] = ()) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": body})


class KeyChecker:
    """Constant-time membership test of a presented key against the configured ones."""

    def __init__(self, keys: Iterable[str]):
        self._keys = [k.encode() for k in keys]
        if not self._keys:
            raise ValueError("KeyChecker needs at least one key")

    def __call__(self, presented: str) -> bool:
        candidate = presented.encode()
        ok = False
        for key in self._keys:  # compare with every key: the time does not tell which one matched
            ok |= hmac.compare_digest(candidate, key)
        return ok


def bearer_token(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() if scheme.lower() == "bearer" and token.strip() else None
    return None


class ApiKeyMiddleware:
    """Requires ``Authorization: Bearer <key>`` on every HTTP route except :data:`OPEN_PATHS`."""

    def __init__(self, app: ASGIApp, keys: Iterable[str], on_reject: Callable[[str], None] | None = None):
        self.app = app
        self.check = KeyChecker(keys)
        self.on_reject = on_reject

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = route_path(scope)
        if path in OPEN_PATHS or path.startswith(OPEN_PREFIXES):
            await self.app(scope, receive, send)
            return
        token = bearer_token(scope)
        if token is not None and self.check(token):
            await self.app(scope, receive, send)
            return
        reason = "missing" if token is None else "invalid"
        if self.on_reject is not None:
            self.on_reject(reason)
        message = ("Missing API key: send it as 'Authorization: Bearer <key>'." if token is None
                   else "Incorrect API key provided.")
        await send_json(send, 401, error_body(path, message, type_="invalid_request_error", code="invalid_api_key"),
                        [(b"www-authenticate", b'Bearer realm="ragserve"')])
