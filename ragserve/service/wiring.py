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

from ragserve.config import ScopedKey, Settings, secret
from ragserve.ingest import DocumentChunker, hf_token_counter
from ragserve.jobs.runner import JobRunner
from ragserve.jobs.store import JobStore
from ragserve.jobs.webhook import WebhookNotifier
from ragserve.models.reranker import CrossEncoderReranker
from ragserve.models.tokenizers import ApproxTokenCounter
from ragserve.ports import LanguageModel, ShardPool, TextEmbedder
from ragserve.service.access import FULL_ACCESS, Principal, Role
from ragserve.service.chat import ChatOptions, ChatService
from ragserve.service.documents import DocumentService
from ragserve.service.embeddings import EmbeddingService
from ragserve.service.file_store import FILES_DIR, FileStore
from ragserve.service.ingest_jobs import DOCUMENTS_JOB, Handler, JobService, dispatch
from ragserve.service.limits import RequestLimits
from ragserve.service.retrieval import RetrievalOptions, Retriever
from ragserve.service.shard_service import ShardService
from ragserve.service.vector_store_catalog import VectorStoreCatalog
from ragserve.service.vector_stores import FILE_JOB, VectorStoreService
from ragserve.telemetry import NullTelemetry, Telemetry

#: Where the ingestion jobs and the vector store catalog live, under ``storage_dir``.
JOBS_FILE = "jobs.sqlite3"
VECTOR_STORES_FILE = "vector_stores.sqlite3"


@dataclass
class Services:
    """Everything the HTTP routes call."""

    settings: Settings
    documents: DocumentService
    chat: ChatService
    embeddings: EmbeddingService
    limits: RequestLimits
    files: FileStore
    jobs: JobService
    vector_stores: VectorStoreService
    #: indexes the jobs; started and stopped with the application (``start``/``stop``)
    runner: JobRunner
    telemetry: Telemetry = field(default_factory=NullTelemetry)
    health: Callable[[], Awaitable[dict[str, Any]]] | None = None
    metrics_text: Callable[[], Awaitable[str]] | None = None

    async def start(self) -> None:
        """What runs in the background while the application serves: the job runner (which takes
        back the jobs a stopped process left running) and its webhook notifier."""
        await self.runner.start()

    async def stop(self) -> None:
        await self.runner.stop()

    def close(self) -> None:
        """Close the stores' files (after ``stop``)."""
        self.files.close()
        self.jobs.store.close()
        self.vector_stores.catalog.close()

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
    limits = RequestLimits.from_settings(settings)
    root = Path(settings.storage_dir)
    files = FileStore(root / FILES_DIR, settings.max_file_bytes)
    store = JobStore(root / JOBS_FILE)
    notifier = (
        WebhookNotifier(store, settings.job_webhook_url, secret(settings.job_webhook_secret) or "")
        if settings.job_webhook_url
        else None
    )
    handlers: dict[str, Handler] = {}
    runner = JobRunner(
        store,
        dispatch(handlers),
        concurrency=settings.job_concurrency,
        lease_s=settings.job_lease_s,
        notifier=notifier,
    )
    jobs = JobService(
        store,
        documents,
        batch_documents=settings.job_batch_documents,
        max_documents=settings.max_documents_per_job,
        max_document_chars=settings.max_document_chars,
        wake=runner.wake,
        webhook_configured=notifier is not None,
    )
    vector_stores = VectorStoreService(
        VectorStoreCatalog(root / VECTOR_STORES_FILE),
        files,
        store,
        documents,
        limits,
        retrieval_mode=settings.retrieval_mode,
        wake=runner.wake,
    )
    handlers.update({DOCUMENTS_JOB: jobs.index_batch, FILE_JOB: vector_stores.index_file_item})
    return Services(
        settings=settings,
        documents=documents,
        chat=ChatService(ChatOptions.from_settings(settings), documents, llm, embedder),
        embeddings=EmbeddingService(embedder.embed_documents, embedder.count_tokens, embedding_model),
        limits=limits,
        files=files,
        jobs=jobs,
        vector_stores=vector_stores,
        runner=runner,
        telemetry=telemetry or NullTelemetry(),
        health=health,
        metrics_text=metrics_text,
    )
