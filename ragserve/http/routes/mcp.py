"""``/mcp``: the MCP tools (``ragserve.agent``) over streamable HTTP, inside the application.

The route sits behind the same middlewares as every other (API key, body size, request counting),
and each tool call reads the knowledge its request's key reaches (``ScopedKnowledge``), so the tools
list and return only what that key may read. The transport is stateless with JSON answers: any
ingress replica answers any request, as Serve's proxy spreads them, with no session to pin. On an
open server (no API keys: the loopback only) the SDK's DNS-rebinding guard admits only loopback
``Host`` and ``Origin`` headers, so a web page cannot reach the tools through a rebound name (the
other routes of an open server have no such guard: an open server is for one machine's own use).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from ragserve.agent.server import build_mcp_server
from ragserve.http.routes.common import scoped_knowledge
from ragserve.service.knowledge import ScopedKnowledge
from ragserve.service.wiring import Services

MCP_PATH = "/mcp"
_LOOPBACK = ("127.0.0.1", "localhost", "[::1]")


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
            max_request_body_size=services.limits.max_request_bytes,
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
        await manager.handle_request(scope, receive, send)


def mcp_route(services: Services) -> tuple[Route, McpEndpoint]:
    """The ``/mcp`` route and its endpoint, whose :meth:`McpEndpoint.running` the lifespan enters."""
    endpoint = McpEndpoint(services)
    # POST only: a stateless server opens no GET stream and has no session to DELETE (405)
    return Route(MCP_PATH, endpoint=endpoint, methods=["POST"]), endpoint
