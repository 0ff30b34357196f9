"""Upstream LLM faults through the whole HTTP layer: each gives the client a clean error (a final SSE
error event once a stream has started), never a hung request, and each is counted in telemetry.

The upstream is the fake OpenAI server misbehaving on command; the adapter in between is the real one.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ragserve.testing.fake_openai import FakeOpenAI
from ragserve.testing.inprocess import RecordingTelemetry, inprocess_app

TIMEOUT_S = 1.0
QUESTION = [{"role": "user", "content": "What does the KAITO operator automate?"}]


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(
        answer="KAITO automates model inference on GPU nodes [1].", model="fake-model", max_model_len=4096
    ) as f:
        yield f


@pytest.fixture
def env(tmp_path, embedder, fake) -> Iterator[tuple[TestClient, RecordingTelemetry]]:
    tel = RecordingTelemetry()
    with (
        inprocess_app(
            tmp_path, embedder, fake.url, telemetry=tel, llm_timeout_s=TIMEOUT_S, similarity_threshold=0.1
        ) as (app, _),
        TestClient(app) as client,
    ):
        assert (
            client.post(
                "/index",
                json={
                    "index_name": "kb",
                    "documents": [
                        {"text": "KAITO is a Kubernetes operator that automates AI model inference on GPU nodes."}
                    ],
                },
            ).status_code
            == 200
        )
        yield client, tel


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"  # nothing listens there once the socket is closed


def sse_events(client: TestClient, body: dict[str, Any]) -> tuple[int, list[Any], float]:
    t0 = time.monotonic()
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        status = r.status_code
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    events = [line if line == "[DONE]" else json.loads(line) for line in lines]
    return status, events, time.monotonic() - t0


RAG = {"index_name": "kb", "messages": QUESTION}
PLAIN = {"messages": QUESTION}


@pytest.mark.parametrize("body", [RAG, PLAIN], ids=["rag", "passthrough"])
def test_timeout_is_504_within_the_configured_time(env, fake: FakeOpenAI, body) -> None:
    client, tel = env
    fake.delay_next(TIMEOUT_S * 5)
    t0 = time.monotonic()
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 504 and "timed out" in r.json()["error"]["message"]
    assert time.monotonic() - t0 < TIMEOUT_S * 4
    assert tel.upstream


@pytest.mark.parametrize("body", [RAG, PLAIN], ids=["rag", "passthrough"])
def test_upstream_5xx_keeps_status_and_message(env, fake: FakeOpenAI, body) -> None:
    client, tel = env
    fake.fail_next(status=500, message="CUDA error: device-side assert")
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 500 and "device-side assert" in r.json()["error"]["message"]
    fake.fail_next(status=503, message="overloaded")
    status, _, _ = sse_events(client, body)  # fails before the first chunk: a plain HTTP error
    assert status == 503
    assert len(tel.upstream) == 2


@pytest.mark.parametrize("body", [RAG, PLAIN], ids=["rag", "passthrough"])
def test_stream_cut_mid_way_ends_with_an_error_event_then_done(env, fake: FakeOpenAI, body) -> None:
    client, tel = env
    fake.cut_stream_next(after_chunks=2)
    status, events, seconds = sse_events(client, body)
    assert status == 200 and events[-1] == "[DONE]"
    assert events[-2]["error"]["code"] == 502 and "upstream LLM" in events[-2]["error"]["message"]
    assert any(e["choices"][0]["delta"].get("content") for e in events[:-2] if e.get("choices"))
    assert seconds < TIMEOUT_S * 4 and tel.upstream


@pytest.mark.parametrize("misbehave", ["garble", "error_event"])
def test_bad_stream_events_end_with_an_error_event(env, fake: FakeOpenAI, misbehave: str) -> None:
    client, tel = env
    if misbehave == "garble":
        fake.garble_stream_next(after_chunks=1)
    else:
        fake.error_event_next(after_chunks=1, status=500, message="generation failed")
    status, events, _ = sse_events(client, RAG)
    assert status == 200 and events[-1] == "[DONE]" and "error" in events[-2]
    assert tel.upstream


@pytest.mark.parametrize("stream", [False, True])
def test_refused_connection_is_502(tmp_path, embedder, stream: bool) -> None:
    tel = RecordingTelemetry()
    with (
        inprocess_app(tmp_path, embedder, closed_port_url(), telemetry=tel, llm_timeout_s=TIMEOUT_S) as (app, _),
        TestClient(app) as client,
    ):
        t0 = time.monotonic()
        if stream:
            status, _, _ = sse_events(client, PLAIN)
            assert status == 502
        else:
            r = client.post("/v1/chat/completions", json=PLAIN)
            assert r.status_code == 502 and "cannot connect" in r.json()["error"]["message"]
        assert time.monotonic() - t0 < TIMEOUT_S * 4
        assert len(tel.upstream) == 1


def test_the_service_recovers_after_faults(env, fake: FakeOpenAI) -> None:
    client, _ = env
    fake.cut_stream_next(after_chunks=1)
    sse_events(client, RAG)
    fake.fail_next(status=502)
    client.post("/v1/chat/completions", json=RAG)
    r = client.post("/v1/chat/completions", json=RAG)
    assert r.status_code == 200 and r.headers["x-rag-mode"] == "rag"
    assert r.json()["choices"][0]["message"]["content"] == "KAITO automates model inference on GPU nodes [1]."
