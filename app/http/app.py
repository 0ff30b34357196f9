"""The FastAPI application: middlewares, the routers of each surface, the error mapping.

No Ray here, so the whole HTTP behaviour is testable in-process (docs/architecture.md, "Layers").
"""

from __future__ import annotations

from fastapi import FastAPI

from app.http.errors import install_error_handlers
from app.http.limits import BodySizeMiddleware
from app.http.routes.documents import documents_router
from app.http.routes.openai import openai_router
from app.http.routes.probes import probes_router
from app.http.security import ApiKeyMiddleware
from app.http.telemetry import RequestCountingMiddleware
from app.service.wiring import Services


def create_app(services: Services) -> FastAPI:
    app = FastAPI(title="ragserve", version="0.1.0",
                  description="OpenAI-compatible RAG server with a KAITO RAGEngine-style document API.")
    tel = services.telemetry
    # Outermost last: authentication runs before a body is read, the size limit while it is read.
    app.add_middleware(BodySizeMiddleware, max_bytes=services.limits.max_request_bytes)
    if services.api_keys:
        app.add_middleware(ApiKeyMiddleware, keys=services.api_keys,
                           on_reject=lambda reason: tel.request("unauthenticated", 401, "", reason))
    app.add_middleware(RequestCountingMiddleware, telemetry=tel)  # outermost: sees every response
    install_error_handlers(app, tel)
    app.include_router(openai_router(services))
    app.include_router(documents_router(services))
    app.include_router(probes_router(services))
    return app
