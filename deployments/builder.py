"""``build_app(args)``: the application builder named by every serve config (ARCHITECTURE §3).

``args`` are the fields of ``app.config.Settings``; ``RAGSERVE_<FIELD>`` environment variables win.
"""

from __future__ import annotations

from typing import Any

from ray.serve import Application

from app.config import Settings
from deployments.embedder import Embedder
from deployments.generator import Generator
from deployments.ingress import Ingress


def build_app(args: dict[str, Any] | Settings | None = None) -> Application:
    settings = args if isinstance(args, Settings) else Settings(**(args or {}))
    embedder = Embedder.bind(settings)
    # A remote LLM is only an HTTP client: the ingress calls it itself, one actor hop less.
    generator = None if settings.llm_in_ingress else Generator.bind(settings)
    return Ingress.bind(embedder, generator, settings)
