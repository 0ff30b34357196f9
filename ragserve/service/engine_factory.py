"""The generation engine a ``Settings`` asks for (docs/architecture.md §3).

Engines are imported here only when chosen, so a remote-LLM deployment never imports torch and a
CPU deployment never looks for vLLM.
"""

from __future__ import annotations

from pathlib import Path

from ragserve.config import Settings, secret
from ragserve.models.engine import GenerationEngine


def model_cache_dir(settings: Settings) -> Path:
    """Where converted models are cached: ``model_cache_dir``, else ``<storage_dir>/models``."""
    return Path(settings.model_cache_dir) if settings.model_cache_dir else Path(settings.storage_dir) / "models"


def make_engine(settings: Settings) -> GenerationEngine:
    """A new, not yet started engine for ``settings.llm_engine``."""
    if settings.llm_engine == "transformers":
        from ragserve.models.transformers_engine import TransformersEngine

        return TransformersEngine(
            settings.llm_model,
            model_cache_dir(settings),
            settings.llm_engine_args,
            prompt_format=settings.prompt_format,
        )
    if settings.llm_engine == "openai":
        from ragserve.models.openai_engine import OpenAIEngine

        if not settings.llm_url:
            raise ValueError("llm_engine 'openai' needs llm_url (or RAGSERVE_LLM_URL)")
        return OpenAIEngine(
            settings.llm_url,
            settings.llm_model,
            secret(settings.llm_api_key),
            settings.llm_timeout_s,
            context_window=settings.context_window,
        )
    if settings.llm_engine == "vllm":
        from ragserve.models.vllm_engine import VLLMEngine

        if not settings.llm_model:
            raise ValueError(
                "llm_engine 'vllm' needs llm_model (or RAGSERVE_LLM_MODEL): a Hugging Face id or a "
                "local model directory"
            )
        return VLLMEngine(settings.llm_model, settings.llm_engine_args, context_window=settings.context_window)
    raise ValueError(f"unknown llm_engine {settings.llm_engine!r}; expected transformers, vllm or openai")
