"""The probes: liveness for Kubernetes, Prometheus metrics. Open without an API key (the probes'
callers do not carry the clients' keys). Index names are data, so ``/metrics`` shows per-index
series only to a key that reaches every index; otherwise they are summed over the index."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse

from ragserve.api.documents import HealthResponse
from ragserve.http.security import principal_of
from ragserve.http.telemetry import INDEX_LABEL, KEY_LABEL, without_data_labels
from ragserve.service.access import Role
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
        request carries a key that reaches every index (or no keys are configured); series labelled
        with an API key's name (usage) are summed over it unless that key is also an admin's."""
        text = await services.metrics_text() if services.metrics_text else ""
        principal = principal_of(request.scope)
        if not principal.sees_all:
            text = without_data_labels(text, (INDEX_LABEL, KEY_LABEL))
        elif principal.role < Role.ADMIN:
            text = without_data_labels(text, (KEY_LABEL,))
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    return router
