"""``build_app(args)``: the application builder named by every serve config (docs/architecture.md §3).

``args`` are the fields of ``ragserve.config.Settings``; ``RAGSERVE_<FIELD>`` environment variables win.
"""

from __future__ import annotations

from typing import Any, cast

from ray.serve import Application, Deployment

from ragserve.config import Settings
from ragserve.deployments.embedder import Embedder
from ragserve.deployments.generator import Generator
from ragserve.deployments.ingestion import Ingestion
from ragserve.deployments.ingress import Ingress


def build_app(args: dict[str, Any] | Settings | None = None) -> Application:
    settings = args if isinstance(args, Settings) else Settings(**(args or {}))
    embedder = as_deployment(Embedder).bind(settings)
    # A remote LLM is only an HTTP client: the ingress calls it itself, one actor hop less.
    generator = None if settings.llm_in_ingress else as_deployment(Generator).bind(settings)
    # files, jobs and vector stores: one owner of their catalogs and the job runner (one replica)
    ingestion = as_deployment(Ingestion).bind(embedder, settings)
    return as_deployment(Ingress).bind(embedder, generator, settings, ingestion)


def as_deployment(cls: object) -> Deployment:
    """``@serve.deployment`` made the class a ``Deployment``; its annotations still say the class."""
    return cast(Deployment, cls)
