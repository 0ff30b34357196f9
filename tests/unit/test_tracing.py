"""``ragserve.tracing`` (docs/architecture.md §7, "Traces"): on only when an OTLP endpoint is set,
the SDK's own environment handling (resource, sampler), propagation through a carrier, and an off
path that costs next to nothing."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import INVALID_SPAN

from benchmarks.bench_tracing import off_path_us
from ragserve import tracing

OTEL_ENVS = (*tracing.ENDPOINT_ENVS, "OTEL_SDK_DISABLED", "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES")


@pytest.fixture(autouse=True)
def clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for k in (*OTEL_ENVS, "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG", tracing.CONTENT_ENV):
        monkeypatch.delenv(k, raising=False)
    tracing.shutdown()
    yield
    tracing.shutdown()


def test_off_without_an_endpoint_and_when_the_sdk_is_disabled(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not tracing.configure("ingress") and not tracing.ENABLED
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://127.0.0.1:9/v1/traces")
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert not tracing.configure("ingress")
    monkeypatch.delenv("OTEL_SDK_DISABLED")
    assert tracing.configure("ingress") and tracing.ENABLED
    assert tracing.configure("shard") and tracing.process() == "ingress"  # idempotent: the first stays


def test_either_endpoint_variable_turns_it_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    assert tracing.configure("generator")


def test_resource_reads_the_standard_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    exporter = InMemorySpanExporter()
    tracing.configure("shard", exporter)
    with tracing.span("x"):
        pass
    resource = exporter.get_finished_spans()[0].resource.attributes
    assert resource["service.name"] == "ragserve" and resource["ragserve.process"] == "shard"
    assert isinstance(resource["process.pid"], int)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "rag-prod")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment.name=staging")
    exporter = InMemorySpanExporter()
    tracing.configure("ingress", exporter)
    with tracing.span("x"):
        pass
    resource = exporter.get_finished_spans()[0].resource.attributes
    assert resource["service.name"] == "rag-prod" and resource["deployment.environment.name"] == "staging"


def test_sampler_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    exporter = InMemorySpanExporter()
    tracing.configure("ingress", exporter)
    with tracing.span("x") as s:
        assert not s.is_recording()
    assert exporter.get_finished_spans() == ()


def test_a_carrier_parents_the_remote_span() -> None:
    exporter = InMemorySpanExporter()
    tracing.configure("ingress", exporter)
    with tracing.span("caller") as caller:
        carried = tracing.carrier()
    assert carried is not None and set(carried) == {"traceparent"}
    with tracing.remote_span("callee", carried):
        pass
    callee = next(s for s in exporter.get_finished_spans() if s.name == "callee")
    assert callee.parent is not None and callee.parent.span_id == caller.get_span_context().span_id
    assert callee.context.trace_id == caller.get_span_context().trace_id


def test_stage_times_the_stage_and_records_a_failure() -> None:
    exporter = InMemorySpanExporter()
    tracing.configure("ingress", exporter)
    timings: dict[str, float] = {}
    with pytest.raises(ValueError), tracing.stage("search", timings):
        time.sleep(0.01)
        raise ValueError("boom")
    assert timings["search"] >= 0.01
    (span,) = exporter.get_finished_spans()
    assert span.name == "retrieval.search" and not span.status.is_ok and span.events[0].name == "exception"


def test_a_broken_exporter_setting_leaves_tracing_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://127.0.0.1:9/v1/traces")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "not-a-number")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "not-a-number")
    tracing.configure("ingress")  # whatever the SDK makes of it, it does not raise
    with tracing.stage("embed", {}):
        pass


def test_attributes_from_user_input_are_bounded() -> None:
    assert len(tracing.names([f"index-{i}" * 40 for i in range(100)])) == tracing.MAX_NAMES
    assert all(len(n) <= 64 for n in tracing.names(["x" * 1000]))
    assert len(tracing.bounded("y" * 10_000)) == tracing.MAX_ATTRIBUTE_CHARS
    assert tracing.content("secret question") is None  # capture is off by default


def test_off_makes_nothing() -> None:
    """With tracing off the helpers a request calls make no span, carrier or context: a stage only
    times itself. (What that costs, ~8 µs a RAG chat, is printed by ``bench_tracing``, which runs
    ``off_path_us``: speed is measured there, not asserted here.)"""
    assert not tracing.ENABLED
    timings: dict[str, float] = {}
    with tracing.stage("search", timings) as s:
        assert s is INVALID_SPAN
    assert timings["search"] >= 0
    with tracing.span("rag.plan") as s:
        assert s is INVALID_SPAN
    assert tracing.carrier() is None and tracing.start("llm.generate") is INVALID_SPAN
    assert tracing.traceparent(INVALID_SPAN) is None
    assert off_path_us(10) > 0  # the benchmark's loop runs the same helpers without error


def test_content_capture_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    tracing.configure("ingress", InMemorySpanExporter())
    assert not tracing.CONTENT and tracing.content("q") is None
    monkeypatch.setenv(tracing.CONTENT_ENV, "true")
    tracing.configure("ingress", InMemorySpanExporter())
    assert tracing.CONTENT and tracing.content("q" * 5000) == "q" * 1023 + "…"


def test_a_failure_names_its_type_and_code_but_not_its_message_unless_content_is_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ragserve.errors import EngineError

    exporter = InMemorySpanExporter()
    tracing.configure("ingress", exporter)
    secret = "cannot connect to upstream LLM at http://alice:s3cret@llm/v1 about 'my private question'"
    with pytest.raises(EngineError), tracing.stage("generate"):
        raise EngineError(502, secret)
    (span,) = exporter.get_finished_spans()
    event = span.events[0]
    assert event.name == "exception" and event.attributes["exception.type"] == "EngineError"
    assert span.attributes["error.status"] == 502 and not span.status.is_ok
    assert "s3cret" not in repr(span.to_json()) and "private question" not in repr(span.to_json())

    monkeypatch.setenv(tracing.CONTENT_ENV, "true")
    exporter = InMemorySpanExporter()  # the first one was shut down with its provider
    tracing.configure("ingress", exporter)
    with pytest.raises(EngineError), tracing.stage("generate"):
        raise EngineError(502, "with content capture on, the message is kept")
    (span,) = exporter.get_finished_spans()
    assert "the message is kept" in span.events[0].attributes["exception.message"]


def test_an_oversized_traceparent_or_tracestate_is_ignored() -> None:
    tracing.configure("ingress", InMemorySpanExporter())
    good = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    assert tracing.extract({"traceparent": good}) is not None
    ctx = tracing.extract({"traceparent": good, "tracestate": "a=" + "b" * 1_000_000})
    span = tracing.start("child", parent=ctx)
    assert format(span.get_span_context().trace_id, "032x") == good[3:35]  # the parent kept, the state dropped
    span.end()
    ctx = tracing.extract({"traceparent": good + "-" + "0" * 1_000_000})
    span = tracing.start("root", parent=ctx)
    assert format(span.get_span_context().trace_id, "032x") != good[3:35]  # ignored: a trace of its own
    span.end()


def test_an_upstream_url_is_shown_without_its_credentials() -> None:
    from ragserve.models.openai_engine import redacted_url

    assert redacted_url("http://alice:s3cret@llm.example:8000/v1") == "http://llm.example:8000/v1"
    assert redacted_url("https://llm.example/v1") == "https://llm.example/v1"
