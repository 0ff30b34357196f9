"""``ragserve mcp``: the MCP tools over stdio, reading one ragserve server through its HTTP API.

A desktop MCP client (Claude Desktop, an IDE) starts ``ragserve mcp --url URL --api-key KEY`` as
a subprocess and speaks MCP on its stdin and stdout; each tool call becomes a call of the server's
HTTP API with that key (``RemoteKnowledge``), so the key's scope limits what the tools list and
return as it does everywhere. Nothing but MCP messages is written to stdout.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from ragserve.agent.server import build_mcp_server
from ragserve.api.documents import DocumentRecord, RetrieveRequest, RetrieveResponse
from ragserve.cli.client import ApiError, RagClient
from ragserve.errors import ServiceError

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


class RemoteKnowledge:
    """``ragserve.ports.KnowledgeBase`` over a server's HTTP API (the CLI's client, on worker
    threads); the server's refusals come back as ``ServiceError`` with its message and status."""

    def __init__(self, client: RagClient):
        self.client = client

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        try:
            return await asyncio.to_thread(fn, *args)
        except ApiError as e:
            raise ServiceError(e.message, status=e.status or 503) from None

    async def _read(self, shape: type[M], fn: Callable[..., Any], *args: Any) -> M:
        body = await self._call(fn, *args)
        try:
            return shape.model_validate(body)
        except ValidationError:
            raise ServiceError(
                f"the server at {self.client.url} answered with something other than {shape.__name__}: "
                "is --url a ragserve server of this version?",
                status=502,
            ) from None

    async def list_indexes(self) -> list[str]:
        return list(await self._call(self.client.indexes))

    async def retrieve(self, request: RetrieveRequest) -> RetrieveResponse:
        body = request.model_dump(mode="json", exclude_none=True)
        return await self._read(RetrieveResponse, self.client.retrieve, body)

    async def get_document(self, index: str, doc_id: str, max_text_length: int | None = None) -> DocumentRecord:
        return await self._read(DocumentRecord, self.client.document, index, doc_id, max_text_length)


def run_stdio(client: RagClient) -> int:
    """Serve the MCP tools on stdin/stdout until the client closes them."""
    remote = RemoteKnowledge(client)
    server = build_mcp_server(lambda _request: remote, version="0.1.0")
    asyncio.run(server.run_stdio_async())
    return 0
