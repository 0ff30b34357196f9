"""The answer cache in the chat service over real shards, MiniLM and a fake upstream: an answer kept
is never served after a write changed an index it searched (add, update, delete a document, delete
the index, load a snapshot), whichever replica wrote, and a write that races the computation of an
answer makes that answer stale at once (the versions are read before retrieval)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from ragserve.api.documents import Document, UpdateDocument
from ragserve.api.generation import GenerationDelta, GenerationResult
from ragserve.api.openai import ChatCompletionRequest
from ragserve.api.sampling import SamplingParams
from ragserve.config import Settings
from ragserve.errors import NotFoundError
from ragserve.models.openai_engine import OpenAIEngine
from ragserve.service.answer_cache import AnswerCache, AnswerCacheOptions
from ragserve.service.chat import ChatOptions, ChatOutcome, ChatService
from ragserve.service.documents import DocumentService
from ragserve.service.local import EngineClient
from ragserve.service.pool import LocalShardPool
from ragserve.service.shard_service import ShardService, check_layout
from ragserve.service.wiring import build_documents
from ragserve.testing.fake_openai import FakeOpenAI

QUESTION = "How often does the Zephyr pump need a new filter?"
DOCS = {
    "alpha": "The Zephyr pump needs a new filter every 90 days (code ZX-ALPHA).",
    "beta": "A Zephyr pump in dusty rooms needs a new filter every 30 days (code ZX-BETA).",
    "other": "The cafeteria opens at 8 am on weekdays and closes at 3 pm.",
}


def echo_codes(body: dict[str, Any]) -> str:
    """The fake model's answer: the codes of the sources it was given, so an answer shows the state."""
    prompt = " ".join(str(m.get("content")) for m in body["messages"])
    return "Codes: " + " ".join(sorted(set(re.findall(r"ZX-[A-Z]+", prompt)))) + " [1]"


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(answer=echo_codes, model="fake-model", max_model_len=4096) as f:
        yield f


class HookedLLM(EngineClient):
    """The real engine adapter, running ``hook`` once before its next generation: a write that lands
    while an answer is being generated."""

    hook: Callable[[], Any] | None = None

    async def _fire(self) -> None:
        hook, self.hook = self.hook, None
        if hook is not None:
            await hook()

    async def chat(self, messages: Sequence[Any], params: SamplingParams) -> GenerationResult:
        await self._fire()
        return await super().chat(messages, params)

    async def chat_stream(self, messages: Sequence[Any], params: SamplingParams) -> AsyncIterator[GenerationDelta]:
        await self._fire()
        async for d in super().chat_stream(messages, params):
            yield d


class Replica:
    """One ingress replica's document and chat services (its own answer cache) over shared shards."""

    def __init__(self, settings: Settings, pool: LocalShardPool, embedder: Any, llm: HookedLLM):
        self.documents: DocumentService = build_documents(
            settings,
            pool=pool,
            embedder=embedder,
            embedding_model="all-MiniLM-L6-v2",
            embedding_tokenizer=embedder.model.tokenizer,
        )
        self.cache = AnswerCache(AnswerCacheOptions.from_settings(settings))
        self.chat = ChatService(ChatOptions.from_settings(settings), self.documents, llm, embedder, cache=self.cache)

    async def ask(self, question: str = QUESTION, **body: Any) -> ChatOutcome:
        request = ChatCompletionRequest.model_validate(
            {"messages": [{"role": "user", "content": question}], "index_name": "kb", "max_tokens": 16, **body}
        )
        outcome = await self.chat.complete(request)
        if outcome.stream is not None:  # drain it as a client would (a miss is kept when it ends)
            chunks = [c async for c in outcome.stream]
            outcome.relayed = ["".join(c.choices[0].delta.content or "" for c in chunks if c.choices)]
        return outcome


def text(outcome: ChatOutcome) -> str:
    if outcome.response is not None:
        return outcome.response.choices[0].message.content or ""
    return outcome.relayed[0]


def doc_ids(outcome: ChatOutcome) -> set[str]:
    return {n.doc_id for n in outcome.source_nodes}


@pytest.fixture
def env(tmp_path: Path, embedder, fake: FakeOpenAI) -> Iterator[tuple[Replica, Replica, HookedLLM, FakeOpenAI]]:
    settings = Settings(
        storage_dir=str(tmp_path), llm_engine="openai", llm_url=fake.url, num_shards=2, chunk_size=128, chunk_overlap=16
    )
    check_layout(settings.storage_dir, settings.num_shards)
    pool = LocalShardPool([ShardService(settings.storage_dir, i, settings.num_shards) for i in range(2)])
    llm = HookedLLM(OpenAIEngine(fake.url, "fake-model", None, 10.0))
    one, two = Replica(settings, pool, embedder, llm), Replica(settings, pool, embedder, llm)
    fake.requests.clear()
    yield one, two, llm, fake
    pool.close()


async def add(replica: Replica, *names: str) -> None:
    await replica.documents.add_documents("kb", [Document(doc_id=n, text=DOCS[n]) for n in names])


async def cached_then(replica: Replica, fake: FakeOpenAI, **body: Any) -> ChatOutcome:
    """Ask twice: the first is computed (a model call), the second served from the cache (none)."""
    first = await replica.ask(**body)
    calls = len(fake.requests)
    second = await replica.ask(**body)
    assert (first.cache, second.cache) == ("miss", "hit"), (first.cache, second.cache)
    assert len(fake.requests) == calls and text(second) == text(first) and doc_ids(second) == doc_ids(first)
    return second


async def recomputed(replica: Replica, fake: FakeOpenAI, **body: Any) -> ChatOutcome:
    calls = len(fake.requests)
    outcome = await replica.ask(**body)
    assert outcome.cache == "miss" and len(fake.requests) == calls + 1, (outcome.cache, outcome.mode)
    return outcome


async def test_adding_a_document_invalidates(env) -> None:
    one, _, _, fake = env
    await add(one, "alpha", "other")
    before = await cached_then(one, fake)
    assert "ZX-ALPHA" in text(before) and "ZX-BETA" not in text(before)
    await add(one, "beta")
    after = await recomputed(one, fake)
    assert "beta" in doc_ids(after) and "ZX-BETA" in text(after)
    assert one.cache.counts["invalidation"] == 1


async def test_updating_a_document_invalidates(env) -> None:
    one, _, _, fake = env
    await add(one, "alpha", "other")
    await cached_then(one, fake)
    new = DOCS["alpha"].replace("ZX-ALPHA", "ZX-GAMMA")
    response = await one.documents.update_documents("kb", [UpdateDocument(doc_id="alpha", text=new)])
    assert [d.doc_id for d in response.updated_documents] == ["alpha"]
    after = await recomputed(one, fake)
    assert "ZX-GAMMA" in text(after) and "ZX-ALPHA" not in text(after)


@pytest.mark.parametrize("stream", [False, True])
async def test_deleting_a_document_invalidates(env, stream: bool) -> None:
    one, _, _, fake = env
    await add(one, "alpha", "beta", "other")
    before = await cached_then(one, fake, stream=stream)
    assert "alpha" in doc_ids(before)
    await one.documents.delete_documents("kb", ["alpha"])
    after = await recomputed(one, fake, stream=stream)
    assert "alpha" not in doc_ids(after) and "ZX-ALPHA" not in text(after) and "ZX-BETA" in text(after)


async def test_deleting_the_index_invalidates(env) -> None:
    one, _, _, fake = env
    await add(one, "alpha", "other")
    await cached_then(one, fake)
    await one.documents.drop_index("kb")
    with pytest.raises(NotFoundError):  # the index is gone: its 404, never the kept answer
        await one.ask()
    await add(one, "beta")  # the same name again, other documents
    after = await recomputed(one, fake)
    assert doc_ids(after) == {"beta"} and "ZX-ALPHA" not in text(after)


async def test_loading_a_snapshot_invalidates(env) -> None:
    one, _, _, fake = env
    await add(one, "alpha", "other")
    await one.documents.persist("kb")
    await one.documents.delete_documents("kb", ["alpha"])
    await add(one, "beta")
    before = await cached_then(one, fake)
    assert "beta" in doc_ids(before) and "alpha" not in doc_ids(before)
    await one.documents.load("kb", overwrite=True)
    after = await recomputed(one, fake)
    assert "alpha" in doc_ids(after) and "beta" not in doc_ids(after) and "ZX-BETA" not in text(after)


async def test_a_write_through_another_replica_invalidates(env) -> None:
    one, two, _, fake = env
    await add(one, "alpha", "beta", "other")
    await cached_then(one, fake)
    await two.documents.delete_documents("kb", ["alpha"])  # another ingress replica, the same shards
    after = await recomputed(one, fake)
    assert "alpha" not in doc_ids(after) and "ZX-ALPHA" not in text(after)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_write_during_generation_makes_the_answer_stale_at_once(env, stream: bool) -> None:
    """The model is generating from "alpha" when it is deleted: that answer is kept with the
    versions read before its retrieval, so the next ask recomputes without "alpha"."""
    one, _, llm, fake = env
    await add(one, "alpha", "beta", "other")

    async def delete_alpha() -> None:
        await one.documents.delete_documents("kb", ["alpha"])

    llm.hook = delete_alpha
    racing = await one.ask(stream=stream)
    assert racing.cache == "miss" and "ZX-ALPHA" in text(racing) and llm.hook is None  # computed before the delete
    assert len(one.cache) == 1  # kept, with the versions from before the write
    after = await recomputed(one, fake, stream=stream)
    assert "alpha" not in doc_ids(after) and "ZX-ALPHA" not in text(after)
    assert one.cache.counts["invalidation"] == 1


async def test_a_write_between_the_version_read_and_retrieval_is_not_kept_as_fresh(env, monkeypatch) -> None:
    """A write after the versions were read and before retrieval: the answer sees it, but is kept
    under the older versions, so it is recomputed next time (conservative, never stale)."""
    one, _, _, fake = env
    await add(one, "alpha", "other")
    read = one.documents.index_versions
    fired: list[bool] = []

    async def read_then_write(indexes: Sequence[str], shard_wide: bool = False) -> Any:
        versions = await read(indexes, shard_wide)
        if not fired:
            fired.append(True)
            await add(one, "beta")
        return versions

    monkeypatch.setattr(one.documents, "index_versions", read_then_write)
    first = await one.ask()
    assert "ZX-BETA" in text(first)
    second = await recomputed(one, fake)
    assert text(second) == text(first)
    third = await one.ask()
    assert third.cache == "hit"


async def test_a_cached_answer_is_served_as_a_stream_and_whole_alike(env) -> None:
    one, _, _, fake = env
    await add(one, "alpha", "beta", "other")
    whole = await one.ask()
    calls = len(fake.requests)
    streamed = await one.ask(stream=True, stream_options={"include_usage": True})
    assert streamed.cache == "hit" and len(fake.requests) == calls
    assert text(streamed) == text(whole) and doc_ids(streamed) == doc_ids(whole)
    assert streamed.usage is not None and streamed.usage.total_tokens == 0


async def test_a_stream_whose_client_left_is_not_kept(env) -> None:
    one, _, _, _ = env
    await add(one, "alpha", "other")
    request = ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": QUESTION}], "index_name": "kb", "stream": True}
    )
    outcome = await one.chat.complete(request)
    assert outcome.stream is not None
    await anext(outcome.stream)
    await outcome.stream.aclose()  # the client left after the first chunk
    assert len(one.cache) == 0
    assert (await one.ask(stream=True)).cache == "miss"


async def test_near_duplicates_are_hits_only_with_the_setting(tmp_path: Path, embedder, fake: FakeOpenAI) -> None:
    settings = Settings(
        storage_dir=str(tmp_path),
        llm_engine="openai",
        llm_url=fake.url,
        num_shards=2,
        chunk_size=128,
        chunk_overlap=16,
        answer_cache_similarity=0.97,
    )
    check_layout(settings.storage_dir, settings.num_shards)
    pool = LocalShardPool([ShardService(settings.storage_dir, i, settings.num_shards) for i in range(2)])
    try:
        near = Replica(settings, pool, embedder, HookedLLM(OpenAIEngine(fake.url, "fake-model", None, 10.0)))
        await add(near, "alpha", "beta", "other")
        first = await near.ask()
        assert first.cache == "miss"
        again = await near.ask(QUESTION.lower().rstrip("?"))  # other text, nearly the same embedding
        assert again.cache == "hit" and text(again) == text(first) and again.embedded == [QUESTION.lower().rstrip("?")]
        # the kept answer was another caller's question: this one's is what the answer says it searched
        assert again.rag is not None and again.rag.query == QUESTION.lower().rstrip("?")
        assert first.rag is not None and first.rag.query == QUESTION
        other = await near.ask("When does the cafeteria open on weekdays?")
        assert other.cache == "miss"
        await near.documents.delete_documents("kb", ["alpha"])
        after = await near.ask(QUESTION.lower().rstrip("?"))
        assert after.cache == "miss" and "alpha" not in doc_ids(after)
    finally:
        pool.close()


async def test_a_write_to_any_index_searched_invalidates_and_one_to_another_index_does_not(env) -> None:
    """In dense mode only the indexes searched count; in a mode with keyword search a write to any
    index of their shards does too (BM25's statistics are the shard's: another index's text reorders
    this one's keyword hits)."""
    one, _, _, fake = env
    await add(one, "alpha", "other")
    await one.documents.add_documents("kb2", [Document(doc_id="beta", text=DOCS["beta"])])
    await one.documents.add_documents("elsewhere", [Document(doc_id="x", text="Unrelated text about bread.")])
    await cached_then(one, fake, index_name=["kb", "kb2"], retrieval_mode="dense")
    await cached_then(one, fake, index_name=["kb", "kb2"])  # hybrid, the default
    await one.documents.add_documents("elsewhere", [Document(doc_id="y", text="More unrelated text.")])
    dense = await one.ask(index_name=["kb2", "kb"], retrieval_mode="dense")
    assert dense.cache == "hit"  # not searched, and dense scores read nothing of it: still valid
    hybrid = await one.ask(index_name=["kb2", "kb"])
    assert hybrid.cache == "miss"  # the shard's keyword statistics moved
    assert (await one.ask(index_name=["kb2", "kb"])).cache == "hit"
    await one.documents.delete_documents("kb2", ["beta"])
    after = await recomputed(one, fake, index_name=["kb", "kb2"])
    assert "beta" not in doc_ids(after) and "ZX-BETA" not in text(after)


@pytest.mark.parametrize("part", ["evidence", "names"])
async def test_an_answer_made_without_a_part_that_failed_is_served_but_not_kept(env, monkeypatch, part: str) -> None:
    """The evidence's embedding, or the lookup of the question's names in the index, failed: the
    answer goes on without it (as before), but is not kept, so it is not served for an hour after
    the failure has passed."""
    from ragserve.errors import EngineError

    one, _, _, _ = env
    await add(one, "alpha", "other")

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise EngineError(503, "down for a moment")

    if part == "evidence":
        assert one.chat.passages is not None
        monkeypatch.setattr(one.chat.passages, "embed", broken)
        question = QUESTION
    else:
        monkeypatch.setattr(one.documents, "mentioned", broken)
        question = "What does the ZX-ALPHA manual say about the Zorblax Quantifier?"  # a name the sources lack
    first = await one.ask(question)
    assert first.mode == "rag" and first.cache == "miss"
    monkeypatch.undo()
    second = await one.ask(question)
    assert second.cache == "miss"  # computed again, now whole
    assert (await one.ask(question)).cache == "hit"
