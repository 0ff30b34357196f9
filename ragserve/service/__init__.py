"""Async services over the pure core: documents (index management) and chat (the RAG pipeline)."""
