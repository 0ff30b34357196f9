"""The one place the services are assembled (docs/architecture.md §12).

The Ray Serve ingress (``ragserve.deployments.ingress``), the in-process application the tests and the
benchmarks serve (``ragserve.testing.inprocess``) and the HTTP unit tests all call :func:`build_services`, so
the application they exercise is wired exactly like the one that is deployed; only the edges
differ (shard pool, embedder, language model: Ray handles or in-process objects).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
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
from ragserve.service.access import FULL_ACCESS, UNNAMED, Principal, Role, key_owner
from ragserve.service.answer_cache import AnswerCache, AnswerCacheOptions
from ragserve.service.chat import ChatOptions, ChatService
from ragserve.service.documents import DocumentService
from ragserve.service.embeddings import EmbeddingService
from ragserve.service.file_store import FILES_DIR, FileStore
from ragserve.service.ingest_jobs import DOCUMENTS_JOB, Handler, JobService, dispatch
from ragserve.service.limits import RequestLimits
from ragserve.service.retrieval import RetrievalOptions, Retriever
from ragserve.service.shard_service import ShardService
from ragserve.service.usage import USAGE_FILE, UsageBackend, UsageLedger, UsageMeter, UsageService
from ragserve.service.vector_store_catalog import VectorStoreCatalog
from ragserve.service.vector_stores import FILE_JOB, VectorStoreService
from ragserve.telemetry import NullTelemetry, Telemetry

#: Where the ingestion jobs and the vector store catalog live, under ``storage_dir``.
JOBS_FILE = "jobs.sqlite3"
VECTOR_STORES_FILE = "vector_stores.sqlite3"


@dataclass
class Ingestion:
    """Uploaded files, ingestion jobs and vector stores: durable catalogs under ``storage_dir`` and
    the runner that indexes the jobs (docs/architecture.md §8c). One process owns them, since one
    runner takes back what a stopped one left running and SQLite wants one writer on a shared
    volume: the in-process application, or under Ray the single ``Ingestion`` replica
    (``ragserve.deployments.ingestion``), which the ingress replicas reach through its handle (then
    ``runner`` is None here and the stores are its proxies)."""

    files: FileStore
    jobs: JobService
    vector_stores: VectorStoreService
    usage: UsageBackend
    runner: JobRunner | None = None

    async def start(self) -> None:
        """Finish the vector stores' removals a stopped process left owed, then start the runner (it
        takes back the jobs a stopped process left running) and its notifier."""
        if self.runner is not None:
            await self.vector_stores.resume_removals()
            await self.runner.start()

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.stop()
            await self.vector_stores.stop()

    def close(self) -> None:
        if self.runner is not None:  # the owner: close the stores' files
            self.files.close()
            self.jobs.store.close()
            self.vector_stores.catalog.close()
            if isinstance(self.usage, UsageService):
                self.usage.close()


def build_ingestion(settings: Settings, documents: DocumentService, limits: RequestLimits) -> Ingestion:
    """The stores, services and runner of ingestion over ``documents``, for the process that owns them."""
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
    usage = UsageService(UsageLedger(root / USAGE_FILE))
    jobs = JobService(
        store,
        documents,
        batch_documents=settings.job_batch_documents,
        max_documents=settings.max_documents_per_job,
        max_document_chars=settings.max_document_chars,
        wake=runner.wake,
        webhook_configured=notifier is not None,
        usage=usage,
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
    return Ingestion(files, jobs, vector_stores, usage, runner)


@dataclass
class Services:
    """Everything the HTTP routes call."""

    settings: Settings
    documents: DocumentService
    chat: ChatService
    embeddings: EmbeddingService
    limits: RequestLimits
    ingestion: Ingestion
    meter: UsageMeter
    telemetry: Telemetry = field(default_factory=NullTelemetry)
    health: Callable[[], Awaitable[dict[str, Any]]] | None = None
    metrics_text: Callable[[], Awaitable[str]] | None = None

    @property
    def files(self) -> FileStore:
        return self.ingestion.files

    @property
    def jobs(self) -> JobService:
        return self.ingestion.jobs

    @property
    def vector_stores(self) -> VectorStoreService:
        return self.ingestion.vector_stores

    async def start(self) -> None:
        """What runs in the background while the application serves: the job runner (where it
        runs), the usage meter's flushes."""
        await self.ingestion.start()
        await self.meter.start()

    async def stop(self) -> None:
        await self.meter.stop()  # what is buffered is recorded before the owner stops
        await self.ingestion.stop()

    def close(self) -> None:
        """Close the stores' files (after ``stop``)."""
        self.ingestion.close()

    def credentials(self) -> list[tuple[str, Principal]]:
        """The accepted keys in clear with what each may do, for the authentication middleware only."""
        out = []
        for k in self.settings.api_keys or []:
            if isinstance(k, ScopedKey):
                principal = Principal(
                    Role[k.role.upper()],
                    tuple(k.indexes),
                    name=k.name or UNNAMED,
                    requests_per_minute=k.requests_per_minute,
                    tokens_per_day=k.tokens_per_day,
                    owner=key_owner(k.name, k.key.get_secret_value()),
                )
                out.append((k.key.get_secret_value(), principal))
            else:
                secret = k.get_secret_value()
                out.append((secret, replace(FULL_ACCESS, name=UNNAMED, owner=key_owner(None, secret))))
        return out


def build_documents(
    settings: Settings,
    *,
    pool: ShardPool[ShardService],
    embedder: TextEmbedder,
    embedding_model: str,
    embedding_tokenizer: Any | None = None,
) -> DocumentService:
    """The document service over the shards and the embedder.

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
    return DocumentService(
        pool,
        embedder,
        chunker,
        storage_dir=settings.storage_dir,
        embedding_model=embedding_model,
        retriever=Retriever(pool, embedder, RetrievalOptions.from_settings(settings), reranker),
    )


def build_services(
    settings: Settings,
    *,
    pool: ShardPool[ShardService],
    embedder: TextEmbedder,
    llm: LanguageModel,
    embedding_model: str,
    embedding_tokenizer: Any | None = None,
    embedding_max_input_tokens: int | None = None,
    telemetry: Telemetry | None = None,
    health: Callable[[], Awaitable[dict[str, Any]]] | None = None,
    metrics_text: Callable[[], Awaitable[str]] | None = None,
    ingestion: Callable[[DocumentService, RequestLimits], Ingestion] | None = None,
) -> Services:
    """Assemble the services over the given edges.

    ``embedding_max_input_tokens``: what the embedding model reads of a text (None: unknown here, a
    remote model). ``ingestion`` makes the files, jobs and vector stores (by default, owned here:
    :func:`build_ingestion`; the Ray ingress passes the proxies of the ``Ingestion`` deployment)."""
    documents = build_documents(
        settings,
        pool=pool,
        embedder=embedder,
        embedding_model=embedding_model,
        embedding_tokenizer=embedding_tokenizer,
    )
    limits = RequestLimits.from_settings(settings)
    tel = telemetry or NullTelemetry()
    owned = ingestion(documents, limits) if ingestion is not None else build_ingestion(settings, documents, limits)
    # this replica's answer cache (docs/architecture.md §4): the shards say when an answer is stale
    answers = AnswerCache(AnswerCacheOptions.from_settings(settings), on_event=tel.answer_cache)
    return Services(
        settings=settings,
        documents=documents,
        chat=ChatService(
            ChatOptions.from_settings(settings),
            documents,
            llm,
            embedder,
            cache=answers if settings.answer_cache else None,
        ),
        embeddings=EmbeddingService(
            embedder.embed_documents,
            embedder.count_tokens,
            embedding_model,
            max_input_tokens=embedding_max_input_tokens,
            max_tokens_per_input=settings.max_embedding_input_tokens,
            max_tokens_per_request=settings.max_embedding_request_tokens,
        ),
        limits=limits,
        ingestion=owned,
        # usage goes to its owner (here, or the Ingestion deployment), counted in the embedding model's tokens
        meter=UsageMeter(owned.usage, tel, documents.chunker.count_tokens),
        telemetry=tel,
        health=health,
        metrics_text=metrics_text,
    )
