"""What a chat request without ``top_k`` gets (issue 23): few sources on an engine whose prefill is
slow (the embedded CPU engine), the window's share on a GPU or remote one, ``chat_context_tokens``
over both, and a request's ``top_k`` over all; the playground's settings say which applies.

The whole application runs in-process (real shards, chunker, MiniLM, chat service); the one fake is
at the engine edge: the remote adapter to a fake upstream, which, to stand for the embedded engine,
reports the prefill speed that engine measures at start.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ragserve.deployments.clients import HandleGenerator
from ragserve.models.openai_engine import OpenAIEngine
from ragserve.service.local import EngineClient
from ragserve.testing.fake_openai import FakeOpenAI
from ragserve.testing.inprocess import inprocess_app

#: Thirty short notes on one subject: with similarity_threshold 0, every one is relevant.
DOCS = [
    {
        "doc_id": f"pump-{i}",
        "text": f"Service note {i}: the garden pond pump number {i} was cleaned, its filter replaced and "
        f"its flow checked at {1000 + 10 * i} litres per hour after the repair of week {i}.",
    }
    for i in range(30)
]
QUESTION = [{"role": "user", "content": "What was checked after the pump repair?"}]


class CpuSpeedEngine(OpenAIEngine):
    """The remote adapter, reporting a CPU engine's prefill speed: 200 tokens/s."""

    def prefill_tokens_per_s(self) -> float | None:
        return 200.0


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(answer="Its flow [1].", model="fake-model", max_model_len=32768) as f:
        yield f


@pytest.fixture
def app(tmp_path, embedder, fake: FakeOpenAI):
    """``app(cpu=..., **settings)``: a TestClient over the application with DOCS indexed."""
    opened: list[Any] = []

    def make(cpu: bool = False, **settings: Any) -> TestClient:
        engine = CpuSpeedEngine(fake.url, "fake-model", None, 10.0) if cpu else None
        cm = inprocess_app(tmp_path / str(len(opened)), embedder, fake.url, engine=engine, **settings)
        app, _ = cm.__enter__()
        client = TestClient(app)
        client.__enter__()
        opened.append((cm, client))
        assert client.post("/index", json={"index_name": "kb", "documents": DOCS}).status_code == 200
        return client

    yield make
    for cm, client in reversed(opened):
        client.__exit__(None, None, None)
        cm.__exit__(None, None, None)


def chat(client: TestClient, **body: Any) -> dict[str, Any]:
    r = client.post(
        "/v1/chat/completions",
        json={"messages": QUESTION, "index_name": "kb", "similarity_threshold": 0.0, **body},
    )
    assert r.status_code == 200, r.text
    assert r.headers["x-rag-mode"] == "rag"
    return r.json()


def shown(client: TestClient) -> dict[str, Any]:
    return client.get("/ui/config").json()["settings"]


def test_a_slow_cpu_engine_answers_from_a_few_sources_and_says_so(app) -> None:
    client = app(cpu=True)
    body = chat(client)
    # 200 tokens/s x chat_context_prefill_s 2 s = 400 tokens (more than the floor, 3 chunks of 128)
    assert 1 <= len(body["source_nodes"]) <= 5
    settings = shown(client)
    assert settings["chat_top_k_in_force"] == 5
    assert settings["chat_context_in_force"].startswith("400 tokens, about 3 source(s) of 128 tokens")
    assert "200 tokens/s" in settings["chat_context_in_force"]
    assert settings["top_k"] == 5 and settings["chat_context_tokens"] is None  # the configured values too


def test_a_remote_or_gpu_engine_fills_the_windows_share(app) -> None:
    client = app()
    body = chat(client)
    assert len(body["source_nodes"]) == len(DOCS)  # 30 short notes fit the share of a 32k window
    settings = shown(client)
    assert settings["chat_top_k_in_force"] == min(100, (32768 - 64) // 2 // 128)
    assert "context_token_ratio of the window" in settings["chat_context_in_force"]


def test_the_setting_overrides_the_engine(app) -> None:
    remote = app(chat_context_tokens=300)
    assert 1 <= len(chat(remote)["source_nodes"]) <= 5
    assert shown(remote)["chat_context_in_force"].startswith("300 tokens")
    cpu = app(cpu=True, chat_context_tokens=3000)  # more than the CPU engine's speed would give
    assert shown(cpu)["chat_top_k_in_force"] == 3000 // 128
    assert len(chat(cpu)["source_nodes"]) == 3000 // 128  # the notes are short: every candidate fits


def test_a_request_top_k_still_wins_on_a_slow_engine(app) -> None:
    client = app(cpu=True)
    assert len(chat(client, top_k=20)["source_nodes"]) == 20
    assert len(chat(client, top_k=2)["source_nodes"]) == 2


def test_the_prefill_speed_crosses_the_seams(fake: FakeOpenAI, monkeypatch) -> None:
    """EngineClient asks its engine; HandleGenerator reads it from the Generator's info, again every
    PREFILL_REFRESH_S (a generator of an older release, which does not say, leaves the window to
    decide)."""

    class Remote:
        def __init__(self, result: Any):
            self.result, self.calls = result, 0

        async def remote(self) -> Any:
            self.calls += 1
            return self.result

    def handle(info: dict[str, Any]) -> Any:
        return SimpleNamespace(info=Remote(info), token_counter=Remote(object()))

    async def main() -> None:
        h = handle({"model_id": "m", "context_window": 8192, "prefill_tokens_per_s": 321.0})
        gen = HandleGenerator(h)
        assert await gen.prefill_tokens_per_s() == 321.0 and await gen.context_window() == 8192
        assert await gen.prefill_tokens_per_s() == 321.0 and h.info.calls == 1
        assert await HandleGenerator(handle({"model_id": "m", "context_window": 8192})).prefill_tokens_per_s() is None
        # asked again after PREFILL_REFRESH_S (the engine raises its speed when a request reads faster)
        monkeypatch.setattr("ragserve.deployments.clients.PREFILL_REFRESH_S", 0.0)
        h.info.result = {"model_id": "m", "context_window": 8192, "prefill_tokens_per_s": 500.0}
        assert await gen.prefill_tokens_per_s() == 500.0
        h.info.result = None  # a failing refresh keeps what it had
        assert await gen.prefill_tokens_per_s() == 500.0
        for engine, rate in (
            (CpuSpeedEngine(fake.url, "m", None, 1.0), 200.0),
            (OpenAIEngine(fake.url, "m", None, 1.0), None),
        ):
            try:
                assert await EngineClient(engine).prefill_tokens_per_s() == rate
            finally:
                await engine.stop()

    asyncio.run(main())
