"""Evidence and the "not covered" answer over HTTP (issue 23): the headers say what happened
(``X-RAG-Mode: rag``, ``X-RAG-Reason: not_covered``), the body and the stream carry ``rag.evidence``
and ``rag.answerable``, and a question the documents do not cover never reaches the upstream."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ragserve.rag.answerable import NOT_COVERED_ANSWER
from ragserve.testing.fake_openai import FakeOpenAI
from ragserve.testing.inprocess import inprocess_app

DOCS = [
    {
        "doc_id": "pump",
        "text": "The Zephyr X200 is a submersible pump for garden ponds. The maximum flow rate of the Zephyr X200 "
        "is 3,200 litres per hour. The warranty covers manufacturing defects for five years.",
        "metadata": {"title": "Zephyr X200 manual"},
    },
    {
        "doc_id": "light",
        "text": "The Lumen L5 is an underwater light for ponds. The light draws 6 watts and is rated IP68.",
        "metadata": {"title": "Lumen L5 sheet"},
    },
]


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(answer="It moves 3,200 litres per hour [1].", model="fake-model", max_model_len=4096) as f:
        yield f


@pytest.fixture
def client(tmp_path, embedder, fake: FakeOpenAI) -> Iterator[TestClient]:
    with inprocess_app(tmp_path, embedder, fake.url, similarity_threshold=0.3) as (app, _), TestClient(app) as c:
        assert c.post("/index", json={"index_name": "kb", "documents": DOCS}).status_code == 200
        yield c


def chat(client: TestClient, question: str, **body: Any):
    return client.post(
        "/v1/chat/completions",
        json={"index_name": "kb", "messages": [{"role": "user", "content": question}], **body},
    )


def events(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


@pytest.mark.parametrize("stream", [False, True])
def test_not_covered_is_a_rag_answer_with_its_reason_and_no_upstream_call(
    client: TestClient, fake: FakeOpenAI, stream: bool
) -> None:
    before = len(fake.requests)
    r = chat(client, "How do I connect the Zephyr X200 to a solar panel?", stream=stream)
    assert r.status_code == 200, r.text
    assert (r.headers["x-rag-mode"], r.headers["x-rag-reason"]) == ("rag", "not_covered")
    assert len(fake.requests) == before  # the model was not asked
    if stream:
        got = events(r.text)
        text = "".join(c["delta"].get("content") or "" for e in got for c in e.get("choices", []))
        rag, sources = got[0]["rag"], got[0]["source_nodes"]
        assert got[-1]["rag"]["answerable"] is False and got[-1]["choices"][0]["finish_reason"] == "stop"
    else:
        body = r.json()
        text, rag, sources = body["choices"][0]["message"]["content"], body["rag"], body["source_nodes"]
    assert text.startswith(NOT_COVERED_ANSWER) and "Zephyr X200 manual" in text
    assert rag["answerable"] is False and rag["evidence"] == []
    assert sources[0]["doc_id"] == "pump"


@pytest.mark.parametrize("stream", [False, True])
def test_an_answer_carries_its_evidence(client: TestClient, fake: FakeOpenAI, stream: bool) -> None:
    r = chat(client, "What is the maximum flow rate of the Zephyr X200?", stream=stream)
    assert r.status_code == 200, r.text
    assert r.headers["x-rag-mode"] == "rag" and "x-rag-reason" not in r.headers
    assert "evidence;dur=" in r.headers.get("server-timing", "") or stream
    if stream:
        got = events(r.text)
        first, final = got[0], next(e for e in got if e.get("choices") and e["choices"][0].get("finish_reason"))
        assert final["rag"] == first["rag"]
        rag, sources = first["rag"], first["source_nodes"]
    else:
        body = r.json()
        rag, sources = body["rag"], body["source_nodes"]
    assert rag["answerable"] is True
    best = rag["evidence"][0]
    assert "3,200 litres per hour" in best["text"]
    assert sources[best["source"] - 1]["text"][best["start"] : best["end"]] == best["text"]


def test_query_carries_evidence_and_answerable(client: TestClient, fake: FakeOpenAI) -> None:
    body = client.post("/query", json={"index_name": "kb", "query": "How much power does the Lumen L5 draw?"}).json()
    assert body["answerable"] is True and "6 watts" in body["evidence"][0]["text"]
    before = len(fake.requests)
    refused = client.post("/query", json={"index_name": "kb", "query": "Can I use the Zephyr X200 in a swimming pool?"})
    assert refused.status_code == 200 and len(fake.requests) == before
    assert refused.json()["answerable"] is False and refused.json()["response"].startswith(NOT_COVERED_ANSWER)
