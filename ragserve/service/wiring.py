"""The one place the services are assembled (docs/architecture.md §12).

The Ray Serve ingress (``ragserve.deployments.ingress``), the in-process application the tests and the
benchmarks serve (``ragserve.testing.inprocess``) and the HTTP unit tests all call :func:`build_services`, so
the application they exercise is wired exactly like the one that is deployed; only the edges
differ (shard pool, embedder, language model: Ray handles or in-process objects).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ragserve.config import ScopedKey, Settings
from ragserve.ingest import DocumentChunker, hf_token_counter
from ragserve.models.reranker import CrossEncoderReranker
from ragserve.models.tokenizers import ApproxTokenCounter
from ragserve.ports import LanguageModel, ShardPool, TextEmbedder
from ragserve.service.access import FULL_ACCESS, Principal, Role
from ragserve.service.chat import ChatOptions, ChatService
from ragserve.service.documents import DocumentService
from ragserve.service.embeddings import EmbeddingService
from ragserve.service.file_store import FILES_DIR, FileStore
from ragserve.service.limits import RequestLimits
from ragserve.service.retrieval import RetrievalOptions, Retriever
from ragserve.service.shard_service import ShardService
from ragserve.telemetry import NullTelemetry, Telemetry


@dataclass
class Services:
    """Everything the HTTP routes call."""

    settings: Settings
    documents: DocumentService
    chat: ChatService
    embeddings: EmbeddingService
    limits: RequestLimits
    files: FileStore
    telemetry: Telemetry = field(default_factory=NullTelemetry)
    health: Callable[[], Awaitable[dict[str, Any]]] | None = None
    metrics_text: Callable[[], Awaitable[str]] | None = None

    def credentials(self) -> list[tuple[str, Principal]]:
        """The accepted keys in clear with what each may do, for the authentication middleware only."""
        out = []
        for k in self.settings.api_keys or []:
            if isinstance(k, ScopedKey):
                out.append((k.key.get_secret_value(), Principal(Role[k.role.upper()], tuple(k.indexes))))
            else:
                out.append((k.get_secret_value(), FULL_ACCESS))
        return out


def build_services(
    settings: Settings,
    *,
    pool: ShardPool[ShardService],
    embedder: TextEmbedder,
    llm: LanguageModel,
    embedding_model: str,
    embedding_tokenizer: Any | None = None,
    telemetry: Telemetry | None = None,
    health: Callable[[], Awaitable[dict[str, Any]]] | None = None,
    metrics_text: Callable[[], Awaitable[str]] | None = None,
) -> Services:
    """Assemble the services over the given edges.

    ``embedding_tokenizer`` is the embedding model's Hugging Face tokenizer: chunk sizes are counted
    in its tokens, the ones that matter for the embedder's window. Without one (a remote embedder)
    they are estimated."""
    count = (
        hf_token_counter(embedding_tokenizer)
        if embedding_tokenizer is not None
        else ApproxTokenCounter("no tokenizer for the remote embedding model").count_text
    )
    chunker = DocumentChunker(count, settings.chunk_size, settings.chunk_overlap)
    reranker = CrossEncoderReranker(settings.reranker_model) if settings.reranker_model else None
    documents = DocumentService(
        pool,
        embedder,
        chunker,
        storage_dir=settings.storage_dir,
        embedding_model=embedding_model,
        retriever=Retriever(pool, embedder, RetrievalOptions.from_settings(settings), reranker),
    )
    return Services(
        settings=settings,
        documents=documents,
        chat=ChatService(ChatOptions.from_settings(settings), documents, llm, embedder),
        embeddings=EmbeddingService(embedder.embed_documents, embedder.count_tokens, embedding_model),
        limits=RequestLimits.from_settings(settings),
        files=FileStore(Path(settings.storage_dir) / FILES_DIR, settings.max_file_bytes),
        telemetry=telemetry or NullTelemetry(),
        health=health,
        metrics_text=metrics_text,
    )
