"""Traces with the OpenTelemetry SDK (docs/architecture.md §7, "Traces").

Each process that emits spans calls :func:`configure` once when it starts (every deployment, each
shard actor, the in-process app). Tracing is on only when ``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set (and ``OTEL_SDK_DISABLED`` is not ``true``): spans are
then exported over OTLP/HTTP (protobuf) by a ``BatchSpanProcessor``; the SDK reads the rest of the
standard variables itself (``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``,
``OTEL_TRACES_SAMPLER``/``_ARG``, ``OTEL_BSP_*``, the exporter's headers and timeout). Off, every
helper here returns at once after one test of :data:`ENABLED` (callers test it too before building
attributes), and no span, context or header is made.

The provider is this module's own, not the API's global one: a test or a benchmark can install an
exporter, and turn tracing on and off, in one process. Context crosses a Ray hop as a W3C carrier
dict (:func:`carrier` on the caller's side, :func:`remote_span` on the callee's), never through
Ray's own tracing hooks. No attribute carries a query, a prompt, document text or a key unless
``RAGSERVE_TRACE_CONTENT=true`` (:data:`CONTENT`); every attribute from user input is bounded.

Nothing here raises into a request: a span that cannot be made is the API's invalid span.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import INVALID_SPAN, Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

log = logging.getLogger("ragserve.tracing")

#: True once :func:`configure` installed a provider (and not turned off since): read it as
#: ``tracing.ENABLED`` (a module attribute, it changes), before building a span's attributes.
ENABLED = False
#: Whether spans may carry content (the query text): ``RAGSERVE_TRACE_CONTENT=true``; off by default.
CONTENT = False
#: The longest string attribute taken from a request (index names, a query with content capture).
MAX_ATTRIBUTE_CHARS = 256
#: Index names listed on a span at most (the count is always given).
MAX_NAMES = 8
#: The longest ``traceparent``/``tracestate`` value taken from a request or a carrier.
MAX_CARRIER_CHARS = 512
CONTENT_ENV = "RAGSERVE_TRACE_CONTENT"
ENDPOINT_ENVS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")

#: The span of each stage that ``Server-Timing`` reports (one definition of a stage: :func:`stage`).
STAGE_SPANS = {
    "cache": "rag.cache",
    "rewrite": "rag.rewrite",
    "embed": "embedding.query",
    "search": "retrieval.search",
    "rerank": "retrieval.rerank",
    "fit": "rag.fit",
    "evidence": "rag.evidence",
    "generate": "llm.generate",
}

_PROPAGATOR = TraceContextTextMapPropagator()
_lock = threading.Lock()
_provider: Any = None
_tracer: Any = None
_process = ""


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in {"1", "true", "yes", "on"}


def wanted() -> bool:
    """Whether the environment asks for traces: an OTLP endpoint is set and the SDK is not disabled."""
    if _truthy(os.environ.get("OTEL_SDK_DISABLED")):
        return False
    return any(os.environ.get(k) for k in ENDPOINT_ENVS)


def configure(process: str, exporter: Any = None, *, batch: bool | None = None) -> bool:
    """Turn tracing on in this process if the environment asks for it (or ``exporter`` is given:
    tests and benchmarks), naming the process's role in the resource (``ragserve.process``:
    ingress, shard, generator, embedder, ingestion, inprocess). Idempotent: a second call without an
    exporter keeps what the first installed. ``batch``: export in the background (the default for
    the environment's OTLP exporter; a given exporter is called synchronously unless ``batch``).
    Returns whether tracing is on."""
    global ENABLED, CONTENT, _provider, _tracer, _process
    with _lock:
        if exporter is None and (_provider is not None or not wanted()):
            return ENABLED
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

            if exporter is None:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

                exporter = OTLPSpanExporter()  # reads the endpoint, headers, timeout from the environment
                batch = True if batch is None else batch
            resource = Resource.create({"ragserve.process": process, "process.pid": os.getpid()})
            if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
                resource = resource.merge(Resource({"service.name": "ragserve"}))
            provider = TracerProvider(resource=resource)  # the sampler: OTEL_TRACES_SAMPLER(_ARG)
            provider.add_span_processor(BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter))
        except Exception:  # a broken exporter setting must not stop the server: it serves untraced
            log.exception("tracing not configured")
            return ENABLED
        old = _provider
        _provider, _tracer, _process = provider, provider.get_tracer("ragserve"), process
        CONTENT = _truthy(os.environ.get(CONTENT_ENV))
        ENABLED = True
    if old is not None:
        old.shutdown()
    log.info("tracing on: process=%s content=%s", process, CONTENT)
    return True


def enable(on: bool) -> None:
    """Turn the installed provider's spans on or off (a benchmark compares both in one run)."""
    global ENABLED
    ENABLED = bool(on) and _provider is not None


def flush(timeout_s: float = 10.0) -> None:
    """Export what is buffered now (a test waiting for spans, a process about to stop)."""
    if _provider is not None:
        _provider.force_flush(int(timeout_s * 1000))


def shutdown() -> None:
    """Flush and forget the provider: tracing is off until :func:`configure` again."""
    global ENABLED, _provider, _tracer
    with _lock:
        provider, _provider, _tracer, ENABLED = _provider, None, None, False
    if provider is not None:
        provider.shutdown()


# --- spans ------------------------------------------------------------------------------------


def start(
    name: str, attributes: Mapping[str, Any] | None = None, kind: SpanKind = SpanKind.INTERNAL, parent: Any = None
) -> Span:
    """A span, child of the current one (or of the context ``parent``), not made current; end it
    with ``span.end()``. The invalid (non-recording) span when tracing is off or it fails."""
    if not ENABLED or _tracer is None:
        return INVALID_SPAN
    try:
        if attributes:
            attributes = {k: v for k, v in attributes.items() if v is not None}
        return _tracer.start_span(name, context=parent, kind=kind, attributes=attributes)
    except Exception:
        log.debug("span %s not started", name, exc_info=True)
        return INVALID_SPAN


@contextmanager
def use(span: Span) -> Iterator[Span]:
    """``span`` made current for the block (children parent under it); it is not ended here."""
    if span is INVALID_SPAN or not ENABLED:
        yield span
        return
    token = otel_context.attach(trace.set_span_in_context(span))
    try:
        yield span
    finally:
        otel_context.detach(token)


@contextmanager
def span(
    name: str, attributes: Mapping[str, Any] | None = None, kind: SpanKind = SpanKind.INTERNAL, parent: Any = None
) -> Iterator[Span]:
    """A span current for the block, ended after it; an exception is recorded and re-raised."""
    if not ENABLED:
        yield INVALID_SPAN
        return
    s = start(name, attributes, kind, parent)
    try:
        with use(s):
            yield s
    except BaseException as e:
        failed(s, e)
        raise
    finally:
        s.end()


def failed(s: Span, e: BaseException) -> None:
    """Record ``e`` on ``s`` as its error (not a client's leaving: a cancelled request or stream is
    no error). Its type, and the code and status of a ServiceError; its message only with content
    capture on (:data:`CONTENT`), since it may quote what capture keeps out."""
    if s is INVALID_SPAN or isinstance(e, (GeneratorExit, asyncio.CancelledError)):
        return
    try:
        if CONTENT:
            s.record_exception(e)
        else:  # an error's message may hold what content capture keeps out (a prompt, an upstream URL's credentials)
            code = getattr(e, "code", None)
            s.add_event(
                "exception",
                {"exception.type": type(e).__name__, **({"error.code": str(code)[:64]} if code else {})},
            )
            status = getattr(e, "status", None)
            if isinstance(status, int):
                s.set_attribute("error.status", status)
        s.set_status(Status(StatusCode.ERROR, type(e).__name__))
    except Exception:
        pass


@contextmanager
def stage(
    name: str, timings: dict[str, float] | None = None, attributes: Mapping[str, Any] | None = None
) -> Iterator[Span]:
    """One stage of a request: its seconds added to ``timings[name]`` (``Server-Timing`` and the
    latency metrics) and, with tracing on, its span (:data:`STAGE_SPANS`) current for the block."""
    t0 = time.perf_counter()
    try:
        if not ENABLED:
            yield INVALID_SPAN
        else:
            with span(STAGE_SPANS.get(name, name), attributes) as s:
                yield s
    finally:
        if timings is not None:
            timings[name] = timings.get(name, 0.0) + time.perf_counter() - t0


async def within(s: Span, items: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """``items``, each one awaited with ``s`` current (a stream's producer opens its spans, and
    injects its context, under ``s``), without holding ``s`` current between items (a stream is
    consumed, and may be closed, by other tasks)."""
    iterator = aiter(items)
    try:
        while True:
            with use(s):
                try:
                    item = await anext(iterator)
                except StopAsyncIteration:
                    return
            yield item
    finally:
        close = getattr(iterator, "aclose", None)
        if close is not None:
            with use(s):
                await close()


def set_attributes(s: Span, attributes: Mapping[str, Any]) -> None:
    if s is INVALID_SPAN:
        return
    with suppress(Exception):
        s.set_attributes({k: v for k, v in attributes.items() if v is not None})


# --- propagation --------------------------------------------------------------------------------


def carrier(s: Span | None = None) -> dict[str, str] | None:
    """The W3C ``traceparent``/``tracestate`` of the current context (or of ``s``), for a call to
    another process; None when tracing is off (nothing is passed then)."""
    if not ENABLED:
        return None
    out: dict[str, str] = {}
    try:
        ctx = trace.set_span_in_context(s) if s is not None else None
        _PROPAGATOR.inject(out, context=ctx)
    except Exception:
        return None
    return out or None


def extract(headers: Mapping[str, str] | None) -> Any:
    """The context a carrier (or a request's headers) names; None without one."""
    if not headers:
        return None
    # W3C bounds (a traceparent is 55 characters, a tracestate at most 32 members of ~256): longer is
    # ignored here, so a client cannot make every request log the propagator's warning
    headers = {k: v for k, v in headers.items() if len(v) <= MAX_CARRIER_CHARS}
    try:
        return _PROPAGATOR.extract(headers)
    except Exception:
        return None


@contextmanager
def remote_span(
    name: str,
    trace_carrier: Mapping[str, str] | None,
    attributes: Mapping[str, Any] | None = None,
    kind: SpanKind = SpanKind.INTERNAL,
) -> Iterator[Span]:
    """The span of a call received from another process, child of the caller's span (its
    ``trace_carrier``); without one, of the current span (a call in the same process)."""
    if not ENABLED:
        yield INVALID_SPAN
        return
    with span(name, attributes, kind, parent=extract(trace_carrier)) as s:
        yield s


def traceparent(s: Span) -> str | None:
    """``s``'s W3C ``traceparent`` (what a response carries back); None for the invalid span."""
    ctx = s.get_span_context()
    if not ctx.is_valid:
        return None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


# --- attributes -----------------------------------------------------------------------------------


def bounded(text: str, limit: int = MAX_ATTRIBUTE_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def names(values: Sequence[str]) -> list[str]:
    """At most :data:`MAX_NAMES` names (index names are data a client chose), each bounded."""
    return [bounded(v, 64) for v in list(values)[:MAX_NAMES]]


def content(text: str | None) -> str | None:
    """``text`` bounded, when content capture is on; else None (left off the span)."""
    if not CONTENT or text is None:
        return None
    return bounded(text, 1024)


def process() -> str:
    """The role this process was configured as (empty before :func:`configure`)."""
    return _process
