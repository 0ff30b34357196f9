"""The ragserve HTTP application built in-process from its real parts (shards, chunker, embedder,
the OpenAI engine adapter) with no Ray: what the unit, fuzz and load smoke tests serve.

The LLM is the one edge we cannot run here, so the generator talks to a fake upstream URL.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from ragserve import tracing
from ragserve.config import Settings
from ragserve.http import create_app
from ragserve.models.engine import GenerationEngine
from ragserve.models.openai_engine import OpenAIEngine
from ragserve.service.local import EngineClient
from ragserve.service.pool import LocalShardPool
from ragserve.service.shard_service import ShardService, check_layout
from ragserve.service.wiring import build_services


class RecordingTelemetry:
    """Telemetry that keeps what it is told, for assertions."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, int, str, str]] = []
        self.latencies: dict[str, float] = {}
        self.upstream: list[str] = []
        self.tokens: list[tuple[int, int, int]] = []
        self.indexed_docs = 0
        self.usage_counts: dict[tuple[str, str, str], int] = {}
        self.limited: list[tuple[str, str]] = []
        self.answer_cache_events: dict[str, int] = {}

    def request(self, route: str, status: int, mode: str = "", reason: str = "") -> None:
        self.requests.append((route, status, mode, reason))

    def latency(self, stage: str, seconds: float) -> None:
        self.latencies[stage] = seconds

    def chat_tokens(self, context_tokens: int, history_tokens: int, history_dropped: int) -> None:
        self.tokens.append((context_tokens, history_tokens, history_dropped))

    def indexed(self, documents: int) -> None:
        self.indexed_docs += documents

    def upstream_error(self, kind: str) -> None:
        self.upstream.append(kind)

    def usage(self, key: str, index: str, metric: str, value: int) -> None:
        self.usage_counts[(key, index, metric)] = self.usage_counts.get((key, index, metric), 0) + value

    def rate_limited(self, key: str, limit: str) -> None:
        self.limited.append((key, limit))

    def answer_cache(self, event: str) -> None:
        self.answer_cache_events[event] = self.answer_cache_events.get(event, 0) + 1


@contextmanager
def inprocess_app(
    storage_dir: Path,
    embedder: Any,
    llm_url: str | None,
    *,
    telemetry: Any = None,
    engine: GenerationEngine | None = None,
    metrics_text: Any = None,
    **settings: Any,
) -> Iterator[tuple[FastAPI, Settings]]:
    """Yield ``(app, settings)``; the shards are closed on exit. ``settings`` override Settings fields
    (``llm_engine`` too: a caller that serves the embedded engine says so, as a deployment would).
    ``engine``: serve this engine (e.g. the real embedded TransformersEngine) instead of the OpenAI
    adapter to ``llm_url`` (None: there is none, as with ``llm_engine="transformers"``)."""
    s = Settings(
        storage_dir=str(storage_dir),
        **{
            "llm_engine": "openai",
            "llm_url": llm_url,
            "num_shards": 2,
            "default_max_tokens": 64,
            "chunk_size": 128,
            "chunk_overlap": 16,
            **settings,
        },
    )
    tracing.configure("inprocess")  # on when OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT is set
    check_layout(s.storage_dir, s.num_shards)
    pool = LocalShardPool([ShardService(s.storage_dir, i, s.num_shards) for i in range(s.num_shards)])
    llm = EngineClient(engine or OpenAIEngine(str(s.llm_url), s.llm_model or "fake-model", None, s.llm_timeout_s))
    services = build_services(
        s,
        pool=pool,
        embedder=embedder,
        llm=llm,
        embedding_model="all-MiniLM-L6-v2",
        embedding_tokenizer=embedder.model.tokenizer,
        embedding_max_input_tokens=getattr(embedder.model, "max_seq_length", None),
        telemetry=telemetry,
        metrics_text=metrics_text,
    )
    try:
        yield create_app(services), s
    finally:
        pool.close()
        services.close()
