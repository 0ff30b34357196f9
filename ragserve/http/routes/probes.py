"""The probes: liveness for Kubernetes, Prometheus metrics. Open without an API key (the probes'
callers do not carry the clients' keys). Index names are data, so ``/metrics`` shows per-index
series only to a key that reaches every index; otherwise they are summed over the index."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse

from ragserve.api.documents import HealthResponse
from ragserve.http.security import principal_of
from ragserve.http.telemetry import without_index_labels
from ragserve.service.wiring import Services


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
    async def metrics(request: Request) -> PlainTextResponse:
        """The node's Ray metrics. Series labelled with an index are summed over it unless the
        request carries a key that reaches every index (or no keys are configured)."""
        text = await services.metrics_text() if services.metrics_text else ""
        if not principal_of(request.scope).sees_all:
            text = without_index_labels(text)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    return router
