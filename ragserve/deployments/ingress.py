"""Ingress deployment: builds the services over handles and serves ``ragserve.http.create_app``.

All HTTP behaviour lives in ``ragserve.http``; this shell only wires Ray handles into it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from ray import serve

from ragserve import heap, tracing
from ragserve.config import Settings
from ragserve.deployments.clients import HandleEmbedder, HandleGenerator, query_cache_counters
from ragserve.deployments.common import as_settings, log, proxy_host
from ragserve.deployments.ingestion import remote_ingestion
from ragserve.deployments.telemetry import CounterBatch, ServeTelemetry
from ragserve.deployments.vector_index import RayShardPool, get_or_create_shards, reconcile_shards
from ragserve.http import create_app
from ragserve.models.embeddings import LocalEmbeddingModel
from ragserve.ports import LanguageModel, TextEmbedder
from ragserve.service.access import check_exposure
from ragserve.service.engine_factory import make_engine
from ragserve.service.local import EngineClient
from ragserve.service.query_embedding import InProcessQueryEmbedder, choose_query_embedding
from ragserve.service.wiring import Services, build_services


@serve.deployment(name="Ingress", max_ongoing_requests=256, ray_actor_options={"num_cpus": 0.5})
@serve.ingress()
class Ingress:
    async def __init__(  # type: ignore[misc]  # Serve awaits async constructors
        self,
        embedder: Any,
        generator: Any,
        settings: Settings | dict[str, Any] | None = None,
        ingestion: Any = None,
    ):
        tracing.configure("ingress")  # on when OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT is set
        self.settings = s = as_settings(settings)
        check_exposure(await proxy_host(), bool(s.api_keys), s.allow_unauthenticated)
        # the shard actors start (a process and its imports each) while the embedder's replica does
        shards = get_or_create_shards(s)
        info = await embedder.info.remote()
        self.query_embedding = choose_query_embedding(
            s.query_embedding, remote=info["remote"], device=info["device"], params=info["params"]
        )
        self.telemetry = ServeTelemetry()
        self.embedder = await self._embedder(embedder, s, self.query_embedding, self.telemetry.batch)
        # chunks are sized in the embedding model's tokens: its tokenizer, from the copy here if any
        tokenizer = (
            self.embedder.model.tokenizer
            if isinstance(self.embedder, InProcessQueryEmbedder)
            else await embedder.tokenizer.remote()
        )
        if generator is not None:
            handle = HandleGenerator(generator)
            self.llm: LanguageModel = handle
            llm_ready = handle.ready()
        else:  # llm_in_ingress: the remote engine's HTTP client lives here
            client = EngineClient(make_engine(s), s.context_window)
            self.llm = client
            llm_ready = client.start()
        self.pool = RayShardPool(await reconcile_shards(s, shards), s.shard_reads_in_flight)
        self.services: Services = build_services(
            s,
            pool=self.pool,
            embedder=self.embedder,
            llm=self.llm,
            embedding_model=info["model_id"],
            embedding_tokenizer=tokenizer,
            embedding_max_input_tokens=info.get("max_input_tokens"),
            telemetry=self.telemetry,
            health=self._health,
            metrics_text=self._metrics_text,
            # files, jobs, vector stores: owned by the Ingestion deployment (one replica), reached here
            ingestion=remote_ingestion(ingestion, s) if ingestion is not None else None,
        )
        await asyncio.gather(self.pool.wait_ready(), llm_ready)
        self._embedding_model = info["model_id"]
        log.info(
            "ingress ready: shards=%d embedding=%s (queries embedded in the %s) llm=%s",
            s.num_shards,
            info["model_id"],
            self.query_embedding,
            self.llm.model_id,
        )
        heap.settle("ingress")

    @staticmethod
    async def _embedder(handle: Any, s: Settings, where: str, batch: CounterBatch) -> TextEmbedder:
        """The Embedder deployment behind its handle; with queries embedded here, a copy of the
        model in this replica in front of it for ``embed_query`` (documents and token counts still
        go to the deployment). It runs on ``query_embedding_threads`` (one by default), as
        ``query_embedding_graph`` says (a traced graph by default: a query is all overhead)."""
        counted = query_cache_counters(batch)
        if where == "deployment":
            return HandleEmbedder(handle, s.embedding_cache_size, s.embedding_cache_ttl_s, on_lookup=counted)
        model = await asyncio.to_thread(
            LocalEmbeddingModel,
            s.embedding_model,
            device="cpu",
            threads=s.query_embedding_threads,
            graph=s.query_embedding_graph,
        )
        return InProcessQueryEmbedder(
            model,
            HandleEmbedder(handle),
            cache_size=s.embedding_cache_size,
            cache_ttl_s=s.embedding_cache_ttl_s,
            max_batch=s.embedding_batch_size,
            on_lookup=counted,
        )

    async def _health(self) -> dict[str, Any]:
        await self.pool.wait_ready()
        return {
            "status": "ok",
            "model": self.llm.model_id,
            "embedding_model": self._embedding_model,
            "shards": self.pool.num_shards,
        }

    async def _metrics_text(self) -> str:
        """The Prometheus text of this node's Ray metrics agent, where ``ray.serve.metrics`` land."""
        import ray

        node = ray._private.worker.global_worker.node
        if node is None:
            return ""
        port = node.metrics_export_port
        async with httpx.AsyncClient(timeout=5.0) as client:
            resp = await client.get(f"http://127.0.0.1:{port}/metrics")
            return resp.text

    def __serve_build_asgi_app__(self) -> Any:
        return create_app(self.services)

    async def check_health(self) -> None:
        await self.pool.wait_ready()

    def __del__(self) -> None:
        """At the replica's shutdown: the counts of its last second (usage included) are recorded in Ray's metrics."""
        telemetry = getattr(self, "telemetry", None)
        if telemetry is not None:
            telemetry.batch.close()
