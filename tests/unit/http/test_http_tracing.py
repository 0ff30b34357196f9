"""Traces of the in-process application (docs/architecture.md §7, "Traces"): the span tree of a
request, the W3C ``traceparent`` in and out, content capture off by default, and nothing at all
with tracing off. Spans are kept by the SDK's in-memory exporter; the application is the real one
against the fake upstream."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from ragserve import tracing
from ragserve.testing.fake_openai import FakeOpenAI
from ragserve.testing.inprocess import inprocess_app

QUESTION = "What does the KAITO operator automate?"
DOCS = [
    {"text": "KAITO is a Kubernetes operator that automates AI model inference and fine-tuning on GPU nodes."},
    {"text": "FAISS is a library for efficient similarity search and clustering of dense vectors."},
]
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(answer="The answer is in the sources [1].", model="fake-model", max_model_len=4096) as f:
        yield f


@pytest.fixture
def exporter(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    monkeypatch.delenv(tracing.CONTENT_ENV, raising=False)
    out = InMemorySpanExporter()
    tracing.configure("inprocess", out)
    yield out
    tracing.shutdown()


def serve(tmp_path: Any, embedder: Any, fake: FakeOpenAI) -> Any:
    return inprocess_app(tmp_path, embedder, fake.url, llm_timeout_s=10.0)


@pytest.fixture
def client(tmp_path, embedder, fake: FakeOpenAI) -> Iterator[TestClient]:
    with serve(tmp_path, embedder, fake) as (app, _), TestClient(app) as c:
        assert c.post("/index", json={"index_name": "kb", "documents": DOCS}).status_code == 200
        fake.reset()
        yield c


def chat(client: TestClient, headers: dict[str, str] | None = None, **body: Any) -> Any:
    body.setdefault("messages", [{"role": "user", "content": QUESTION}])
    return client.post("/v1/chat/completions", json=body, headers=headers or {})


def one_trace(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    spans = list(exporter.get_finished_spans())
    assert len({s.context.trace_id for s in spans}) == 1, [s.name for s in spans]
    return spans


def by_name(spans: list[ReadableSpan]) -> dict[str, list[ReadableSpan]]:
    out: dict[str, list[ReadableSpan]] = {}
    for s in spans:
        out.setdefault(s.name, []).append(s)
    return out


def parent_of(span: ReadableSpan, spans: list[ReadableSpan]) -> ReadableSpan:
    assert span.parent is not None, span.name
    return next(s for s in spans if s.context.span_id == span.parent.span_id)


def all_attribute_text(spans: list[ReadableSpan]) -> str:
    return " ".join(f"{k}={v}" for s in spans for k, v in (s.attributes or {}).items())


def test_rag_chat_is_one_trace_under_the_server_span(
    client: TestClient, exporter: InMemorySpanExporter, fake: FakeOpenAI
) -> None:
    exporter.clear()
    r = chat(client, index_name="kb", max_tokens=32)
    assert r.status_code == 200, r.text
    spans = one_trace(exporter)
    named = by_name(spans)
    (root,) = [s for s in spans if s.parent is None]
    assert root.name == "POST /v1/chat/completions" and root.kind == SpanKind.SERVER
    attrs = root.attributes or {}
    assert attrs["http.request.method"] == "POST" and attrs["http.route"] == "/v1/chat/completions"
    assert attrs["http.response.status_code"] == 200 and attrs["ragserve.rag_mode"] == "rag"
    assert r.headers["traceparent"].startswith(f"00-{root.context.trace_id:032x}-{root.context.span_id:016x}-")
    # each stage a child of the server span; the shards' searches children of retrieval.search
    for name in ("rag.plan", "embedding.query", "retrieval.search", "rag.fit", "rag.evidence", "llm.generate"):
        assert parent_of(named[name][0], spans) is root, name
    search = named["retrieval.search"][0]
    shards = named["shard.search_indexes"]
    assert sorted(s.attributes["ragserve.shard"] for s in shards) == [0, 1]
    assert all(parent_of(s, spans) is search for s in shards)
    assert parent_of(named["retrieval.fuse"][0], spans) is search
    sa = search.attributes or {}
    assert sa["ragserve.index"] == ("kb",) and sa["ragserve.retrieval_mode"] == "hybrid"
    assert sa["ragserve.nodes_returned"] >= 1 and 0 < sa["ragserve.top_score"] <= 1
    generate = named["llm.generate"][0]
    ga = generate.attributes or {}
    assert ga["gen_ai.operation.name"] == "chat" and ga["gen_ai.request.model"] == "fake-model"
    assert ga["gen_ai.usage.input_tokens"] > 0 and ga["gen_ai.usage.output_tokens"] > 0
    # the upstream call: a client span under llm.generate, its traceparent sent with the request
    (upstream,) = named["chat fake-model"]
    assert upstream.kind == SpanKind.CLIENT and parent_of(upstream, spans) is generate
    assert upstream.attributes["http.response.status_code"] == 200
    sent = fake.request_headers[-1]
    assert sent["traceparent"].startswith(f"00-{root.context.trace_id:032x}-{upstream.context.span_id:016x}-")
    # content capture is off: no query, prompt or document text anywhere
    text = all_attribute_text(spans)
    assert "KAITO" not in text and "operator" not in text and "ragserve.query" not in text


def test_client_traceparent_is_kept(client: TestClient, exporter: InMemorySpanExporter, fake: FakeOpenAI) -> None:
    exporter.clear()
    r = chat(client, {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"}, index_name="kb", max_tokens=32)
    assert r.status_code == 200, r.text
    spans = one_trace(exporter)
    (root,) = [s for s in spans if s.name == "POST /v1/chat/completions"]
    assert f"{root.context.trace_id:032x}" == CLIENT_TRACE
    assert root.parent is not None and f"{root.parent.span_id:016x}" == CLIENT_SPAN and root.parent.is_remote
    assert r.headers["traceparent"].startswith(f"00-{CLIENT_TRACE}-{root.context.span_id:016x}-")
    assert fake.request_headers[-1]["traceparent"].split("-")[1] == CLIENT_TRACE


def test_content_capture_puts_the_query_on_spans(
    client: TestClient, exporter: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tracing, "CONTENT", True)
    exporter.clear()
    assert chat(client, index_name="kb", max_tokens=32).status_code == 200
    named = by_name(one_trace(exporter))
    assert named["rag.plan"][0].attributes["ragserve.query"] == QUESTION
    assert named["embedding.query"][0].attributes["ragserve.query"] == QUESTION


def test_stream_span_ends_after_the_stream_with_time_to_first_token(
    client: TestClient, exporter: InMemorySpanExporter
) -> None:
    exporter.clear()
    with client.stream(
        "POST",
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": QUESTION}], "index_name": "kb", "stream": True},
    ) as r:
        assert r.status_code == 200
        trace_id = r.headers["traceparent"].split("-")[1]
        body = "".join(r.iter_text())
    assert body.rstrip().endswith("data: [DONE]")
    spans = one_trace(exporter)
    named = by_name(spans)
    (root,) = [s for s in spans if s.parent is None]
    assert f"{root.context.trace_id:032x}" == trace_id
    generate = named["llm.generate"][0]
    assert parent_of(generate, spans) is root and generate.attributes["ragserve.stream"] is True
    assert (
        0 < generate.attributes["gen_ai.server.time_to_first_token"] <= (generate.end_time - generate.start_time) / 1e9
    )
    assert generate.end_time <= root.end_time  # the server span ends with the body
    (upstream,) = named["chat fake-model"]
    assert parent_of(upstream, spans) is generate


def test_passthrough_names_its_reason(client: TestClient, exporter: InMemorySpanExporter) -> None:
    exporter.clear()
    r = chat(client, max_tokens=16)  # no index: passthrough
    assert r.status_code == 200 and r.headers["x-rag-mode"] == "passthrough"
    spans = one_trace(exporter)
    named = by_name(spans)
    (root,) = [s for s in spans if s.parent is None]
    assert root.attributes["ragserve.rag_mode"] == "passthrough"
    assert root.attributes["ragserve.passthrough_reason"] == r.headers["x-rag-reason"] == "no_index"
    assert named["rag.plan"][0].attributes["ragserve.passthrough_reason"] == "no_index"
    assert "retrieval.search" not in named and parent_of(named["llm.generate"][0], spans) is root


def test_index_traces_chunking_embedding_and_each_shard_write(
    client: TestClient, exporter: InMemorySpanExporter
) -> None:
    exporter.clear()
    docs = [{"text": f"Document {i} about topic {i}.", "doc_id": f"d{i}"} for i in range(6)]
    assert client.post("/index", json={"index_name": "more", "documents": docs}).status_code == 200
    spans = one_trace(exporter)
    named = by_name(spans)
    (root,) = [s for s in spans if s.parent is None]
    assert root.name == "POST /index"
    assert parent_of(named["ingest.chunk"][0], spans) is root
    assert named["ingest.chunk"][0].attributes["ragserve.documents"] == 6
    assert all(parent_of(s, spans) is root for s in named["embedding.documents"])
    writes = named["shard.upsert_documents"]
    assert {s.attributes["ragserve.shard"] for s in writes} == {0, 1}
    assert sum(s.attributes["ragserve.documents"] for s in writes) == 6
    assert "Document" not in all_attribute_text(spans)


def test_off_no_spans_no_header(tmp_path, embedder, fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch) -> None:
    for k in tracing.ENDPOINT_ENVS:
        monkeypatch.delenv(k, raising=False)
    tracing.shutdown()
    exporter = InMemorySpanExporter()
    with serve(tmp_path, embedder, fake) as (app, _), TestClient(app) as c:
        assert not tracing.ENABLED
        assert c.post("/index", json={"index_name": "kb", "documents": DOCS}).status_code == 200
        r = chat(c, {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"}, index_name="kb", max_tokens=32)
        assert r.status_code == 200 and "traceparent" not in r.headers
        assert "traceparent" not in fake.request_headers[-1]  # nothing forwarded either
    assert exporter.get_finished_spans() == ()


def test_query_route_traces_retrieval_and_generation(client: TestClient, exporter: InMemorySpanExporter) -> None:
    exporter.clear()
    r = client.post("/query", json={"index_name": "kb", "query": QUESTION, "llm_params": {"max_tokens": 16}})
    assert r.status_code == 200, r.text
    spans = one_trace(exporter)
    named = by_name(spans)
    (root,) = [s for s in spans if s.parent is None]
    assert root.name == "POST /query"
    assert parent_of(named["retrieval.search"][0], spans) is root
    generate = named["llm.generate"][0]
    assert parent_of(generate, spans) is root and generate.attributes["gen_ai.usage.output_tokens"] > 0


def test_an_upstream_failure_marks_the_spans_and_the_server_span_errs(
    client: TestClient, exporter: InMemorySpanExporter, fake: FakeOpenAI
) -> None:
    exporter.clear()
    fake.fail_next(500)
    r = chat(client, index_name="kb", max_tokens=16)
    assert r.status_code >= 500
    named = by_name(one_trace(exporter))
    (root,) = named["POST /v1/chat/completions"]
    assert root.attributes["http.response.status_code"] == r.status_code and not root.status.is_ok
    assert not named["llm.generate"][0].status.is_ok and not named["chat fake-model"][0].status.is_ok
    assert named["chat fake-model"][0].attributes["http.response.status_code"] == 500


class BrokenExporter(InMemorySpanExporter):
    def export(self, spans: Any) -> Any:
        raise RuntimeError("the collector is down")


def test_a_failing_exporter_never_fails_a_request(tmp_path, embedder, fake: FakeOpenAI) -> None:
    tracing.configure("inprocess", BrokenExporter())
    try:
        with serve(tmp_path, embedder, fake) as (app, _), TestClient(app) as c:
            assert c.post("/index", json={"index_name": "kb", "documents": DOCS}).status_code == 200
            r = chat(c, index_name="kb", max_tokens=16)
            assert r.status_code == 200 and r.headers["traceparent"]
    finally:
        tracing.shutdown()
