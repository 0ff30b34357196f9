"""Retrieval helpers: context selection, the RAG prompt, rank fusion."""

# app.budget.fit imports this package's prompt module, whose own import of app.budget.tokenizers runs
# app.budget's __init__ (and so fit) while prompt is half-loaded: loading app.budget first, whoever
# is imported first, breaks that cycle.
import app.budget  # noqa: F401
from app.retrieval.context import passes_threshold, relevant, select_context
from app.retrieval.fusion import FusionOptions, fuse_candidates, reciprocal_rank_fusion
from app.retrieval.prompt import build_rag_messages, context_system_message, format_context, format_source

__all__ = [
    "FusionOptions",
    "build_rag_messages",
    "context_system_message",
    "format_context",
    "format_source",
    "fuse_candidates",
    "passes_threshold",
    "reciprocal_rank_fusion",
    "relevant",
    "select_context",
]
