"""The answer cache over HTTP, in-process (real shards, chunker and MiniLM; a fake upstream):
``X-RAG-Cache`` hit, miss and bypass, ``cache: false``, ``Cache-Control``, the temperature rule, a
streamed hit shaped like a RAG stream with the whole answer's text, fresh ids, zero usage and
what metering counts, the ``cache`` stage of ``Server-Timing``, the bounds set by the settings,
and the telemetry counters."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ragserve.testing.fake_openai import FakeOpenAI
from ragserve.testing.inprocess import RecordingTelemetry, inprocess_app

DOCS = [
    {"doc_id": "kaito", "text": "KAITO is a Kubernetes operator that automates AI model inference and fine-tuning."},
    {"doc_id": "faiss", "text": "FAISS is a library for efficient similarity search and clustering of dense vectors."},
]
QUESTION = "What does the KAITO operator automate?"
OTHER = "What is FAISS a library for?"
ANSWER = "It automates inference and fine-tuning [1]."
KEY = "sk-answer-cache-0123456789"


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(answer=ANSWER, model="fake-model", max_model_len=4096) as f:
        yield f


def serve(tmp_path, embedder, fake: FakeOpenAI, **settings: Any) -> Iterator[tuple[TestClient, RecordingTelemetry]]:
    tel = RecordingTelemetry()
    with (
        inprocess_app(
            tmp_path,
            embedder,
            fake.url,
            telemetry=tel,
            api_keys=[{"key": KEY, "name": "team", "role": "admin"}],
            **settings,
        ) as (app, _),
        TestClient(app, headers={"Authorization": f"Bearer {KEY}"}) as client,
    ):
        assert client.post("/index", json={"index_name": "kb", "documents": DOCS}).status_code == 200
        deadline = time.monotonic() + 5  # what the /index used, once recorded (after its response)
        while ("team", "kb", "requests") not in tel.usage_counts and time.monotonic() < deadline:
            time.sleep(0.02)
        fake.requests.clear()
        yield client, tel


@pytest.fixture
def env(tmp_path, embedder, fake) -> Iterator[tuple[TestClient, RecordingTelemetry]]:
    yield from serve(tmp_path, embedder, fake)


def ask(client: TestClient, question: str = QUESTION, headers: dict[str, str] | None = None, **body: Any):
    body = {"index_name": "kb", "messages": [{"role": "user", "content": question}], "max_tokens": 32, **body}
    response = client.post("/v1/chat/completions", json=body, headers=headers or {})
    assert response.status_code == 200, response.text
    return response


def events(client: TestClient, **body: Any) -> tuple[dict[str, str], list[dict[str, Any]]]:
    body = {"index_name": "kb", "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 32, **body}
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
        headers = dict(r.headers)
    assert lines[-1] == "data: [DONE]"
    return headers, [json.loads(line[6:]) for line in lines[:-1]]


def test_a_repeated_question_is_a_hit_with_fresh_ids_and_no_model_call(env, fake: FakeOpenAI) -> None:
    client, tel = env
    first = ask(client)
    assert first.headers["x-rag-cache"] == "miss" and first.headers["x-rag-mode"] == "rag"
    assert first.headers["server-timing"].startswith("cache;dur=")
    second = ask(client, "  What does the KAITO operator   automate?\n")  # whitespace is not the question
    assert second.headers["x-rag-cache"] == "hit" and second.headers["x-rag-mode"] == "rag"
    assert len(fake.requests) == 1
    a, b = first.json(), second.json()
    assert b["choices"] == a["choices"] and b["source_nodes"] == a["source_nodes"] and b["rag"] == a["rag"]
    assert b["citations"] == a["citations"] and b["model"] == a["model"]
    assert b["id"] != a["id"] and b["id"].startswith("chatcmpl-") and b["created"] >= a["created"]
    assert a["usage"]["total_tokens"] > 0 and b["usage"] == {
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "total_tokens": 0,
    }
    assert [k for k in second.headers["server-timing"].split(", ")] == [second.headers["server-timing"]]  # one stage
    assert second.headers["x-rag-query"] == first.headers["x-rag-query"]
    assert ask(client, QUESTION.lower()).headers["x-rag-cache"] == "miss"  # case may change the answer
    assert tel.answer_cache_events == {"miss": 2, "hit": 1}
    assert len(tel.tokens) == 2  # context tokens are reported for the computed answers only


def test_a_streamed_hit_is_shaped_like_a_rag_stream_with_the_whole_answers_text(env, fake: FakeOpenAI) -> None:
    client, _ = env
    whole = ask(client).json()
    headers, chunks = events(client, stream_options={"include_usage": True})
    assert headers["x-rag-cache"] == "hit" and len(fake.requests) == 1
    first, *middle, last, usage = chunks
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert first["source_nodes"] == whole["source_nodes"] and first["rag"] == whole["rag"]
    assert "".join(c["choices"][0]["delta"]["content"] for c in middle) == whole["choices"][0]["message"]["content"]
    assert last["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    assert last["citations"] == whole["citations"] and last["rag"] == whole["rag"]
    assert usage["choices"] == [] and usage["usage"]["total_tokens"] == 0
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"] != whole["id"]


def test_a_streamed_miss_is_kept_once_it_ended_and_serves_a_whole_hit(env, fake: FakeOpenAI) -> None:
    client, _ = env
    headers, chunks = events(client)
    assert headers["x-rag-cache"] == "miss"
    streamed = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))
    hit = ask(client)
    assert hit.headers["x-rag-cache"] == "hit" and len(fake.requests) == 1
    assert hit.json()["choices"][0]["message"]["content"] == streamed == ANSWER


def test_opting_out(env, fake: FakeOpenAI) -> None:
    client, tel = env
    ask(client)
    assert ask(client, cache=False).headers["x-rag-cache"] == "bypass"  # neither read
    assert len(fake.requests) == 2
    assert "cache" not in fake.requests[-1]  # a RAG field: never sent upstream
    assert ask(client, headers={"Cache-Control": "no-store"}).headers["x-rag-cache"] == "bypass"
    assert ask(client, headers={"Cache-Control": "no-cache"}).headers["x-rag-cache"] == "miss"  # computed, kept
    assert len(fake.requests) == 4
    assert ask(client).headers["x-rag-cache"] == "hit"
    # never kept: a new question asked with cache false or no-store is computed again next time
    ask(client, OTHER, cache=False)
    ask(client, OTHER, headers={"Cache-Control": "no-store"})
    assert ask(client, OTHER).headers["x-rag-cache"] == "miss"
    assert tel.answer_cache_events["bypass"] == 4


def test_sampled_requests_bypass_unless_they_ask(env, fake: FakeOpenAI) -> None:
    client, _ = env
    assert ask(client, temperature=0.8).headers["x-rag-cache"] == "bypass"
    assert ask(client, temperature=0.8).headers["x-rag-cache"] == "bypass"
    assert ask(client, temperature=0.8, cache=True).headers["x-rag-cache"] == "miss"
    assert ask(client, temperature=0.8, cache=True).headers["x-rag-cache"] == "hit"
    assert ask(client, temperature=0.0).headers["x-rag-cache"] == "miss"  # another temperature, another key
    assert len(fake.requests) == 4


def test_passthroughs_are_not_cached(env, fake: FakeOpenAI) -> None:
    client, _ = env
    for _ in range(2):
        r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
        assert r.headers["x-rag-mode"] == "passthrough" and "x-rag-cache" not in r.headers
    for _ in range(2):  # nothing relevant: passed through (no_context), never kept
        r = ask(client, "How do penguins keep warm in winter?", similarity_threshold=0.99)
        assert r.headers["x-rag-reason"] == "no_context" and "x-rag-cache" not in r.headers
    assert len(fake.requests) == 4


def usage(tel: RecordingTelemetry) -> dict[str, int]:
    return {m: v for (k, i, m), v in tel.usage_counts.items() if (k, i) == ("team", "kb")}


def metered(tel: RecordingTelemetry, since: dict[str, int], requests: int) -> dict[str, int]:
    """What the key used on ``kb`` since ``since``, once ``requests`` more were recorded (usage is
    recorded after each response)."""
    deadline = time.monotonic() + 5
    while usage(tel).get("requests", 0) < since.get("requests", 0) + requests and time.monotonic() < deadline:
        time.sleep(0.02)
    return {k: v - since.get(k, 0) for k, v in usage(tel).items()}


def test_a_hit_meters_the_request_but_no_tokens(env) -> None:
    """No model token and no embedding was spent on a hit: it counts as a request, with no tokens."""
    client, tel = env
    start = usage(tel)
    ask(client)
    miss = metered(tel, start, 1)
    assert miss["requests"] == 1 and miss["completion_tokens"] == len(ANSWER.split()) and miss["embedding_tokens"] > 0
    ask(client)
    assert metered(tel, start, 2) == {**miss, "requests": 2}
    with client.stream(
        "POST",
        "/v1/chat/completions",
        json={
            "index_name": "kb",
            "messages": [{"role": "user", "content": QUESTION}],
            "max_tokens": 32,
            "stream": True,
        },
    ) as r:
        assert r.headers["x-rag-cache"] == "hit" and r.read()
    assert metered(tel, start, 3) == {**miss, "requests": 3}


def test_the_bounds_come_from_the_settings(tmp_path, embedder, fake: FakeOpenAI) -> None:
    for client, tel in serve(tmp_path, embedder, fake, answer_cache_max_entries=1):
        ask(client, "What does the KAITO operator automate?")
        ask(client, OTHER)  # evicts the first
        assert ask(client, "What does the KAITO operator automate?").headers["x-rag-cache"] == "miss"
        assert tel.answer_cache_events.get("eviction", 0) >= 1


def test_the_cache_can_be_turned_off(tmp_path, embedder, fake: FakeOpenAI) -> None:
    for client, tel in serve(tmp_path, embedder, fake, answer_cache=False):
        for _ in range(2):
            r = ask(client)
            assert "x-rag-cache" not in r.headers and not r.headers["server-timing"].startswith("cache")
        assert len(fake.requests) == 2 and tel.answer_cache_events == {}


def test_a_bad_cache_field_is_a_400_naming_it(env) -> None:
    client, _ = env
    r = client.post(
        "/v1/chat/completions",
        json={"index_name": "kb", "messages": [{"role": "user", "content": QUESTION}], "cache": "sometimes"},
    )
    assert r.status_code == 400 and "cache" in r.text


def test_a_not_covered_answer_is_kept_with_its_reason(env, fake: FakeOpenAI) -> None:
    client, _ = env
    question = "Does the KAITO operator automate PostgreSQL backups?"  # a name no document mentions
    first = ask(client, question)
    assert first.headers["x-rag-reason"] == "not_covered" and first.headers["x-rag-cache"] == "miss"
    second = ask(client, question)
    assert second.headers["x-rag-reason"] == "not_covered" and second.headers["x-rag-cache"] == "hit"
    assert second.json()["rag"]["answerable"] is False and second.json()["choices"] == first.json()["choices"]
    assert len(fake.requests) == 0  # neither called the model
