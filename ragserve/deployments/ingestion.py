"""The Ingestion deployment: the one owner of uploaded files, ingestion jobs, vector stores and the
usage ledger (``ragserve.service.wiring.Ingestion``), and the job runner (docs/architecture.md §8c).
Every ingress replica admits its limited keys' requests and records usage here, so a rate limit is
the server's, not a replica's (docs/architecture.md §7).

Why a deployment of its own: the ingress scales to many replicas on many nodes, but a job runner
takes back, when it starts, what a stopped runner left running, and SQLite wants one writer on a
shared volume. So one replica (``num_replicas: 1``) owns the catalogs under ``storage_dir`` and runs
the jobs; Serve restarts it, on another node if need be, and it reopens them from the volume and
takes its jobs back. The ingress replicas reach it through :func:`remote_ingestion`: every call of
the routes is forwarded by name (only the public methods of the service classes), and an uploaded
file's bytes are written by the ingress itself on the shared volume
(``ragserve.service.file_store.SharedFileStore``), so a large upload never crosses an actor call.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, cast

from ray import serve

from ragserve import heap, tracing
from ragserve.config import Settings
from ragserve.deployments.clients import HandleEmbedder, traced
from ragserve.deployments.common import as_settings, log, unwrap_error
from ragserve.deployments.vector_index import RayShardPool, get_or_create_shards, reconcile_shards
from ragserve.errors import ServiceError
from ragserve.service.documents import DocumentService
from ragserve.service.file_store import FILES_DIR, FileStore, SharedFileStore
from ragserve.service.ingest_jobs import JobService
from ragserve.service.limits import RequestLimits
from ragserve.service.usage import UsageBackend, UsageService
from ragserve.service.vector_stores import VectorStoreService
from ragserve.service.wiring import Ingestion as IngestionServices
from ragserve.service.wiring import build_documents, build_ingestion

#: What the ingress may call, by target: the public coroutine methods of each service class.
TARGETS: dict[str, type] = {
    "files": FileStore,
    "jobs": JobService,
    "vector_stores": VectorStoreService,
    "usage": UsageService,  # the usage ledger and limiter: one count for every ingress replica
}


def served_methods(cls: type) -> frozenset[str]:
    return frozenset(
        name for name, fn in inspect.getmembers(cls, inspect.iscoroutinefunction) if not name.startswith("_")
    )


_SERVED = {target: served_methods(cls) for target, cls in TARGETS.items()}


def check_call(target: str, method: str) -> None:
    """Only a public coroutine method of a service class is called by name (never an attribute,
    a private helper or a synchronous method that would block the replica's loop)."""
    if method not in _SERVED.get(target, frozenset()):
        raise ValueError(f"{target}.{method} is not served by the Ingestion deployment")


@serve.deployment(
    name="Ingestion",
    num_replicas=1,
    max_ongoing_requests=128,
    graceful_shutdown_timeout_s=60,
    ray_actor_options={"num_cpus": 0.25},
)
class Ingestion:
    async def __init__(self, embedder: Any, settings: Settings | dict[str, Any] | None = None):  # type: ignore[misc]
        tracing.configure("ingestion")  # on when OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT is set
        s = as_settings(settings)
        info = await embedder.info.remote()
        tokenizer = await embedder.tokenizer.remote()
        pool = RayShardPool(await reconcile_shards(s, get_or_create_shards(s)), s.shard_reads_in_flight)
        documents = build_documents(
            s,
            pool=pool,
            embedder=HandleEmbedder(embedder),
            embedding_model=info["model_id"],
            embedding_tokenizer=tokenizer,
        )
        self.core = build_ingestion(s, documents, RequestLimits.from_settings(s))
        await pool.wait_ready()
        await self.core.start()
        log.info("ingestion ready: job_concurrency=%d storage=%s", s.job_concurrency, s.storage_dir)
        heap.settle("ingestion")

    async def call(
        self, target: str, method: str, *args: Any, trace: Mapping[str, str] | None = None, **kwargs: Any
    ) -> Any:
        """``target.method(*args, **kwargs)``; ``trace``: the ingress's W3C context, for this call's
        span (``ingestion.<target>.<method>``, docs/architecture.md §7)."""
        check_call(target, method)
        with tracing.remote_span(f"ingestion.{target}.{method}", trace):
            return await getattr(getattr(self.core, target), method)(*args, **kwargs)

    async def check_health(self) -> None:
        runner = self.core.runner
        if runner is None or not runner.alive:
            raise RuntimeError("the job runner is not running")

    async def __del__(self) -> None:
        await self.core.stop()
        self.core.close()


class _Forward:
    """A service's methods called on the Ingestion deployment by name, its errors re-raised as the
    service raised them (``ServiceError``: the same 4xx as in one process)."""

    def __init__(self, handle: Any, target: str):
        self._handle = handle
        self._target = target

    def __getattr__(self, method: str) -> Callable[..., Any]:
        check_call(self._target, method)

        async def forward(*args: Any, **kwargs: Any) -> Any:
            try:
                return await self._handle.call.remote(self._target, method, *args, **traced(**kwargs))
            except Exception as e:
                inner = unwrap_error(e)
                if isinstance(inner, ServiceError):
                    raise inner from None
                raise

        return forward


def remote_ingestion(handle: Any, settings: Settings) -> Callable[[DocumentService, RequestLimits], IngestionServices]:
    """What an ingress replica builds its ``Services.ingestion`` with: proxies of the deployment
    behind ``handle``; uploaded bytes read and written here on the shared ``storage_dir``."""
    from pathlib import Path

    files = _Forward(handle, "files")

    async def records(method: str, *args: Any) -> Any:
        return await getattr(files, method)(*args)

    def make(_: DocumentService, __: RequestLimits) -> IngestionServices:
        return IngestionServices(
            files=SharedFileStore(Path(settings.storage_dir) / FILES_DIR, settings.max_file_bytes, records),
            jobs=cast(JobService, _Forward(handle, "jobs")),
            vector_stores=cast(VectorStoreService, _Forward(handle, "vector_stores")),
            usage=cast(UsageBackend, _Forward(handle, "usage")),
            runner=None,
        )

    return make
