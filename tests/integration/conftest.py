"""Integration fixtures: one local Ray cluster per test session, one Serve application per module.

The applications are built by the same ``ragserve.deployments.builder:build_app`` that ``serve run`` uses.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ragserve.serve_port import free_port

REPO = Path(__file__).resolve().parents[2]
MODEL_CACHE = REPO / "data" / "test-cache" / "models"


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[int]:
    """Ray with Serve's HTTP ingress on a free loopback port; yields the port. Module scope: the
    multi-node test needs a cluster of its own, and one process holds one Ray connection.

    Ray starts in the mode ``make run`` uses (high-throughput unless ``RAGSERVE_HIGH_THROUGHPUT=0``,
    ``ragserve.deployments.platform``), so the suite tests what is deployed."""
    import ray
    from ray import serve

    from ragserve.deployments.platform import init_local_ray

    port = free_port()
    init_local_ray(num_cpus=4)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    yield port
    serve.shutdown()
    ray.shutdown()


def deploy(settings_args: dict, name: str, port: int, timeout_s: float = 600, application: Any = None) -> str:
    """Run the application (``build_app(settings_args)``, or ``application`` as built) and wait until
    /health answers; returns its base URL."""
    from ray import serve

    from ragserve.deployments.builder import build_app

    app = application if application is not None else build_app(settings_args)
    serve.run(app, name=name, route_prefix=f"/{name}", blocking=False)
    base = f"http://127.0.0.1:{port}/{name}"
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            r = httpx.get(f"{base}/health", timeout=5)
            if r.status_code == 200:
                return base
            last = r.text
        except httpx.HTTPError as e:
            last = repr(e)
        time.sleep(1)
    raise RuntimeError(f"application {name} did not become healthy: {last}")
