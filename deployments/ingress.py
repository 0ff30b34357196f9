"""Ingress deployment: builds the services over handles and serves ``app.http.create_app``.

All HTTP behaviour lives in ``app.http``; this shell only wires Ray handles into it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from ray import serve

from app.config import Settings
from app.engines.factory import make_engine
from app.http import Services, create_app
from app.http.limits import RequestLimits
from app.ingest import DocumentChunker, hf_token_counter
from app.service.chat import ChatService
from app.service.documents import DocumentService
from app.service.local import EngineGenerator
from deployments.clients import HandleEmbedder, HandleGenerator
from deployments.common import as_settings, log
from deployments.telemetry import ServeTelemetry
from deployments.vector_index import RayShardPool, get_or_create_shards, reconcile_shards


def _approx_count(text: str) -> int:
    return max(1, len(text) // 4)


@serve.deployment(name="Ingress", max_ongoing_requests=256, ray_actor_options={"num_cpus": 0.5})
@serve.ingress()
class Ingress:
    async def __init__(self, embedder: Any, generator: Any, settings: Settings | dict[str, Any] | None = None):
        self.settings = s = as_settings(settings)
        self.embedder = HandleEmbedder(embedder, s.embedding_cache_size, s.embedding_cache_ttl_s)
        if generator is not None:
            self.generator: Any = HandleGenerator(generator)
            generator_ready = self.generator.ready()
        else:  # llm_in_ingress: the remote engine's HTTP client lives here
            self.generator = EngineGenerator(make_engine(s), s.context_window)
            generator_ready = self.generator.start()
        self.pool = RayShardPool(await reconcile_shards(s, get_or_create_shards(s)))
        info, tokenizer = await asyncio.gather(embedder.info.remote(), embedder.tokenizer.remote())
        count = hf_token_counter(tokenizer) if tokenizer is not None else _approx_count
        chunker = DocumentChunker(count, s.chunk_size, s.chunk_overlap)
        self.documents = DocumentService(self.pool, self.embedder, chunker, storage_dir=s.storage_dir,
                                         embedding_model=info["model_id"])
        self.chat = ChatService(s, self.documents, self.generator)
        await asyncio.gather(self.pool.wait_ready(), generator_ready)
        self._embedding_model = info["model_id"]
        log.info("ingress ready: shards=%d embedding=%s llm=%s", s.num_shards, info["model_id"],
                 self.generator.model_id)

    async def _health(self) -> dict[str, Any]:
        await self.pool.wait_ready()
        return {"status": "ok", "model": self.generator.model_id, "embedding_model": self._embedding_model,
                "shards": self.pool.num_shards}

    async def _metrics_text(self) -> str:
        """The Prometheus text of this node's Ray metrics agent, where ``ray.serve.metrics`` land."""
        import ray

        port = ray._private.worker.global_worker.node.metrics_export_port
        async with httpx.AsyncClient(timeout=5.0) as client:
            resp = await client.get(f"http://127.0.0.1:{port}/metrics")
            return resp.text

    def __serve_build_asgi_app__(self) -> Any:
        return create_app(Services(
            documents=self.documents, chat=self.chat, embed_texts=self.embedder.embed_documents,
            count_embedding_tokens=self.embedder.count_tokens, embedding_model=self._embedding_model,
            telemetry=ServeTelemetry(), health=self._health, metrics_text=self._metrics_text,
            limits=RequestLimits.from_settings(self.settings), api_keys=self.settings.api_keys))

    async def check_health(self) -> None:
        await self.pool.wait_ready()
