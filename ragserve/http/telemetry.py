"""Counting every response for the metrics, and what ``GET /metrics`` shows to whom
(docs/architecture.md §7)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from ragserve.telemetry import Telemetry

#: The label that names an index (``ray_ragserve_shard_documents``/``_chunks``, ``ray_ragserve_usage_*``).
#: Index names are data: the open ``/metrics`` sums their series over it; a key that reaches every
#: index sees them.
INDEX_LABEL = "index"
#: The label that names an API key (its ``name``: ``ray_ragserve_usage_*``, ``ray_ragserve_rate_limited``):
#: which teams use the server is data too, summed away with the index names.
KEY_LABEL = "key"
DATA_LABELS = (INDEX_LABEL, KEY_LABEL)


class _Families:
    """A prometheus_client collector that yields already-built families (for ``generate_latest``)."""

    def __init__(self, families: Iterable[Metric]):
        self._families = list(families)

    def collect(self) -> Iterable[Metric]:
        return self._families


def without_data_labels(text: str, labels: Sequence[str] = DATA_LABELS) -> str:
    """The Prometheus text ``text`` with every series that carries one of ``labels`` (by default an
    index and a key's name) summed over them (per shard, per stage, per token kind...: the other
    labels are kept), so that it names none of them. Text without them comes back unchanged."""
    if not labels or not any(f'{label}="' in text for label in labels):
        return text
    try:
        return _summed_over(text, frozenset(labels))
    except ValueError:  # text the parser does not read: leave out every line naming one
        return "".join(
            line for line in text.splitlines(keepends=True) if not any(f'{label}="' in line for label in labels)
        )


def _summed_over(text: str, labels: frozenset[str]) -> str:
    families = []
    for family in text_string_to_metric_families(text):
        if not any(label in s.labels for s in family.samples for label in labels):
            families.append(family)
            continue
        merged: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        for s in family.samples:
            key = (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k not in labels)))
            if key not in merged:
                merged[key] = s.value
            elif s.name.endswith("_created"):  # a creation time: the earliest, not a sum
                merged[key] = min(merged[key], s.value)
            else:
                merged[key] += s.value
        family.samples = [Sample(name, dict(labels), value) for (name, labels), value in merged.items()]
        families.append(family)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))
    return generate_latest(registry).decode()


class RequestCountingMiddleware:
    """Reports every response by route template, status and RAG mode/reason headers.

    Pure ASGI on purpose: Starlette's ``BaseHTTPMiddleware`` (``@app.middleware("http")``) runs
    each request through an extra task group and response wrapper, about a millisecond a request
    on this class of machine, which the passthrough path cannot afford."""

    def __init__(self, app: Any, telemetry: Telemetry):
        self.app = app
        self.telemetry = telemetry

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        def route() -> str:  # the router records the matched route in the shared scope
            return getattr(scope.get("route"), "path", "unmatched")

        async def counting_send(message: dict[str, Any]) -> None:
            nonlocal started
            if message["type"] == "http.response.start" and not started:
                started = True
                headers = {k.lower(): v for k, v in message.get("headers", [])}
                self.telemetry.request(
                    route(),
                    message["status"],
                    headers.get(b"x-rag-mode", b"").decode("latin-1"),
                    headers.get(b"x-rag-reason", b"").decode("latin-1"),
                )
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        except Exception:
            if not started:
                self.telemetry.request(route(), 500)
            raise
