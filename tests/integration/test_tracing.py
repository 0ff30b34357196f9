"""Traces across processes on Ray Serve (docs/architecture.md §7, "Traces"): a Ray of its own whose
processes export to an OTLP/HTTP receiver run by the test (``ragserve.testing.otlp``), the remote-LLM
application with a Generator replica in the path (``llm_in_ingress: false``) in front of the fake
upstream. One RAG chat sent with a client ``traceparent`` is one trace, the client's, whose spans
come from the ingress, the shard actors and the generator, each parented in the trace."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator

import httpx
import pytest

from ragserve.testing.fake_openai import FakeOpenAI
from ragserve.testing.otlp import OTLPReceiver, ReceivedSpan, render_tree
from tests.integration.conftest import deploy, free_port

pytestmark = pytest.mark.slow

DOCS = [
    {"text": "The warranty covers parts and labour for two years from the date of purchase."},
    {"text": "Returns are accepted within thirty days with the original receipt."},
    {"text": "Shipping is free for orders above fifty euros within the European Union."},
]
QUESTION = "How long does the warranty cover parts and labour?"


@pytest.fixture(scope="module")
def receiver() -> Iterator[OTLPReceiver]:
    with OTLPReceiver() as r:
        yield r


@pytest.fixture(scope="module")
def traced_cluster(receiver: OTLPReceiver) -> Iterator[int]:
    """Ray started with the OTLP variables set, so every process it starts (replicas, shard
    actors) inherits them; the driver's environment is restored afterwards."""
    import ray
    from ray import serve

    from ragserve.deployments.platform import init_local_ray

    otel = {
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "200",  # ms: batches flush fast
        "OTEL_SERVICE_NAME": "ragserve-test",
    }
    saved = dict(os.environ)
    os.environ.update(otel)
    try:
        port = free_port()
        init_local_ray(num_cpus=4, env_vars=otel)
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        yield port
        serve.shutdown()
        ray.shutdown()
    finally:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(answer="Two years [1].", model="upstream-model", max_model_len=2048) as fake:
        yield fake


@pytest.fixture(scope="module")
def client(traced_cluster: int, upstream: FakeOpenAI, tmp_path_factory: pytest.TempPathFactory):
    storage = tmp_path_factory.mktemp("traced-storage")
    base = deploy(
        {
            "storage_dir": str(storage),
            "num_shards": 2,
            "llm_engine": "openai",
            "llm_url": upstream.url,
            "llm_in_ingress": False,  # a Generator replica between the ingress and the upstream
            "shard_num_cpus": 0.1,
        },
        "traced",
        traced_cluster,
    )
    with httpx.Client(base_url=base, timeout=60) as c:
        yield c


def client_traceparent() -> tuple[str, str, str]:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, f"00-{trace_id}-{span_id}-01"


def processes(spans: list[ReceivedSpan]) -> set[str]:
    return {s.process for s in spans}


def check_parented(spans: list[ReceivedSpan], root_parent: str) -> ReceivedSpan:
    """Every span's parent is in the trace, but the server span's, which is the client's; returns it."""
    ids = {s.span_id for s in spans}
    orphans = [s for s in spans if s.parent_id not in ids]
    assert len(orphans) == 1, render_tree(spans)
    (root,) = orphans
    assert root.parent_id == root_parent and root.process == "ingress" and root.kind == 2  # SERVER
    return root


def spans_named(spans: list[ReceivedSpan], name: str) -> list[ReceivedSpan]:
    return [s for s in spans if s.name == name]


def by_id(spans: list[ReceivedSpan]) -> dict[str, ReceivedSpan]:
    return {s.span_id: s for s in spans}


def test_ingestion_traces_chunking_embedding_and_shard_writes(client: httpx.Client, receiver: OTLPReceiver) -> None:
    trace_id, span_id, header = client_traceparent()
    r = client.post("/index", json={"index_name": "kb", "documents": DOCS}, headers={"traceparent": header})
    assert r.status_code == 200, r.text
    assert r.headers["traceparent"].split("-")[1] == trace_id

    def complete(spans: list[ReceivedSpan]) -> bool:  # each process exports on its own schedule: wait for all three
        return (
            any(s.name == "POST /index" for s in spans)
            and len(spans_named(spans, "shard.upsert_documents")) >= 2
            and bool(spans_named(spans, "embedder.embed_documents"))
        )

    spans = receiver.wait_for(trace_id, complete)
    root = check_parented(spans, span_id)
    assert root.name == "POST /index", render_tree(spans)
    ids = by_id(spans)
    writes = spans_named(spans, "shard.upsert_documents")
    assert {w.process for w in writes} == {"shard"} and {w.attributes["ragserve.shard"] for w in writes} == {0, 1}
    assert sum(w.attributes["ragserve.documents"] for w in writes) == len(DOCS)
    assert all(ids[w.parent_id].process == "ingress" for w in writes)
    assert spans_named(spans, "ingest.chunk")[0].parent_id == root.span_id
    batches = spans_named(spans, "embedder.embed_documents")
    assert batches and {b.process for b in batches} == {"embedder"}
    assert all(ids[b.parent_id].name == "embedding.documents" for b in batches)
    print("\n" + render_tree(spans))


def test_rag_chat_is_one_trace_across_ingress_shards_and_generator(
    client: httpx.Client, receiver: OTLPReceiver, upstream: FakeOpenAI
) -> None:
    upstream.reset()
    trace_id, span_id, header = client_traceparent()
    r = client.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": QUESTION}], "index_name": "kb", "max_tokens": 32},
        headers={"traceparent": header},
    )
    assert r.status_code == 200, r.text
    assert r.headers["x-rag-mode"] == "rag"
    assert r.headers["traceparent"].split("-")[1] == trace_id  # the client's trace, said back

    def complete(spans: list[ReceivedSpan]) -> bool:
        names = {s.name for s in spans}
        return {"POST /v1/chat/completions", "generator.chat", "chat upstream-model"} <= names and len(
            spans_named(spans, "shard.search_indexes")
        ) >= 2

    spans = receiver.wait_for(trace_id, complete)
    print("\n" + render_tree(spans))
    assert {s.trace_id for s in spans} == {trace_id}
    assert {"ingress", "shard", "generator"} <= processes(spans), render_tree(spans)
    root = check_parented(spans, span_id)
    assert root.name == "POST /v1/chat/completions" and root.attributes["http.response.status_code"] == 200
    assert root.attributes["ragserve.rag_mode"] == "rag"
    ids = by_id(spans)
    (search,) = spans_named(spans, "retrieval.search")
    assert search.process == "ingress" and search.attributes["ragserve.index"] == ("kb",)
    shards = spans_named(spans, "shard.search_indexes")
    assert {s.process for s in shards} == {"shard"} and {s.attributes["ragserve.shard"] for s in shards} == {0, 1}
    assert all(s.parent_id == search.span_id for s in shards)
    assert len({s.resource["process.pid"] for s in shards}) == 2  # two actors, two processes
    (generate,) = spans_named(spans, "llm.generate")
    assert generate.process == "ingress" and generate.parent_id == root.span_id
    assert generate.attributes["gen_ai.usage.output_tokens"] > 0
    (replica,) = spans_named(spans, "generator.chat")
    assert replica.process == "generator" and replica.parent_id == generate.span_id
    (upstream_call,) = spans_named(spans, "chat upstream-model")
    assert upstream_call.process == "generator" and ids[upstream_call.parent_id] is replica
    assert upstream_call.kind == 3  # CLIENT
    # the upstream was sent the trace, as the child of the client span
    sent = upstream.request_headers[-1]["traceparent"]
    assert sent.split("-")[1] == trace_id and sent.split("-")[2] == upstream_call.span_id
    # content capture is off: neither the question nor a document's text in any attribute
    text = " ".join(f"{v}" for s in spans for v in s.attributes.values())
    assert "warranty" not in text.lower() and "ragserve.query" not in {k for s in spans for k in s.attributes}
    assert all(s.resource["service.name"] == "ragserve-test" for s in spans)


def test_streamed_chat_traces_the_generator_stream(
    client: httpx.Client, receiver: OTLPReceiver, upstream: FakeOpenAI
) -> None:
    upstream.reset()
    trace_id, span_id, header = client_traceparent()
    body = {"messages": [{"role": "user", "content": QUESTION}], "index_name": "kb", "max_tokens": 32, "stream": True}
    body["cache"] = False  # generated again: the answer cache would serve the previous test's answer
    with client.stream("POST", "/v1/chat/completions", json=body, headers={"traceparent": header}) as r:
        assert r.status_code == 200
        assert r.headers["traceparent"].split("-")[1] == trace_id
        text = "".join(r.iter_text())
    assert text.rstrip().endswith("data: [DONE]")

    def complete(spans: list[ReceivedSpan]) -> bool:
        return {"POST /v1/chat/completions", "generator.chat_stream", "chat upstream-model"} <= {s.name for s in spans}

    spans = receiver.wait_for(trace_id, complete)
    root = check_parented(spans, span_id)
    ids = by_id(spans)
    (generate,) = spans_named(spans, "llm.generate")
    assert generate.parent_id == root.span_id and generate.attributes["ragserve.stream"] is True
    assert 0 < generate.attributes["gen_ai.server.time_to_first_token"] <= generate.duration_ms / 1000
    (replica,) = spans_named(spans, "generator.chat_stream")
    assert replica.process == "generator" and replica.parent_id == generate.span_id
    (upstream_call,) = spans_named(spans, "chat upstream-model")
    assert ids[upstream_call.parent_id] is replica and upstream_call.end_ns <= replica.end_ns
    assert upstream.request_headers[-1]["traceparent"].split("-")[2] == upstream_call.span_id


def test_calls_of_the_ingestion_deployment_join_the_trace(client: httpx.Client, receiver: OTLPReceiver) -> None:
    trace_id, span_id, header = client_traceparent()
    r = client.get("/v1/vector_stores", headers={"traceparent": header})
    assert r.status_code == 200, r.text

    def complete(spans: list[ReceivedSpan]) -> bool:
        return any(s.process == "ingestion" for s in spans) and any(s.name == "GET /v1/vector_stores" for s in spans)

    spans = receiver.wait_for(trace_id, complete)
    root = check_parented(spans, span_id)
    (call,) = [s for s in spans if s.process == "ingestion"]
    assert call.name.startswith("ingestion.vector_stores.") and call.parent_id == root.span_id
