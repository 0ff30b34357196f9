"""``ragserve.telemetry.Telemetry`` on Ray Serve's Prometheus metrics (docs/architecture.md §7)."""

from __future__ import annotations

import logging
import math
import threading
import weakref
from typing import Any, Protocol

from ray.serve import metrics

_MS: list[float] = [1, 2, 5, 10, 20, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000]
_TOKENS: list[float] = [1, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768]


def _tags(*keys: str) -> dict[str, Any]:
    """``tag_keys`` as Ray takes them (its annotation says a 1-tuple; any tuple of names works)."""
    return {"tag_keys": keys}


#: How often counted increments reach Ray's metrics (``CounterBatch``). Ray's agent exports every
#: few seconds and Prometheus scrapes every 10-15: a second more is invisible to a dashboard.
FLUSH_S = 1.0
log = logging.getLogger("ragserve.telemetry")


class _Incrementable(Protocol):
    """What ``CounterBatch`` hands its sums to: a Ray (Serve) metrics ``Counter``."""

    def inc(self, value: float = ..., tags: dict[str, str] = ...) -> Any: ...


class CounterBatch:
    """Counter increments summed here and handed to their counters once a ``flush_s``, by a thread
    of its own (and by ``flush``), instead of one metric record a request each.

    Why: each ``Counter.inc`` of Ray Serve merges its context's tags, checks them and records
    through Ray's core worker, and a request increments several (its route, its usage, cache
    lookups): ~4 % of the ingress's CPU under load (docs/benchmarks.md, issue 28). Summed, a busy
    second costs one record per counter and tag set. Histograms are still observed one value at a
    time (a sum would lose their distribution). The thread holds the batch weakly and ends with it."""

    def __init__(self, flush_s: float = FLUSH_S):
        # re-entrant: a ``__del__`` the garbage collector runs on a thread inside ``inc`` or ``flush``
        # may close a batch there, and must not wait for itself
        self._lock = threading.RLock()
        self._closed = False
        self._pending: dict[tuple[int, tuple[tuple[str, str], ...]], list[Any]] = {}
        self._stop = threading.Event()
        thread = threading.Thread(target=_flush_every, args=(weakref.ref(self), self._stop, flush_s), daemon=True)
        thread.name = "metric-counter-flush"
        thread.start()

    def inc(self, counter: _Incrementable, value: float = 1.0, tags: dict[str, str] | None = None) -> None:
        """Count ``value`` under ``tags``. Metrics never fail a request: zero counts nothing, and a
        value Ray's ``Counter.inc`` would refuse (negative, not finite, not a number) is logged and
        dropped here, where it is counted; tag values are made str, so the flush cannot fail on them."""
        if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
            log.warning("a metric counter was given %r; not counted", value)
            return
        if value == 0:
            return
        if tags and not all(isinstance(k, str) and isinstance(v, str) for k, v in tags.items()):
            tags = {str(k): str(v) for k, v in tags.items()}
        key = (id(counter), tuple(sorted(tags.items())) if tags else ())
        with self._lock:
            entry = self._pending.get(key)
            if entry is None:
                self._pending[key] = [counter, value, dict(tags or {})]
            else:
                entry[1] += value
        if self._closed:  # no thread flushes any more (a request still finishing at shutdown)
            self.flush()

    def flush(self) -> None:
        """Hand each sum to its counter. One that fails is logged and dropped: the others, and the
        flushes after it, still go out."""
        with self._lock:
            pending, self._pending = self._pending, {}
        for counter, value, tags in pending.values():
            try:
                counter.inc(value, tags=tags)
            except Exception:
                log.exception("a metric counter refused %r with tags %r; dropped", value, tags)

    def close(self) -> None:
        """Flush what is counted and stop the thread; a count after this is handed over at once."""
        self._closed = True
        self._stop.set()
        self.flush()

    def __del__(self) -> None:
        self._stop.set()


def _flush_every(batch: weakref.ref[CounterBatch], stop: threading.Event, flush_s: float) -> None:
    while not stop.wait(flush_s):
        alive = batch()
        if alive is None:
            return
        try:
            alive.flush()
        except Exception:  # never end the thread: no counter would reach Ray again
            log.exception("flushing the metric counters failed")
        del alive


class ServeTelemetry:
    def __init__(self) -> None:
        self.batch = CounterBatch()
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
        self.batch.inc(self._requests, tags={"route": route, "status": str(status), "mode": mode, "reason": reason})

    def latency(self, stage: str, seconds: float) -> None:
        self._latency.observe(seconds * 1000, tags={"stage": stage})

    def chat_tokens(self, context_tokens: int, history_tokens: int, history_dropped: int) -> None:
        self._context.observe(context_tokens)
        self._history.observe(history_tokens)
        if history_dropped:
            self.batch.inc(self._dropped, history_dropped)

    def indexed(self, documents: int) -> None:
        self.batch.inc(self._indexed, documents)

    def upstream_error(self, kind: str) -> None:
        self.batch.inc(self._upstream, tags={"kind": kind or "unknown"})

    def usage(self, key: str, index: str, metric: str, value: int) -> None:
        tags = {"key": key, "index": index}
        if metric == "requests":
            self.batch.inc(self._usage_requests, value, tags=tags)
        elif metric.endswith("_tokens"):
            self.batch.inc(self._usage_tokens, value, tags={**tags, "kind": metric.removesuffix("_tokens")})
        elif metric == "documents":
            self.batch.inc(self._usage_documents, value, tags=tags)
        elif metric == "bytes":
            self.batch.inc(self._usage_bytes, value, tags=tags)

    def rate_limited(self, key: str, limit: str) -> None:
        self.batch.inc(self._rate_limited, tags={"key": key, "limit": limit})

    def answer_cache(self, event: str) -> None:
        counter = self._answer_cache.get(event)
        if counter is not None:
            self.batch.inc(counter)
