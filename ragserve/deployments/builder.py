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
    """What a serve config's ``import_path`` names: Serve calls it with the config's ``args`` (and a
    builder must take exactly that one parameter)."""
    return build_app_with(args)


def build_app_with(
    args: dict[str, Any] | Settings | None = None, options: dict[str, dict[str, Any]] | None = None
) -> Application:
    """``build_app`` with deployment options by deployment name (``{"Ingress": {"num_replicas": 2}}``),
    what a serve config's ``deployments:`` list sets, for code that deploys without one (benchmarks)."""
    settings = args if isinstance(args, Settings) else Settings(**(args or {}))
    opts = dict(options or {})
    unknown = sorted(set(opts) - {"Embedder", "Generator", "Ingestion", "Ingress"})
    if unknown:
        raise ValueError(f"no deployment named {unknown}; the deployments are Embedder, Generator, Ingestion, Ingress")

    def deployment(cls: object, name: str) -> Deployment:
        d = as_deployment(cls)
        return d.options(**opts[name]) if name in opts else d

    embedder = deployment(Embedder, "Embedder").bind(settings)
    # A remote LLM is only an HTTP client: the ingress calls it itself, one actor hop less.
    generator = None if settings.llm_in_ingress else deployment(Generator, "Generator").bind(settings)
    # files, jobs and vector stores: one owner of their catalogs and the job runner (one replica)
    ingestion = deployment(Ingestion, "Ingestion").bind(embedder, settings)
    return deployment(Ingress, "Ingress").bind(embedder, generator, settings, ingestion)


def as_deployment(cls: object) -> Deployment:
    """``@serve.deployment`` made the class a ``Deployment``; its annotations still say the class."""
    return cast(Deployment, cls)
