"""Generation engines behind one interface (``base.GenerationEngine``): the embedded transformers
engine (CPU default), vLLM (GPU) and a remote OpenAI-compatible server. ``make_engine`` picks one
from the settings; the engine modules themselves are imported only when used."""

from app.engines.base import (
    EngineError,
    GenerationDelta,
    GenerationEngine,
    GenerationResult,
    sampling_params_from_body,
)
from app.engines.factory import make_engine, model_cache_dir
from app.engines.gemma import render_gemma

__all__ = [
    "EngineError",
    "GenerationDelta",
    "GenerationEngine",
    "GenerationResult",
    "make_engine",
    "model_cache_dir",
    "render_gemma",
    "sampling_params_from_body",
]
