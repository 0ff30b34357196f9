"""The one place the services are assembled (docs/architecture.md, "Wiring").

The Ray Serve ingress (``deployments.ingress``), the in-process application the tests and the
benchmarks serve (``tests.inprocess``) and the HTTP unit tests all call :func:`build_services`, so
the application they exercise is wired exactly like the one that is deployed; only the edges
differ (shard pool, embedder, language model: Ray handles or in-process objects).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from app.budget.tokenizers import ApproxTokenCounter
from app.config import ScopedKey, Settings
from app.ingest import DocumentChunker, hf_token_counter
from app.retrieval.rerank import CrossEncoderReranker
from app.service.access import FULL_ACCESS, Principal, Role
from app.service.chat import ChatService, LanguageModel
from app.service.documents import DocumentService, RetrievalOptions, TextEmbedder
from app.service.embeddings import EmbeddingService
from app.service.limits import RequestLimits
from app.service.pool import ShardPool
from app.telemetry import NullTelemetry, Telemetry


class TokenCountingEmbedder(TextEmbedder, Protocol):
    """An embedder that can also count its model's tokens (``/v1/embeddings`` usage)."""

    async def count_tokens(self, texts: list[str]) -> int: ...


@dataclass
class Services:
    """Everything the HTTP routes call."""

    settings: Settings
    documents: DocumentService
    chat: ChatService
    embeddings: EmbeddingService
    limits: RequestLimits
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
    pool: ShardPool,
    embedder: TokenCountingEmbedder,
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
        retrieval=RetrievalOptions.from_settings(settings),
        reranker=reranker,
    )
    return Services(
        settings=settings,
        documents=documents,
        chat=ChatService(settings, documents, llm),
        embeddings=EmbeddingService(embedder.embed_documents, embedder.count_tokens, embedding_model),
        limits=RequestLimits.from_settings(settings),
        telemetry=telemetry or NullTelemetry(),
        health=health,
        metrics_text=metrics_text,
    )
