"""``ragserve.telemetry.Telemetry`` on Ray Serve's Prometheus metrics (docs/architecture.md §7)."""

from __future__ import annotations

from typing import Any

from ray.serve import metrics

_MS: list[float] = [1, 2, 5, 10, 20, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000]
_TOKENS: list[float] = [1, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768]


def _tags(*keys: str) -> dict[str, Any]:
    """``tag_keys`` as Ray takes them (its annotation says a 1-tuple; any tuple of names works)."""
    return {"tag_keys": keys}


class ServeTelemetry:
    def __init__(self) -> None:
        self._requests = metrics.Counter(
            "ragserve_requests",
            "HTTP requests by route, status, mode and reason.",
            **_tags("route", "status", "mode", "reason"),
        )
        self._latency = metrics.Histogram(
            "ragserve_stage_latency_ms", "Latency of each pipeline stage.", boundaries=_MS, **_tags("stage")
        )
        self._context = metrics.Histogram(
            "ragserve_context_tokens", "Tokens of retrieved context sent.", boundaries=_TOKENS
        )
        self._history = metrics.Histogram("ragserve_history_tokens", "Tokens of chat history sent.", boundaries=_TOKENS)
        self._dropped = metrics.Counter("ragserve_history_messages_dropped", "History messages cut by the budget.")
        self._indexed = metrics.Counter("ragserve_documents_indexed", "Documents acknowledged by POST /index.")
        self._upstream = metrics.Counter("ragserve_upstream_errors", "LLM upstream failures by kind.", **_tags("kind"))
        # usage per API key (its name) and index (docs/architecture.md §7)
        self._usage_requests = metrics.Counter(
            "ragserve_usage_requests", "Requests per API key name and index.", **_tags("key", "index")
        )
        self._usage_tokens = metrics.Counter(
            "ragserve_usage_tokens",
            "Tokens per API key name, index and kind (prompt, completion, embedding).",
            **_tags("key", "index", "kind"),
        )
        self._usage_documents = metrics.Counter(
            "ragserve_usage_documents", "Documents ingested per API key name and index.", **_tags("key", "index")
        )
        self._usage_bytes = metrics.Counter(
            "ragserve_usage_bytes", "Document text bytes ingested per API key name and index.", **_tags("key", "index")
        )
        self._rate_limited = metrics.Counter(
            "ragserve_rate_limited", "Requests refused (429) per API key name and limit.", **_tags("key", "limit")
        )
        # the answer cache of this replica (docs/architecture.md §4, "Answer cache")
        self._answer_cache = {
            "hit": metrics.Counter("ragserve_answer_cache_hits", "RAG answers served from the answer cache."),
            "miss": metrics.Counter(
                "ragserve_answer_cache_misses",
                "RAG answers computed: none kept, a stale one, or Cache-Control: no-cache.",
            ),
            "bypass": metrics.Counter(
                "ragserve_answer_cache_bypasses", "RAG answers that neither read nor kept one (opted out, sampled)."
            ),
            "eviction": metrics.Counter(
                "ragserve_answer_cache_evictions", "Answers dropped for the cache's bounds or their TTL."
            ),
            "invalidation": metrics.Counter(
                "ragserve_answer_cache_invalidations", "Answers dropped because a write changed an index they used."
            ),
        }

    def request(self, route: str, status: int, mode: str = "", reason: str = "") -> None:
        self._requests.inc(tags={"route": route, "status": str(status), "mode": mode, "reason": reason})

    def latency(self, stage: str, seconds: float) -> None:
        self._latency.observe(seconds * 1000, tags={"stage": stage})

    def chat_tokens(self, context_tokens: int, history_tokens: int, history_dropped: int) -> None:
        self._context.observe(context_tokens)
        self._history.observe(history_tokens)
        if history_dropped:
            self._dropped.inc(history_dropped)

    def indexed(self, documents: int) -> None:
        self._indexed.inc(documents)

    def upstream_error(self, kind: str) -> None:
        self._upstream.inc(tags={"kind": kind or "unknown"})

    def usage(self, key: str, index: str, metric: str, value: int) -> None:
        tags = {"key": key, "index": index}
        if metric == "requests":
            self._usage_requests.inc(value, tags=tags)
        elif metric.endswith("_tokens"):
            self._usage_tokens.inc(value, tags={**tags, "kind": metric.removesuffix("_tokens")})
        elif metric == "documents":
            self._usage_documents.inc(value, tags=tags)
        elif metric == "bytes":
            self._usage_bytes.inc(value, tags=tags)

    def rate_limited(self, key: str, limit: str) -> None:
        self._rate_limited.inc(tags={"key": key, "limit": limit})

    def answer_cache(self, event: str) -> None:
        counter = self._answer_cache.get(event)
        if counter is not None:
            counter.inc()
