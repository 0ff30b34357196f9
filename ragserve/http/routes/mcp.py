"""``/mcp``: the MCP tools (``ragserve.agent``) over streamable HTTP, inside the application.

The route sits behind the same middlewares as every other (API key, body size, request counting),
and each tool call reads the knowledge its request's key reaches (``ScopedKnowledge``), so the tools
list and return only what that key may read. The transport is stateless with JSON answers: any
ingress replica answers any request, as Serve's proxy spreads them, with no session to pin. On an
open server (no API keys: the loopback only) the SDK's DNS-rebinding guard admits only loopback
``Host`` and ``Origin`` headers, so a web page cannot reach the tools through a rebound name (the
other routes of an open server have no such guard: an open server is for one machine's own use).

A message is at most ``MAX_MCP_BODY_BYTES`` (a 413 past it, read no further): a tool call is a
query and a few settings, and the SDK parses and validates a message on the event loop (33 MB of
4,300-digit integers held it for 9 s). Before the SDK reads a JSON message, :func:`envelope_error`
checks what the SDK would let through or spend the event loop on: a body nesting deeper than
``MAX_JSON_DEPTH`` or holding more than
``MAX_MCP_JSON_VALUES`` values (a tool's arguments are a handful; millions took the loop for a
second), and a request whose ``id`` is not a string or an integer (MCP: "MUST be a string or
integer", never null). The SDK read such a request as a notification and answered 202 with no
body, so a client waited for an answer that never came; it is a 400 with JSON-RPC's
``Invalid Request`` (-32600) saying what to send.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from ragserve.agent.server import build_mcp_server
from ragserve.api.values import check_json_depth
from ragserve.http.routes.common import scoped_knowledge
from ragserve.service.knowledge import ScopedKnowledge
from ragserve.service.wiring import Services

MCP_PATH = "/mcp"
_LOOPBACK = ("127.0.0.1", "localhost", "[::1]")
#: JSON values (array items and object members) one MCP message may hold, and its bytes: a tool
#: call's arguments are a query and a few settings.
MAX_MCP_JSON_VALUES = 10_000
MAX_MCP_BODY_BYTES = 1 << 20
#: JSON-RPC's error code for a message that is not a valid request.
INVALID_REQUEST = -32600


def envelope_error(body: bytes) -> str | None:
    """What is wrong with an MCP message's envelope that the SDK would not say (module docstring),
    or None to hand it on. Malformed JSON and wrong fields are left to the SDK's own report."""
    try:
        values = check_json_depth(body, "the message")
    except ValueError as e:
        return str(e)
    if values > MAX_MCP_JSON_VALUES:
        return (
            f"the message holds about {values} JSON values (array items and object members); "
            f"at most {MAX_MCP_JSON_VALUES} are accepted"
        )
    try:
        message = json.loads(body)
    except ValueError:
        return None
    if isinstance(message, dict) and "method" in message and "id" in message:
        rid = message["id"]
        if isinstance(rid, bool) or not isinstance(rid, str | int):
            return (
                f"a request's id must be a string or an integer, not {json.dumps(rid)[:40]}; "
                "send a notification without an id"
            )
    return None


def _rpc_error(message: str, status: int = 400) -> JSONResponse:
    return JSONResponse({"jsonrpc": "2.0", "id": None, "error": {"code": INVALID_REQUEST, "message": message}}, status)


def _guard(open_server: bool) -> TransportSecuritySettings:
    if not open_server:  # every request carries a key: a rebound page has none
        return TransportSecuritySettings(enable_dns_rebinding_protection=False)
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[h for name in _LOOPBACK for h in (name, f"{name}:*")],
        allowed_origins=[o for name in _LOOPBACK for o in (f"http://{name}", f"http://{name}:*")],
    )


class McpEndpoint:
    """The ASGI app of ``/mcp``: the session manager of the application's running lifespan. The
    SDK's manager runs once, and an application may start more than once (a test client opened
    again), so each start builds its own (:meth:`running`); a call while none runs is a 503."""

    def __init__(self, services: Services):
        self.services = services
        self.current: StreamableHTTPSessionManager | None = None

    def _manager(self) -> StreamableHTTPSessionManager:
        services = self.services

        def knowledge(request: Any) -> ScopedKnowledge:
            if request is None:  # every call here came in an HTTP request: no key is no access
                raise ToolError("this call carried no HTTP request to read its API key from")
            return scoped_knowledge(request, services.chat, services.limits, services.telemetry)

        server = build_mcp_server(knowledge, version="0.1.0")
        open_server = not services.credentials() and not services.settings.allow_unauthenticated
        server.streamable_http_app(
            streamable_http_path=MCP_PATH,
            stateless_http=True,
            json_response=True,
            transport_security=_guard(open_server),
            max_request_body_size=min(MAX_MCP_BODY_BYTES, services.limits.max_request_bytes),
        )
        return server.session_manager

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        manager = self._manager()
        async with manager.run():
            self.current = manager
            try:
                yield
            finally:
                self.current = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        manager = self.current
        if manager is None:
            response = JSONResponse({"detail": "the MCP server is not running; retry when /health answers"}, 503)
            await response(scope, receive, send)
            return
        if scope.get("method") == "POST":
            body, receive = await _read_body(receive, MAX_MCP_BODY_BYTES)
            if body is None:  # the client left
                return
            if len(body) > MAX_MCP_BODY_BYTES:
                message = f"an MCP message may have at most {MAX_MCP_BODY_BYTES} bytes: send a shorter one"
                await _rpc_error(message, 413)(scope, receive, send)
                return
            error = envelope_error(body) if _is_json(scope) else None  # else the SDK's own 415 or 400
            if error is not None:
                await _rpc_error(f"Invalid Request: {error}")(scope, receive, send)
                return
        await manager.handle_request(scope, receive, send)


def _is_json(scope: Scope) -> bool:
    """Whether the request says its body is JSON (the SDK refuses any other with its own error)."""
    return Headers(scope=scope).get("content-type", "").split(";")[0].strip().lower() == "application/json"


async def _read_body(receive: Receive, most: int) -> tuple[bytes | None, Receive]:
    """The request's whole body and a ``receive`` that gives it again, then what the client sends
    after (a disconnect); None when the client left before its body was read. Reading stops once
    more than ``most`` bytes came: what is returned is then longer than ``most``, not all."""
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None, receive
        part = message.get("body", b"")
        parts.append(part)
        size += len(part)
        if not message.get("more_body", False) or size > most:
            break
    body = b"".join(parts)
    replayed = False

    async def again() -> Message:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return body, again


def mcp_route(services: Services) -> tuple[Route, McpEndpoint]:
    """The ``/mcp`` route and its endpoint, whose :meth:`McpEndpoint.running` the lifespan enters."""
    endpoint = McpEndpoint(services)
    # POST only: a stateless server opens no GET stream and has no session to DELETE (405)
    return Route(MCP_PATH, endpoint=endpoint, methods=["POST"]), endpoint
