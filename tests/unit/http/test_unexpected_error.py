"""An unexpected error (a defect, not a client mistake) is still a 500 in the route's error shape:
OpenAI's ``{"error": {...}}`` under ``/v1/``, ``{"detail": ...}`` elsewhere, never plain text, and
its details stay in the log."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.testclient import TestClient

from ragserve.http.errors import install_error_handlers
from ragserve.testing.inprocess import RecordingTelemetry


def test_an_unexpected_error_is_a_500_in_the_routes_error_shape() -> None:
    app = FastAPI()
    install_error_handlers(app, RecordingTelemetry())

    @app.post("/v1/chat/completions")
    async def chat() -> dict:
        raise ValueError("secret internals: Max stack size exceeded")

    @app.post("/retrieve")
    async def retrieve() -> dict:
        raise RuntimeError("secret internals")

    with TestClient(app, raise_server_exceptions=False) as client:
        r = client.post("/v1/chat/completions", json={})
        assert r.status_code == 500 and r.headers["content-type"].startswith("application/json")
        assert r.json()["error"]["type"] == "server_error" and "secret" not in r.text
        r = client.post("/retrieve", json={})
        assert r.status_code == 500 and "detail" in r.json() and "secret" not in r.text
