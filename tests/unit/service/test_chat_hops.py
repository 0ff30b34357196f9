"""Every hop of a RAG chat request earns its place (issue 13): the search is the only call to
the shards; a missing index is still the plan's 404, whichever outcome finds out."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ragserve.api.documents import Document
from ragserve.api.openai import ChatCompletionRequest
from ragserve.config import Settings
from ragserve.errors import NotFoundError
from ragserve.models.openai_engine import OpenAIEngine
from ragserve.service.chat import ChatOptions
from ragserve.service.local import EngineClient
from ragserve.service.pool import LocalShardPool
from ragserve.service.shard_service import ShardService, check_layout
from ragserve.service.wiring import Services, build_services
from ragserve.testing.fake_openai import FakeOpenAI


class CountingPool(LocalShardPool):
    """The in-process pool, recording which shard methods each request calls."""

    def __init__(self, shards: list[Any]):
        super().__init__(shards)
        self.calls: list[str] = []

    async def call(self, shard: int, method: Any, *args: Any, **kwargs: Any) -> Any:
        self.calls.append(method.__name__)
        return await super().call(shard, method, *args, **kwargs)


@pytest.fixture(params=[False], ids=["no answer cache"])
def services(request: pytest.FixtureRequest, tmp_path: Path, embedder) -> Iterator[tuple[Services, CountingPool]]:
    """The services without the answer cache (its version reads are a hop of their own, below),
    or with it when a test parametrizes ``services`` indirectly with True."""
    with FakeOpenAI(answer="ok [1]", model="fake-model", max_model_len=4096) as fake:
        s = Settings(
            storage_dir=str(tmp_path),
            llm_engine="openai",
            llm_url=fake.url,
            num_shards=2,
            similarity_threshold=0.0,
            answer_cache=request.param,
        )
        check_layout(s.storage_dir, s.num_shards)
        pool = CountingPool([ShardService(s.storage_dir, i, s.num_shards) for i in range(s.num_shards)])
        llm = EngineClient(OpenAIEngine(fake.url, "fake-model", None, 10.0))
        svc = build_services(
            s,
            pool=pool,
            embedder=embedder,
            llm=llm,
            embedding_model="all-MiniLM-L6-v2",
            embedding_tokenizer=embedder.model.tokenizer,
        )
        asyncio.run(svc.documents.add_documents("kb", [Document(text="The pump on line 3 was serviced in May.")]))
        yield svc, pool
        pool.close()


def _request(**body: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "When was the pump serviced?"}], "max_tokens": 8, **body}
    )


def test_rag_request_calls_the_shards_once_each_to_search(services) -> None:
    svc, pool = services
    pool.calls.clear()
    outcome = asyncio.run(svc.chat.complete(_request(index_name="kb")))
    assert outcome.mode == "rag"
    assert pool.calls == ["search_indexes", "search_indexes"]  # no separate existence check before it
    assert {"embed", "search", "fit", "generate"} <= outcome.timings.keys()


def test_several_indexes_cost_one_search_call_per_shard(services) -> None:
    svc, pool = services
    pool.calls.clear()
    outcome = asyncio.run(svc.chat.complete(_request(index_name=["kb", "kb", "kb"])))
    assert outcome.mode == "rag"
    assert pool.calls == ["search_indexes", "search_indexes"]


@pytest.mark.parametrize("services", [True], ids=["answer cache"], indirect=True)
def test_the_answer_cache_reads_the_versions_once_per_shard_before_the_search(services) -> None:
    """With the answer cache on, a RAG request first reads its indexes' versions (one call per
    shard); an answer served from the cache costs those calls alone."""
    svc, pool = services
    pool.calls.clear()
    outcome = asyncio.run(svc.chat.complete(_request(index_name="kb")))
    assert outcome.mode == "rag" and outcome.cache == "miss"
    assert pool.calls == ["index_versions", "index_versions", "search_indexes", "search_indexes"]
    pool.calls.clear()
    outcome = asyncio.run(svc.chat.complete(_request(index_name="kb")))
    assert outcome.cache == "hit" and pool.calls == ["index_versions", "index_versions"]


TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
NO_QUERY = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]


@pytest.mark.parametrize("extra", [{}, {"tools": TOOLS}, {"messages": NO_QUERY}])
@pytest.mark.parametrize("names", ["missing", ["kb", "missing"]])
def test_missing_index_is_the_plans_404_whether_or_not_a_search_follows(services, extra: dict, names: Any) -> None:
    svc, _ = services
    with pytest.raises(NotFoundError) as e:
        asyncio.run(svc.chat.complete(_request(index_name=names, **extra)))
    assert (e.value.message, e.value.param, e.value.code) == (
        "No such index: 'missing' exists.",
        "index_name",
        "index_not_found",
    )


def test_the_chat_service_is_given_the_chat_settings_only(services) -> None:
    svc, _ = services
    assert svc.chat.options == ChatOptions.from_settings(svc.settings)
    assert svc.chat.options.similarity_threshold == 0.0  # the fixture's, not the default
    assert not hasattr(svc.chat, "settings")
