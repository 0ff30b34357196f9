"""Small helpers shared by the deployment shells."""

from __future__ import annotations

import logging
from typing import Any

from ragserve.config import Settings

log = logging.getLogger("ray.serve")


def as_settings(settings: Settings | dict[str, Any] | None) -> Settings:
    """Deployments receive the Settings object from the builder (or a plain dict in tests)."""
    if isinstance(settings, Settings):
        return settings
    return Settings(**(settings or {}))


def unwrap_error(exc: BaseException) -> BaseException:
    """The exception a remote deployment raised: Ray wraps it (RayTaskError with ``.cause``)."""
    seen = 0
    while getattr(exc, "cause", None) is not None and seen < 5:
        exc = exc.cause  # type: ignore[attr-defined]  # RayTaskError carries the original as .cause
        seen += 1
    return exc


def request_id() -> str:
    """The Serve request id of the current request (it flows through every handle call)."""
    try:
        from ray.serve.context import _get_serve_request_context

        return _get_serve_request_context().request_id
    except Exception:  # outside a Serve request
        return ""


async def proxy_host() -> str:
    """The address Serve's HTTP proxies listen on (``http_options.host``), asked of the controller."""
    import ray
    from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

    controller = ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
    options = await controller.get_http_config.remote()
    return str(options.host)
