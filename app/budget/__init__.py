"""Token budget: counters, context windows, and fitting a request into the window (docs/architecture.md §5)."""

from app.budget.fit import ContextBudgetError, FitResult, PromptTooLongError, fit, fit_passthrough
from app.budget.tokenizers import (
    ApproxTokenCounter,
    HFTokenCounter,
    TiktokenCounter,
    TokenCounter,
    counter_for_model,
    load_tiktoken_encoding,
)
from app.budget.windows import KNOWN_CONTEXT_WINDOWS, lookup_context_window, resolve_context_window

__all__ = [
    "KNOWN_CONTEXT_WINDOWS",
    "ApproxTokenCounter",
    "ContextBudgetError",
    "FitResult",
    "HFTokenCounter",
    "PromptTooLongError",
    "TiktokenCounter",
    "TokenCounter",
    "counter_for_model",
    "fit",
    "fit_passthrough",
    "load_tiktoken_encoding",
    "lookup_context_window",
    "resolve_context_window",
]
