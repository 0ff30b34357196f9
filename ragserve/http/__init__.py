"""The HTTP layer: FastAPI routers over the services; no Ray, so it is testable in-process."""

from ragserve.http.app import create_app

__all__ = ["create_app"]
