"""The HTTP layer in-process: real shards, real chunker and embedder, the real OpenAI engine adapter
talking to a fake OpenAI-compatible upstream (the one edge we cannot run here)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ragserve.testing.fake_openai import FakeOpenAI
from ragserve.testing.inprocess import RecordingTelemetry, inprocess_app

WINDOW = 4096
DOCS = [
    {
        "text": "KAITO is a Kubernetes operator that automates AI model inference and fine-tuning on GPU nodes.",
        "metadata": {"topic": "kaito"},
    },
    {
        "text": "FAISS is a library for efficient similarity search and clustering of dense vectors.",
        "metadata": {"topic": "faiss"},
    },
]


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(answer="The answer is in the sources [1].", model="fake-model", max_model_len=WINDOW) as f:
        yield f


@pytest.fixture
def env(tmp_path, embedder, fake: FakeOpenAI) -> Iterator[tuple[TestClient, FakeOpenAI, RecordingTelemetry]]:
    tel = RecordingTelemetry()
    with inprocess_app(tmp_path, embedder, fake.url, telemetry=tel, llm_timeout_s=10.0) as (app, _):
        fake.requests.clear()
        with TestClient(app) as client:
            assert client.post("/index", json={"index_name": "kb", "documents": DOCS}).status_code == 200
            yield client, fake, tel


def chat(client: TestClient, **body: Any):
    body.setdefault("messages", [{"role": "user", "content": "What does the KAITO operator automate?"}])
    return client.post("/v1/chat/completions", json=body)


def test_rag_answer_forwards_context_and_returns_sources(env) -> None:
    client, fake, tel = env
    r = chat(client, index_name="kb", max_tokens=32)
    assert r.status_code == 200, r.text
    assert r.headers["x-rag-mode"] == "rag" and "x-rag-reason" not in r.headers
    body = r.json()
    assert body["choices"][0]["message"]["content"] == "The answer is in the sources [1]."
    assert body["source_nodes"][0]["metadata"]["topic"] == "kaito"
    sent = fake.requests[-1]
    assert sent["messages"][0]["role"] == "system" and "[1]" in sent["messages"][0]["content"]
    assert "KAITO is a Kubernetes operator" in sent["messages"][0]["content"]
    assert sent["messages"][-1] == {"role": "user", "content": "What does the KAITO operator automate?"}
    assert sent["max_tokens"] == 32
    assert not {"index_name", "top_k", "context_token_ratio"} & sent.keys()
    assert ("/v1/chat/completions", 200, "rag", "") in tel.requests
    assert {"embed", "search", "generate"} <= tel.latencies.keys()
    assert tel.tokens and tel.tokens[-1][0] > 0


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        ({}, "no_index"),
        ({"index_name": "kb", "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools"),
        (
            {
                "index_name": "kb",
                "messages": [
                    {"role": "tool", "content": "75F", "tool_call_id": "c1"},
                    {"role": "user", "content": "thanks"},
                ],
            },
            "unsupported_role",
        ),
        (
            {
                "index_name": "kb",
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "what is this"},
                            {"type": "image_url", "image_url": {"url": "http://x/y.png"}},
                        ],
                    }
                ],
            },
            "non_text_content",
        ),
        # nothing relevant (the default question matches a document word for word, so it is relevant
        # whatever the threshold, and max_tokens=100_000 leaves it no room: a 400 context_budget)
        (
            {
                "index_name": "kb",
                "similarity_threshold": 0.99,
                "messages": [{"role": "user", "content": "How do penguins keep warm?"}],
            },
            "no_context",
        ),
    ],
)
def test_passthrough_forwards_body_without_rag_fields_and_with_clamped_max_tokens(env, extra, reason) -> None:
    client, fake, _ = env
    r = chat(client, max_tokens=100_000, top_k=3, context_token_ratio=0.5, logit_bias={"1": 2}, **extra)
    assert r.status_code == 200, r.text
    assert r.headers["x-rag-mode"] == "passthrough" and r.headers["x-rag-reason"] == reason
    sent = fake.requests[-1]
    assert not {"index_name", "top_k", "context_token_ratio", "similarity_threshold"} & sent.keys()
    assert 0 < sent["max_tokens"] < WINDOW  # clamped to what the window leaves
    assert sent["logit_bias"] == {"1": 2}  # unknown fields are forwarded
    if "tools" in extra:
        assert sent["tools"] == extra["tools"]
    assert "source_nodes" not in r.json()


def test_streaming_rag_sends_sources_first_and_done_last(env) -> None:
    client, _, _ = env
    with client.stream(
        "POST",
        "/v1/chat/completions",
        json={
            "index_name": "kb",
            "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "What is the FAISS library for similarity search?"}],
        },
    ) as r:
        assert r.status_code == 200 and r.headers["x-rag-mode"] == "rag"
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    events = [json.loads(line[6:]) for line in lines[:-1]]
    assert events[0]["source_nodes"][0]["metadata"]["topic"] == "faiss"
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices"))
    assert text == "The answer is in the sources [1]."
    assert any(e.get("usage") for e in events)


def test_streaming_passthrough_relays_upstream_chunks(env) -> None:
    client, fake, _ = env
    with client.stream(
        "POST", "/v1/chat/completions", json={"stream": True, "messages": [{"role": "user", "content": "hi"}]}
    ) as r:
        assert r.headers["x-rag-reason"] == "no_index"
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    events = [json.loads(line[6:]) for line in lines[:-1]]
    assert (
        "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
        == "The answer is in the sources [1]."
    )
    assert fake.requests[-1]["stream"] is True


def test_openai_error_shapes(env) -> None:
    client, _, _ = env
    r = chat(client, index_name="missing")
    assert r.status_code == 404
    assert r.json()["error"]["message"] == "No such index: 'missing' exists."
    r = chat(
        client, index_name="kb", messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    )
    assert r.status_code == 400
    assert r.json()["error"]["message"] == "There must be a user prompt since the latest assistant message."
    r = client.post("/v1/chat/completions", json={"model": "x"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    r = client.post("/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "error" in r.json()


def test_prompt_too_long_is_400(env) -> None:
    client, _, _ = env
    r = chat(client, messages=[{"role": "user", "content": "word " * (WINDOW * 2)}])
    assert r.status_code == 400
    assert r.json()["error"]["message"].startswith("Prompt length exceeds context window")


def test_upstream_errors_keep_status_and_message(env) -> None:
    client, fake, tel = env
    fake.fail_next(status=503, message="model is loading")
    r = chat(client)
    assert r.status_code == 503 and "model is loading" in r.json()["error"]["message"]
    assert tel.upstream


def test_stream_cut_mid_way_ends_with_error_event(env) -> None:
    client, fake, _ = env
    fake.cut_stream_next(after_chunks=2)
    with client.stream(
        "POST", "/v1/chat/completions", json={"stream": True, "messages": [{"role": "user", "content": "hi"}]}
    ) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    assert "error" in json.loads(lines[-2][6:])


def test_document_api_errors(env) -> None:
    client, _, _ = env
    r = client.get("/indexes/bad%20name/documents")
    assert r.status_code == 400 and "index names are" in r.json()["detail"]
    r = client.post("/index", json={"index_name": "kb", "documents": []})
    assert r.status_code == 422
    r = client.post(
        "/index",
        json={
            "index_name": "kb",
            "documents": [{"text": "def f(): pass", "metadata": {"split_type": "code", "language": "cobol"}}],
        },
    )
    assert r.status_code == 400 and "cobol" in r.json()["detail"]
    assert client.delete("/indexes/none").status_code == 404
    assert client.get("/indexes/kb/documents", params={"limit": 101}).status_code == 400
    assert client.post("/load/kb", params={"path": "../../etc"}).status_code == 400


def test_conditional_updates_and_deletes_over_http(env) -> None:
    """``if_hash_value`` on an update and ``if_hash_values`` on a delete: a document whose hash is
    another by then is left and listed as conflicting; a condition on an id not asked is a 422."""
    client, _, _ = env
    docs = [{"doc_id": "x1", "text": "Pump 1 is blue."}, {"doc_id": "x2", "text": "Pump 2 is red."}]
    read = {
        d["doc_id"]: d["hash_value"]
        for d in client.post("/index", json={"index_name": "cas", "documents": docs}).json()
    }
    r = client.post(
        "/indexes/cas/documents",
        json={
            "documents": [
                {"doc_id": "x1", "text": "Pump 1 is green.", "if_hash_value": read["x1"]},
                {"doc_id": "x2", "text": "Pump 2 is green.", "if_hash_value": read["x1"]},
            ]
        },
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert [d["doc_id"] for d in body["updated_documents"]] == ["x1"]
    assert [(d["doc_id"], d["text"]) for d in body["conflicting_documents"]] == [("x2", "Pump 2 is red.")]
    r = client.post("/indexes/cas/documents/delete", json={"doc_ids": ["x1", "x2"], "if_hash_values": read})
    assert r.json() == {"deleted_doc_ids": ["x2"], "not_found_doc_ids": [], "conflicting_doc_ids": ["x1"]}
    r = client.post("/indexes/cas/documents/delete", json={"doc_ids": ["x1"], "if_hash_values": {"x9": "h"}})
    assert r.status_code == 422 and "if_hash_values names 'x9'" in r.text, r.text
    r = client.post("/indexes/cas/documents/delete", json={"doc_ids": ["x1"], "if_hash_values": {"x1": ""}})
    assert r.status_code == 422, r.text  # an empty hash is no hash: a mistake, not a condition never met
    assert set(client.get("/ui/config").json()["features"]) == {"if_exists", "if_hash_value"}  # for the CLI
    assert client.get("/indexes/cas/documents/x1").json()["text"] == "Pump 1 is green."
    # without conditions, KAITO's shapes: no conflicting lists, the echo of a missing document as sent
    r = client.post("/indexes/cas/documents", json={"documents": [{"doc_id": "gone", "text": "t", "metadata": {}}]})
    assert r.json() == {
        "updated_documents": [],
        "unchanged_documents": [],
        "not_found_documents": [{"doc_id": "gone", "text": "t", "metadata": {}}],
    }
    r = client.post("/indexes/cas/documents/delete", json={"doc_ids": ["x1", "gone"]})
    assert r.json() == {"deleted_doc_ids": ["x1"], "not_found_doc_ids": ["gone"]}


def test_models_embeddings_retrieve(env) -> None:
    client, _, _ = env
    m = client.get("/v1/models").json()
    assert m["data"][0] == {**m["data"][0], "id": "fake-model", "max_model_len": WINDOW}
    e = client.post("/v1/embeddings", json={"input": "hello", "encoding_format": "base64"}).json()
    assert isinstance(e["data"][0]["embedding"], str)
    assert client.post("/v1/embeddings", json={"input": []}).status_code == 400
    resp = client.post(
        "/retrieve",
        json={"index_name": "kb", "query": "vector similarity search", "top_k": 1, "similarity_threshold": 0.2},
    )
    assert "embed;dur=" in resp.headers["server-timing"] and "search;dur=" in resp.headers["server-timing"]
    r = resp.json()
    assert r["count"] == 1 and r["results"][0]["metadata"]["topic"] == "faiss"
    assert client.get("/health").json()["status"] == "ok"
