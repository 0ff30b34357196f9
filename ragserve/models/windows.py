"""Context windows of well-known models, and which window applies (docs/architecture.md §5).

Precedence: the operator's ``context_window`` (an explicit override, e.g. to cap cost), then what
the engine reports (vLLM ``max_model_len``, the model config), then this table, then 8192.
"""

from __future__ import annotations

import re

DEFAULT_CONTEXT_WINDOW = 8192

KNOWN_CONTEXT_WINDOWS: dict[str, int] = {
    # OpenAI
    "gpt-3.5-turbo": 16385,
    "gpt-4": 8192,
    "gpt-4-32k": 32768,
    "gpt-4-turbo": 128000,
    "gpt-4o": 128000,
    "gpt-4o-mini": 128000,
    "gpt-4.1": 1047576,
    "gpt-4.1-mini": 1047576,
    "gpt-4.1-nano": 1047576,
    "gpt-5": 400000,
    "gpt-5-mini": 400000,
    "gpt-5-nano": 400000,
    "o1": 200000,
    "o1-mini": 128000,
    "o3": 200000,
    "o3-mini": 200000,
    "o4-mini": 200000,
    "gpt-oss-20b": 131072,
    "gpt-oss-120b": 131072,
    # Anthropic
    "claude-2": 100000,
    "claude-3": 200000,
    "claude-3-opus": 200000,
    "claude-3-sonnet": 200000,
    "claude-3-haiku": 200000,
    "claude-3-5-sonnet": 200000,
    "claude-3-5-haiku": 200000,
    "claude-3-7-sonnet": 200000,
    "claude-sonnet-4": 200000,
    "claude-opus-4": 200000,
    "claude-haiku-4": 200000,
    # Meta Llama
    "llama-2": 4096,
    "llama2": 4096,
    "llama-3": 8192,
    "llama3": 8192,
    "llama-3.1": 131072,
    "llama3.1": 131072,
    "llama-3.2": 131072,
    "llama3.2": 131072,
    "llama-3.3": 131072,
    "llama3.3": 131072,
    "llama-4": 1048576,
    # Mistral
    "mistral": 32768,
    "mistral-7b": 32768,
    "mistral:7b": 32768,
    "mixtral": 32768,
    "mistral-large": 131072,
    "mistral-small": 32768,
    "mistral-nemo": 131072,
    "codestral": 32768,
    # Qwen
    "qwen2": 32768,
    "qwen2.5": 32768,
    "qwen2.5:7b": 131072,
    "qwen2.5-coder": 32768,
    "qwen3": 32768,
    # DeepSeek
    "deepseek-chat": 64000,
    "deepseek-coder": 16000,
    "deepseek-coder:6.7b": 16000,
    "deepseek-v3": 131072,
    "deepseek-r1": 131072,
    # Microsoft Phi
    "phi-2": 2048,
    "phi-3-mini-4k": 4096,
    "phi-3-mini-128k": 131072,
    "phi-3-medium-4k": 4096,
    "phi-3-medium-128k": 131072,
    "phi-3.5-mini": 131072,
    "phi-4": 16384,
    "phi-4-mini": 131072,
    # Google Gemma
    "gemma": 8192,
    "gemma-2": 8192,
    "gemma2": 8192,
    "gemma-3": 131072,
    "gemma3": 131072,
    "gemma-3-270m": 32768,
    "gemma3-270m": 32768,
    "gemma-3-1b": 32768,
    "gemma3-1b": 32768,
    # others
    "grok-beta": 131072,
    "grok-2": 131072,
    "command-r": 128000,
    "falcon-7b": 2048,
}


def _normalise(model: str) -> str:
    name = model.strip().lower().rsplit("/", 1)[-1]  # "meta-llama/Llama-3.1-8B" -> "llama-3.1-8b"
    return re.sub(r"\.gguf\Z", "", name)


def lookup_context_window(model: str | None) -> int | None:
    """Exact id, else the longest known key the id starts with (or, failing that, contains)."""
    if not model:
        return None
    name = _normalise(model)
    if name in KNOWN_CONTEXT_WINDOWS:
        return KNOWN_CONTEXT_WINDOWS[name]
    base = name.split(":", 1)[0]
    if base in KNOWN_CONTEXT_WINDOWS:
        return KNOWN_CONTEXT_WINDOWS[base]
    for test in (name.startswith, name.__contains__):
        keys = [k for k in KNOWN_CONTEXT_WINDOWS if test(k)]
        if keys:
            return KNOWN_CONTEXT_WINDOWS[max(keys, key=len)]
    return None


def resolve_context_window(
    *, configured: int | None, engine: int | None, model: str | None, default: int = DEFAULT_CONTEXT_WINDOW
) -> int:
    for candidate in (configured, engine, lookup_context_window(model)):
        if candidate:
            return int(candidate)
    return default
