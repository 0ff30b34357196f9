"""The answer cache on its own (``ragserve.service.answer_cache``): what is keyed, the rules of a
request, the bounds (entries, bytes, one entry too large), LRU order, the TTL, invalidation by
versions, the near-duplicate lookup, and a stream recorded back into a whole answer."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ragserve.api.openai import (
    ChatCompletionChoice,
    ChatCompletionChunk,
    ChatCompletionChunkChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    DeltaMessage,
    RagInfo,
    ResponseMessage,
)
from ragserve.config import Settings
from ragserve.rag.plan import RagPlan, plan
from ragserve.service.answer_cache import (
    EVICTION,
    INVALIDATION,
    AnswerCache,
    AnswerCacheOptions,
    StreamRecorder,
    answer_key,
    cache_policy,
    large_key,
    normalise_question,
    replay_pieces,
)

V1 = (("epoch", 1, 3), ("epoch2", None, 0))
V2 = (("epoch", 1, 4), ("epoch2", None, 0))
SERVER = {"model": "m", "window": 4096}


def options(**kw: Any) -> AnswerCacheOptions:
    base = AnswerCacheOptions.from_settings(Settings(storage_dir="/tmp/ragserve-unused"))
    return AnswerCacheOptions(**{**base.__dict__, **kw})


def rag_plan(question: str = "What is KAITO?", **body: Any) -> RagPlan:
    body.setdefault("index_name", "kb")
    request = ChatCompletionRequest(messages=[{"role": "user", "content": question}], **body)
    decided = plan(request, lambda _name: True)
    assert isinstance(decided, RagPlan)
    return decided


def key(question: str = "What is KAITO?", **body: Any) -> str:
    return answer_key(rag_plan(question, **body), SERVER).key


def answer(text: str = "An answer [1].", pad: int = 0) -> ChatCompletionResponse:
    return ChatCompletionResponse(
        object="chat.completion",
        model="m",
        choices=[ChatCompletionChoice(message=ResponseMessage(content=text + "x" * pad))],
        source_nodes=[],
        citations=[],
        invalid_citations=[],
        rag=RagInfo(query="q", query_source="message", retrieval_mode="hybrid"),
    )


# --- the key ----------------------------------------------------------------------------------
def test_the_question_is_keyed_with_whitespace_normalised_and_nothing_else() -> None:
    assert normalise_question("  What  is\tKAITO? \n") == "What is\tKAITO?"
    assert normalise_question("one.\n\n  two") == "one.\ntwo"
    assert key("What is KAITO?") == key("  What   is KAITO?\n")
    # case marks names, "?" the sentences that ask, punctuation is a token: all may change the answer
    assert len({key("What is KAITO?"), key("what is kaito?"), key("What is KAITO"), key("What is KAITO!")}) == 4


def test_delivery_and_caller_are_not_keyed_but_everything_that_shapes_the_answer_is() -> None:
    base = key()
    assert key(stream=True, stream_options={"include_usage": True}, user="someone") == base
    assert key(index_name=["a", "b"]) == key(index_name=["b", "a", "a"])  # a set of indexes
    assert key(metadata_filter={"a": 1, "b": "x"}) == key(metadata_filter={"b": "x", "a": 1})
    changed = [
        {"index_name": "other"},
        {"metadata_filter": {"a": 1}},
        {"metadata_filter": {"a": 1.5}},
        {"top_k": 3},
        {"similarity_threshold": 0.5},
        {"retrieval_mode": "dense"},
        {"context_token_ratio": 0.3},
        {"sources_in_content": True},
        {"query_rewrite": "llm"},
        {"model": "other-model"},
        {"temperature": 0.0},
        {"top_p": 0.5},
        {"max_tokens": 17},
        {"max_completion_tokens": 17},
        {"stop": ["\n"]},
        {"seed": 7},
        {"response_format": {"type": "json_object"}},  # any field forwarded upstream
        {"frequency_penalty": 0.5},
    ]
    keys = [key(**c) for c in changed]
    assert base not in keys and len(set(keys)) == len(keys), changed


def test_system_messages_history_and_server_decisions_are_keyed() -> None:
    def with_messages(*messages: dict[str, str]) -> str:
        request = ChatCompletionRequest(messages=list(messages), index_name="kb")
        decided = plan(request, lambda _name: True)
        assert isinstance(decided, RagPlan)
        return answer_key(decided, SERVER).key

    q = {"role": "user", "content": "How do I set it up?"}
    alone = with_messages(q)
    system = with_messages({"role": "system", "content": "Answer in French."}, q)
    history = with_messages(
        {"role": "user", "content": "Tell me about Flask."}, {"role": "assistant", "content": "…"}, q
    )
    assert len({alone, system, history}) == 3
    p = rag_plan()
    assert answer_key(p, SERVER) != answer_key(p, {**SERVER, "window": 8192})
    assert answer_key(p, SERVER).rest == answer_key(rag_plan("Something else?"), SERVER).rest


def test_a_large_request_is_told_without_reading_all_of_it() -> None:
    assert not large_key(rag_plan(logit_bias={"1": 2}))
    assert large_key(rag_plan("x" * 40_000))
    assert large_key(rag_plan(some_field="y" * 40_000))  # any forwarded field counts
    assert large_key(rag_plan(some_field=[[1] * 100] * 400))  # many small values too
    assert not large_key(rag_plan(some_field="y" * 40_000), limit=10**9)


# --- the rules --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("body", "header", "setting", "read", "write"),
    [
        ({}, None, {}, True, True),
        ({"cache": False}, None, {}, False, False),
        ({}, "no-store", {}, False, False),
        ({}, "No-Cache", {}, False, True),
        ({}, "max-age=0, no-cache", {}, False, True),
        ({"temperature": 0.7}, None, {}, False, False),
        ({"temperature": 0.7, "cache": True}, None, {}, True, True),
        ({"temperature": 0.7}, None, {"answer_cache_sampled": True}, True, True),
        ({"temperature": 0.0}, None, {}, True, True),
        ({}, None, {"answer_cache": False}, False, False),
        ({"cache": True}, None, {"answer_cache": False}, False, False),
    ],
)
def test_cache_policy(body: dict, header: str | None, setting: dict, read: bool, write: bool) -> None:
    request = ChatCompletionRequest(messages=[{"role": "user", "content": "q"}], index_name="kb", **body)
    policy = cache_policy(request, header, options(**setting))
    assert (policy.read, policy.write) == (read, write)


def test_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="answer_cache_similarity"):
        Settings(storage_dir="/tmp/x", answer_cache_similarity=0.5)
    with pytest.raises(ValueError, match="answer_cache_max_entries"):
        Settings(storage_dir="/tmp/x", answer_cache_max_entries=0)
    with pytest.raises(ValueError, match="answer_cache_ttl_s"):
        Settings(storage_dir="/tmp/x", answer_cache_ttl_s=0)


# --- bounds, LRU, TTL, versions -----------------------------------------------------------------
def test_entries_bound_evicts_the_least_recently_used() -> None:
    cache = AnswerCache(options(answer_cache_max_entries=2))
    k = [answer_key(rag_plan(f"Question {i}?"), SERVER) for i in range(3)]
    cache.put(k[0], V1, answer(), None)
    cache.put(k[1], V1, answer(), None)
    assert cache.get(k[0].key, V1) is not None  # k0 is now the most recently used
    cache.put(k[2], V1, answer(), None)
    assert len(cache) == 2 and cache.get(k[1].key, V1) is None
    assert cache.get(k[0].key, V1) is not None and cache.get(k[2].key, V1) is not None
    assert cache.counts[EVICTION] == 1


def test_bytes_bound_counts_each_answer_and_refuses_one_larger_than_the_bound() -> None:
    cache = AnswerCache(options(answer_cache_max_bytes=64 * 1024))
    k = [answer_key(rag_plan(f"Question {i}?"), SERVER) for i in range(4)]
    for i in range(3):
        assert cache.put(k[i], V1, answer(pad=20_000), None)
    assert len(cache) == 3 and 60_000 < cache.bytes <= 64 * 1024
    assert cache.put(k[3], V1, answer(pad=20_000), None)  # evicts the oldest to make room
    assert len(cache) == 3 and cache.get(k[0].key, V1) is None and cache.bytes <= 64 * 1024
    assert not cache.put(k[0], V1, answer(pad=70_000), None)  # alone larger than the bound: not kept
    assert len(cache) == 3 and cache.get(k[0].key, V1) is None
    before = cache.bytes
    cache.put(k[3], V1, answer(pad=100), None)  # replacing an entry counts it once
    assert cache.bytes < before and len(cache) == 3


def test_ttl_and_versions() -> None:
    now = [0.0]
    cache = AnswerCache(options(answer_cache_ttl_s=10.0), clock=lambda: now[0])
    k = answer_key(rag_plan(), SERVER)
    cache.put(k, V1, answer(), "not_covered")
    hit = cache.get(k.key, V1)
    assert hit is not None and hit.reason == "not_covered"
    served = hit.response("chatcmpl-new", 123)
    assert (served.id, served.created, served.usage.total_tokens if served.usage else None) == ("chatcmpl-new", 123, 0)
    assert served.choices[0].message.content == "An answer [1]."
    assert cache.get(k.key, V2) is None and len(cache) == 0  # a write: dropped, counted
    assert cache.counts[INVALIDATION] == 1
    cache.put(k, V2, answer(), None)
    now[0] = 10.0
    assert cache.get(k.key, V2) is None and len(cache) == 0 and cache.counts[EVICTION] == 1


def test_near_duplicates_share_the_rest_of_the_key_and_reach_the_threshold() -> None:
    cache = AnswerCache(options(answer_cache_similarity=0.97))
    rng = np.random.default_rng(0)
    v = rng.normal(size=16).astype(np.float32)
    k = answer_key(rag_plan("What does KAITO automate?"), SERVER)
    cache.put(k, V1, answer(), None, v / np.linalg.norm(v))
    near = v + 0.05 * rng.normal(size=16).astype(np.float32)
    far = rng.normal(size=16).astype(np.float32)
    other_rest = answer_key(rag_plan("What does KAITO automate?", top_k=3), SERVER).rest
    assert cache.similar(k.rest, near, V1) is not None  # not normalised: the cache normalises it
    assert cache.similar(k.rest, far, V1) is None
    assert cache.similar(other_rest, near, V1) is None  # another top_k: never compared
    assert cache.similar(k.rest, np.full(16, np.nan, dtype=np.float32), V1) is None
    assert cache.similar(k.rest, near, V2) is None and len(cache) == 0  # stale: dropped
    off = AnswerCache(options())
    off.put(k, V1, answer(), None, v)
    assert off.similar(k.rest, v, V1) is None and off.get(k.key, V1) is not None


# --- streams ----------------------------------------------------------------------------------
def chunk(**kw: Any) -> ChatCompletionChunk:
    delta = kw.pop("delta", DeltaMessage())
    finish = kw.pop("finish", None)
    return ChatCompletionChunk(
        id="c",
        object="chat.completion.chunk",
        created=1,
        model="m",
        choices=[ChatCompletionChunkChoice(delta=delta, finish_reason=finish)],
        **kw,
    )


def test_a_recorded_stream_is_the_whole_answer_only_once_it_closed() -> None:
    rag = RagInfo(query="q", query_source="message", retrieval_mode="hybrid")
    recorder = StreamRecorder()
    recorder.add(chunk(delta=DeltaMessage(role="assistant", content=""), source_nodes=[], rag=rag))
    for piece in ("Hello ", "there [1]."):
        recorder.add(chunk(delta=DeltaMessage(content=piece)))
    assert recorder.answer() is None  # not closed yet (a stream cut here is never kept)
    recorder.add(chunk(finish="stop", citations=[], invalid_citations=[], rag=rag))
    whole = recorder.answer()
    assert whole is not None and whole.choices[0].message.content == "Hello there [1]."
    assert whole.choices[0].finish_reason == "stop" and whole.rag == rag


@pytest.mark.parametrize("text", ["", "short", "word " * 100, "x" * 300, "a  b\n\nc " * 40, "日本語のテキスト" * 30])
def test_replay_pieces_give_the_text_back(text: str) -> None:
    pieces = replay_pieces(text)
    assert "".join(pieces) == text and all(pieces)
