"""The probes: liveness for Kubernetes, Prometheus metrics. Open without an API key (the probes'
callers do not carry the clients' keys)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse

from app.api.documents import HealthResponse
from app.service.wiring import Services


def probes_router(services: Services) -> APIRouter:
    router = APIRouter(tags=["operations"])

    @router.get("/health")
    async def health() -> HealthResponse:
        if services.health is None:
            return HealthResponse(status="ok")
        return HealthResponse.model_validate(await services.health())

    @router.get(
        "/metrics",
        response_class=PlainTextResponse,
        responses={
            200: {
                "content": {"text/plain": {"schema": {"type": "string"}}},
                "description": "Prometheus text exposition format.",
            }
        },
    )
    async def metrics() -> PlainTextResponse:
        text = await services.metrics_text() if services.metrics_text else ""
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    return router
