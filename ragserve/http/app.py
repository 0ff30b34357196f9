"""The FastAPI application: middlewares, the routers of each surface, the error mapping.

No Ray here, so the whole HTTP behaviour is testable in-process (docs/architecture.md §2).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from ragserve.api.openai import ChatCompletionChunk
from ragserve.http.errors import install_error_handlers
from ragserve.http.limits import BodySizeMiddleware
from ragserve.http.routes.documents import documents_router
from ragserve.http.routes.files import FILES_PATH, files_body_limit, files_router
from ragserve.http.routes.jobs import jobs_router
from ragserve.http.routes.mcp import mcp_route
from ragserve.http.routes.openai import openai_router
from ragserve.http.routes.playground import mount_playground_assets, playground_router
from ragserve.http.routes.probes import probes_router
from ragserve.http.routes.usage import usage_router
from ragserve.http.routes.vector_stores import vector_stores_router
from ragserve.http.security import ApiKeyMiddleware
from ragserve.http.telemetry import RequestCountingMiddleware
from ragserve.http.tracing import TracingMiddleware
from ragserve.http.usage import UsageMiddleware
from ragserve.service.wiring import Services


def create_app(services: Services) -> FastAPI:
    mcp, mcp_endpoint = mcp_route(services)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await services.start()  # the job runner: ingestion jobs run while the application serves
        try:
            async with mcp_endpoint.running():  # the MCP transport's task group (/mcp)
                yield
        finally:
            await services.stop()

    app = FastAPI(
        title="ragserve",
        version="0.1.0",
        description="OpenAI-compatible RAG server with a KAITO RAGEngine-style document API.",
        lifespan=lifespan,
    )
    tel = services.telemetry
    # Outermost last: authentication runs before a body is read, the size limit while it is read.
    limits = services.limits
    app.add_middleware(
        BodySizeMiddleware,
        max_bytes=limits.max_request_bytes,
        path_limits={FILES_PATH: files_body_limit(limits.max_request_bytes, limits.max_file_bytes)},
    )
    # usage: inside authentication (it meters the key), outside the size limit (a 413 counts too)
    app.add_middleware(UsageMiddleware, meter=services.meter)
    credentials = services.credentials()
    if credentials:
        app.add_middleware(
            ApiKeyMiddleware, keys=credentials, on_reject=lambda reason: tel.request("unauthenticated", 401, "", reason)
        )
    app.add_middleware(RequestCountingMiddleware, telemetry=tel)  # sees every response
    app.add_middleware(TracingMiddleware)  # outermost: its span covers the others (docs/architecture.md §7)
    install_error_handlers(app, tel)
    app.include_router(openai_router(services))
    app.include_router(files_router(services))
    app.include_router(vector_stores_router(services.vector_stores))
    app.include_router(jobs_router(services.jobs, services.limits))
    app.include_router(documents_router(services))
    app.include_router(probes_router(services))
    app.include_router(usage_router(services))
    app.include_router(playground_router(services))
    app.router.routes.append(mcp)
    mount_playground_assets(app)
    _document_chunk_stream(app)
    return app


def _document_chunk_stream(app: FastAPI) -> None:
    """List ``ChatCompletionChunk`` as the schema of each ``text/event-stream`` event: FastAPI
    documents a response model for JSON only."""
    default_openapi = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = default_openapi()
        defs = ChatCompletionChunk.model_json_schema(ref_template="#/components/schemas/{model}")
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        components.update(defs.pop("$defs", {}))
        components["ChatCompletionChunk"] = defs
        for item in schema.get("paths", {}).values():
            for op in item.values():
                stream = op.get("responses", {}).get("200", {}).get("content", {}).get("text/event-stream")
                if stream is not None:
                    stream["schema"] = {"$ref": "#/components/schemas/ChatCompletionChunk"}
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
