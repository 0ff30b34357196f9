"""The HTTP layer: FastAPI routes over the services; no Ray, so it is testable in-process."""

from app.http.app import Services, create_app
from app.http.telemetry import NullTelemetry, Telemetry

__all__ = ["NullTelemetry", "Services", "Telemetry", "create_app"]
