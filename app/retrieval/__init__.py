"""Retrieval helpers: context selection, the RAG prompt, rank fusion."""

from app.retrieval.context import relevant, select_context
from app.retrieval.fusion import reciprocal_rank_fusion
from app.retrieval.prompt import build_rag_messages, context_system_message, format_context, format_source

__all__ = [
    "build_rag_messages",
    "context_system_message",
    "format_context",
    "format_source",
    "reciprocal_rank_fusion",
    "relevant",
    "select_context",
]
