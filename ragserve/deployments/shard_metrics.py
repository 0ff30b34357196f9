"""Shard sizes as Prometheus gauges (``ray_ragserve_shard_documents`` / ``_chunks``, by shard and
index), for the dashboard's shard panels: each shard actor publishes its own counts every
``interval_s`` from a daemon thread, so no request path pays for them."""

from __future__ import annotations

import threading
from typing import Any, Protocol

from ragserve.deployments.common import log

INTERVAL_S = 15.0


class _Gauge(Protocol):
    def set(self, value: int | float | None, tags: dict[str, str] = ...) -> None: ...


def publish_sizes(stats: dict[str, Any], documents: _Gauge, chunks: _Gauge, seen: set[str]) -> set[str]:
    """Set both gauges from ``ShardService.stats()``; an index seen before and gone now is set to 0
    (a dropped index would otherwise keep its last size forever). Returns the indexes now present."""
    shard = str(stats["shard"])
    now = set(stats["indexes"])
    for name, counts in stats["indexes"].items():
        documents.set(counts["documents"], tags={"shard": shard, "index": name})
        chunks.set(counts["chunks"], tags={"shard": shard, "index": name})
    for name in seen - now:
        documents.set(0, tags={"shard": shard, "index": name})
        chunks.set(0, tags={"shard": shard, "index": name})
    return now


def start_size_gauges(service: Any, interval_s: float = INTERVAL_S) -> threading.Thread:
    """Publish ``service.stats()`` (a ``ShardService``) every ``interval_s`` until the process ends."""
    from ray.util import metrics

    documents = metrics.Gauge("ragserve_shard_documents", "Documents per shard and index.", tag_keys=("shard", "index"))
    chunks = metrics.Gauge(
        "ragserve_shard_chunks", "Chunks (vectors) per shard and index.", tag_keys=("shard", "index")
    )
    stop = threading.Event()

    def loop() -> None:
        seen: set[str] = set()
        while not stop.wait(interval_s):
            try:
                seen = publish_sizes(service.stats(), documents, chunks, seen)
            except Exception as e:  # a closed or busy shard: try again next time
                log.debug("shard size gauges not updated: %s", e)

    thread = threading.Thread(target=loop, name="ragserve-shard-gauges", daemon=True)
    thread.start()
    return thread
