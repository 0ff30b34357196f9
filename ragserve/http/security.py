"""API-key authentication for every route but the probes (issue: reliability and security).

A pure ASGI middleware rather than a FastAPI dependency, so that it also guards paths no route
matches (an unknown path answers 401, not 404, to a caller without a key) and the OpenAPI pages.
Keys are compared in constant time and never logged.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Iterable

from ragserve.http.asgi import ASGIApp, Receive, Scope, Send
from ragserve.http.errors import error_bytes, route_path, send_error
from ragserve.service.access import FULL_ACCESS, Principal, Role

PRINCIPAL = "ragserve.principal"  # where the authenticated key's Principal is kept in the request state

# Open without a key: the probes (Kubernetes and Prometheus do not carry the clients' keys), and the
# playground's page and assets (ragserve/http/routes/playground.py), which ask for a key that its API calls
# send, and the site icon (browsers ask for /favicon.ico without one).
OPEN_PATHS = frozenset({"/health", "/metrics", "/ui", "/ui/", "/favicon.ico"})
OPEN_PREFIXES = ("/ui/static/",)
#: Who calls an open path without a valid key where keys are configured: no index at all (so
#: ``/metrics`` names none).
ANONYMOUS = Principal(Role.READ, ())


class KeyChecker:
    """Constant-time lookup of a presented key among the configured ones: every key is compared,
    so the time does not tell which one matched (or how much of one)."""

    def __init__(self, keys: Iterable[tuple[str, Principal]]):
        self._keys = [(k.encode(), p) for k, p in keys]
        if not self._keys:
            raise ValueError("KeyChecker needs at least one key")

    def __call__(self, presented: str) -> Principal | None:
        candidate = presented.encode()
        found: Principal | None = None
        for key, principal in self._keys:
            if hmac.compare_digest(candidate, key):
                found = principal
        return found


def principal_of(scope: Scope) -> Principal:
    """The authenticated key's principal; full access where no keys are configured."""
    return scope.get("state", {}).get(PRINCIPAL, FULL_ACCESS)


def bearer_token(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() if scheme.lower() == "bearer" and token.strip() else None
    return None


class ApiKeyMiddleware:
    """Requires ``Authorization: Bearer <key>`` on every HTTP route except :data:`OPEN_PATHS`, where
    a valid key still counts (``/metrics`` shows more to a key for every index) and anything else
    is :data:`ANONYMOUS`."""

    def __init__(
        self, app: ASGIApp, keys: Iterable[tuple[str, Principal]], on_reject: Callable[[str], None] | None = None
    ):
        self.app = app
        self.check = KeyChecker(keys)
        self.on_reject = on_reject

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            # no route takes one today; should one come, it is closed to a caller without a key
            # (a close before the accept is an HTTP 403) rather than reached with full access
            principal = self.check(token) if (token := bearer_token(scope)) is not None else None
            if principal is None:
                await send({"type": "websocket.close", "code": 1008})
                return
            scope.setdefault("state", {})[PRINCIPAL] = principal
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = route_path(scope)
        token = bearer_token(scope)
        principal = self.check(token) if token is not None else None
        if path in OPEN_PATHS or path.startswith(OPEN_PREFIXES):
            # open, but what it shows may depend on the key (``/metrics``): a valid one counts
            scope.setdefault("state", {})[PRINCIPAL] = principal or ANONYMOUS
            await self.app(scope, receive, send)
            return
        if principal is not None:
            scope.setdefault("state", {})[PRINCIPAL] = principal
            await self.app(scope, receive, send)
            return
        reason = "missing" if token is None else "invalid"
        if self.on_reject is not None:
            self.on_reject(reason)
        message = (
            "Missing API key: send it as 'Authorization: Bearer <key>'."
            if token is None
            else "Incorrect API key provided."
        )
        await send_error(
            send,
            401,
            error_bytes(path, message, type_="invalid_request_error", code="invalid_api_key"),
            [(b"www-authenticate", b'Bearer realm="ragserve"')],
        )
