"""Evidence beside every RAG answer and the "not covered" answer (issue 23), through the chat
service and /query with real shards and the real MiniLM embedder; the language model is a fake
that records its calls, so a "not covered" answer is seen not to call it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from ragserve.api.documents import Document, QueryRequest
from ragserve.api.generation import GenerationDelta, GenerationResult
from ragserve.api.messages import Message
from ragserve.api.openai import ChatCompletionChunk, ChatCompletionRequest, ChatCompletionResponse
from ragserve.api.sampling import SamplingParams
from ragserve.config import Settings
from ragserve.models.tokenizers import ApproxTokenCounter
from ragserve.ports import TokenCounter
from ragserve.rag.answerable import NOT_COVERED_ANSWER
from ragserve.rag.fit import ContextBudgetError
from ragserve.rag.prompt import EVIDENCE_HEADING
from ragserve.service.chat import NOT_COVERED
from ragserve.service.pool import LocalShardPool
from ragserve.service.shard_service import ShardService, check_layout
from ragserve.service.wiring import Services, build_services

PUMP = (
    "The Zephyr X200 is a submersible pump for garden ponds. It moves water through filters and fountains. "
    "The housing is made of corrosion-resistant plastic and weighs 2.4 kilograms. The impeller should be "
    "cleaned every three months, or sooner when the flow drops. The maximum flow rate of the Zephyr X200 is "
    "3,200 litres per hour at a height of one metre. The power cable is ten metres long and must not be "
    "shortened. The warranty covers manufacturing defects for five years from the date of purchase."
)
LIGHT = (
    "The Lumen L5 is an underwater light for ponds and fountains. Its nozzle kit supports a flow of up to "
    "1,000 litres per hour. The light draws 6 watts and is rated IP68. The lamp lasts about 20,000 hours."
)
ANSWERED = "What is the maximum flow rate of the Zephyr X200?"
NOT_IN_THE_DOCUMENTS = "How do I connect the Zephyr X200 to a solar panel?"


class RecordingModel:
    """A ``LanguageModel`` that answers a fixed text and records every call."""

    model_id = "recording-model"

    def __init__(self, window: int = 4096) -> None:
        self.calls: list[str] = []
        self.prompts: list[list[Message]] = []
        self.window = window

    async def context_window(self) -> int:
        return self.window

    async def prefill_tokens_per_s(self) -> float | None:
        return None  # sized by the window, as a GPU or remote model

    async def token_counter(self) -> TokenCounter:
        return ApproxTokenCounter("test")

    async def chat(self, messages: Sequence[Message], params: SamplingParams) -> GenerationResult:
        self.calls.append("chat")
        self.prompts.append(list(messages))
        return GenerationResult(text="3,200 litres per hour [1].", prompt_tokens=10, completion_tokens=5)

    async def chat_stream(self, messages: Sequence[Message], params: SamplingParams) -> AsyncIterator[GenerationDelta]:
        self.calls.append("chat_stream")
        self.prompts.append(list(messages))
        for piece in ("3,200 litres ", "per hour [1]."):
            yield GenerationDelta(text=piece)
        yield GenerationDelta(finish_reason="stop", prompt_tokens=10, completion_tokens=5)

    async def passthrough(self, body: dict[str, Any], default_max_tokens: int) -> ChatCompletionResponse:
        self.calls.append("passthrough")
        raise AssertionError("no passthrough expected")

    async def passthrough_stream(
        self, body: dict[str, Any], default_max_tokens: int
    ) -> AsyncIterator[ChatCompletionChunk]:
        self.calls.append("passthrough_stream")
        raise AssertionError("no passthrough expected")
        yield  # pragma: no cover


@pytest.fixture
def build(tmp_path: Path, embedder) -> Iterator[Any]:
    pools: list[LocalShardPool] = []

    def make(window: int = 4096, **overrides: Any) -> tuple[Services, RecordingModel]:
        s = Settings(
            storage_dir=str(tmp_path / f"s{len(pools)}"),
            num_shards=1,
            llm_engine="openai",
            llm_url="http://unused.invalid",
            similarity_threshold=0.3,
            **overrides,
        )
        check_layout(s.storage_dir, s.num_shards)
        pool = LocalShardPool([ShardService(s.storage_dir, 0, 1)])
        pools.append(pool)
        model = RecordingModel(window)
        svc = build_services(
            s,
            pool=pool,
            embedder=embedder,
            llm=model,
            embedding_model="all-MiniLM-L6-v2",
            embedding_tokenizer=embedder.model.tokenizer,
        )
        docs = [
            Document(doc_id="pump", text=PUMP, metadata={"title": "Zephyr X200 manual"}),
            Document(doc_id="light", text=LIGHT, metadata={"title": "Lumen L5 sheet"}),
        ]
        asyncio.run(svc.documents.add_documents("kb", docs))
        return svc, model

    yield make
    for pool in pools:
        pool.close()


def request(question: str, **body: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": question}], "index_name": "kb", "max_tokens": 32, **body}
    )


def collect(outcome: Any) -> list[ChatCompletionChunk]:
    async def run() -> list[ChatCompletionChunk]:
        return [c async for c in outcome.stream]

    return asyncio.run(run())


def test_a_rag_answer_carries_the_passage_that_holds_the_fact(build) -> None:
    svc, model = build()
    outcome = asyncio.run(svc.chat.complete(request(ANSWERED)))
    assert (outcome.mode, outcome.reason, model.calls) == ("rag", None, ["chat"])
    body = outcome.response
    assert body is not None and body.rag is not None and body.source_nodes
    assert body.rag.answerable is True
    best = body.rag.evidence[0]  # type: ignore[index]
    assert "3,200 litres per hour" in best.text
    source = body.source_nodes[best.source - 1]
    assert (source.doc_id, source.node_id) == ("pump", best.node_id)
    assert source.text[best.start : best.end] == best.text
    assert "evidence" in outcome.timings  # a Server-Timing stage


def test_a_stream_carries_the_evidence_on_its_first_and_final_chunks(build) -> None:
    svc, model = build()
    chunks = collect(asyncio.run(svc.chat.complete(request(ANSWERED, stream=True))))
    first = chunks[0]
    final = next(c for c in chunks if c.choices and c.choices[0].finish_reason)
    assert first.rag is not None and final.rag is not None
    assert first.rag.evidence and "3,200 litres per hour" in first.rag.evidence[0].text
    assert final.rag.evidence == first.rag.evidence
    assert model.calls == ["chat_stream"]


def test_a_question_the_documents_do_not_cover_is_answered_so_without_the_model(build) -> None:
    svc, model = build()
    outcome = asyncio.run(svc.chat.complete(request(NOT_IN_THE_DOCUMENTS)))
    assert (outcome.mode, outcome.reason) == ("rag", NOT_COVERED)
    assert model.calls == []
    body = outcome.response
    assert body is not None and body.rag is not None and body.source_nodes
    text = body.choices[0].message.content or ""
    assert text.startswith(NOT_COVERED_ANSWER)
    assert "Zephyr X200 manual" in text  # the closest sources, listed
    assert body.source_nodes[0].doc_id == "pump" and len(body.source_nodes) <= 3
    assert (body.rag.answerable, body.rag.evidence) == (False, [])


def test_a_streamed_question_the_documents_do_not_cover(build) -> None:
    svc, model = build()
    outcome = asyncio.run(
        svc.chat.complete(request(NOT_IN_THE_DOCUMENTS, stream=True, stream_options={"include_usage": True}))
    )
    chunks = collect(outcome)
    assert (outcome.reason, model.calls) == (NOT_COVERED, [])
    assert chunks[0].source_nodes and chunks[0].rag is not None and chunks[0].rag.answerable is False
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.startswith(NOT_COVERED_ANSWER)
    final = next(c for c in chunks if c.choices and c.choices[0].finish_reason)
    assert final.choices[0].finish_reason == "stop" and final.rag is not None and final.rag.answerable is False
    assert chunks[-1].usage is not None and not chunks[-1].choices


def test_answerability_off_lets_the_model_answer(build) -> None:
    svc, model = build(answerability=False)
    outcome = asyncio.run(svc.chat.complete(request(NOT_IN_THE_DOCUMENTS)))
    assert (outcome.mode, outcome.reason, model.calls) == ("rag", None, ["chat"])


def test_evidence_passages_zero_sends_none_and_the_rule_still_applies(build) -> None:
    svc, _ = build(evidence_passages=0)
    answered = asyncio.run(svc.chat.complete(request(ANSWERED))).response
    assert answered is not None and answered.rag is not None
    assert answered.rag.evidence is None and answered.rag.answerable is True
    outcome = asyncio.run(svc.chat.complete(request(NOT_IN_THE_DOCUMENTS)))
    assert outcome.reason == NOT_COVERED


def test_query_carries_evidence_or_says_not_covered(build) -> None:
    svc, model = build()
    answered = asyncio.run(svc.chat.query(QueryRequest(index_name="kb", query=ANSWERED)))
    assert answered.answerable is True and answered.evidence
    best = answered.evidence[0]
    assert "3,200 litres per hour" in best.text
    assert answered.source_nodes[best.source - 1].text[best.start : best.end] == best.text
    model.calls.clear()
    refused = asyncio.run(svc.chat.query(QueryRequest(index_name="kb", query=NOT_IN_THE_DOCUMENTS)))
    assert model.calls == []
    assert refused.answerable is False and refused.evidence == []
    assert refused.response.startswith(NOT_COVERED_ANSWER) and refused.source_nodes[0].doc_id == "pump"


def test_a_question_naming_what_no_source_mentions_is_not_covered(build) -> None:
    svc, model = build()
    # every other word is the pump manual's: only the name is missing
    outcome = asyncio.run(svc.chat.complete(request("How do I clean the impeller of the Zephyr X200 with Kärcher?")))
    assert (outcome.reason, model.calls) == (NOT_COVERED, [])
    outcome = asyncio.run(svc.chat.complete(request("How often should the impeller of the Zephyr X200 be cleaned?")))
    assert (outcome.reason, model.calls) == (None, ["chat"])


def test_the_best_evidence_is_repeated_before_the_question(build) -> None:
    svc, model = build()
    body = asyncio.run(svc.chat.complete(request(ANSWERED))).response
    assert body is not None and body.rag is not None and body.rag.evidence
    system = str(model.prompts[-1][0]["content"])
    best = body.rag.evidence[0]
    head, _, hint = system.rpartition(EVIDENCE_HEADING)
    lines = "\n".join(line.strip() for line in best.text.splitlines() if line.strip())
    assert head and hint.strip() == f"{lines} [{best.source}]"  # one passage, the best
    assert model.prompts[-1][-1] == {"role": "user", "content": ANSWERED}


def test_no_evidence_in_the_prompt_when_off_or_when_the_window_has_no_room(build) -> None:
    svc, model = build(evidence_in_prompt=0)
    asyncio.run(svc.chat.complete(request(ANSWERED)))
    assert EVIDENCE_HEADING not in str(model.prompts[-1][0]["content"])
    without = asyncio.run(svc.chat.complete(request(ANSWERED, max_tokens=16, top_k=1))).stats["prompt_tokens"]
    # the smallest window that takes the source and max_tokens: no room for three passages more
    window = without + 16
    while True:
        svc, model = build(window=window, evidence_in_prompt=3)
        try:
            outcome = asyncio.run(svc.chat.complete(request(ANSWERED, max_tokens=16, top_k=1, context_token_ratio=0.8)))
            break
        except ContextBudgetError:
            window += 8
    assert outcome.mode == "rag" and model.calls == ["chat"], outcome
    assert EVIDENCE_HEADING not in str(model.prompts[-1][0]["content"])
    assert outcome.stats["prompt_tokens"] == without and without + 16 <= window


def test_a_name_the_index_holds_elsewhere_is_not_what_refuses(build) -> None:
    # coverage 0 answers every question the names leave alone: only the name rule can refuse here
    svc, model = build(answerable_coverage=0.0)
    # one source (the pump's): "Lumen" is in the index (the light's sheet), only not retrieved
    outcome = asyncio.run(
        svc.chat.complete(request("How often is the impeller of the Zephyr X200 cleaned near a Lumen?", top_k=1))
    )
    assert outcome.response is not None and [n.doc_id for n in outcome.response.source_nodes] == ["pump"]
    assert (outcome.reason, model.calls) == (None, ["chat"])
    # a name in no document of the index
    outcome = asyncio.run(
        svc.chat.complete(request("How often is the impeller of the Zephyr X200 cleaned with a Kärcher?", top_k=1))
    )
    assert (outcome.reason, model.calls) == (NOT_COVERED, ["chat"])


def test_a_follow_up_is_judged_on_its_own_question_not_on_the_turn_before(build) -> None:
    svc, model = build()
    refused = "How do I connect the Zephyr X200 to a Tesla Powerwall?"
    first = asyncio.run(svc.chat.complete(request(refused)))
    assert first.reason == NOT_COVERED
    follow_up = ChatCompletionRequest.model_validate(
        {
            "index_name": "kb",
            "max_tokens": 32,
            "messages": [
                {"role": "user", "content": refused},
                {"role": "assistant", "content": NOT_COVERED_ANSWER},
                {"role": "user", "content": "And how often is its impeller cleaned?"},
            ],
        }
    )
    outcome = asyncio.run(svc.chat.complete(follow_up))
    assert outcome.rag is not None and outcome.rag.query_source == "followup"  # with the turn before's names
    assert (outcome.reason, model.calls) == (None, ["chat"])  # "Tesla Powerwall" was the turn before's


def test_the_repeated_passage_keeps_the_margin_of_estimated_counts(build) -> None:
    """The model's counter here estimates (chars/4): fit keeps a fifth of what sources and history
    may take as a margin, and the passage repeated before the question must fit inside the rest."""
    svc, model = build(evidence_in_prompt=0)
    base = asyncio.run(svc.chat.complete(request(ANSWERED, max_tokens=16, top_k=1)))
    without, context, history = (base.stats[k] for k in ("prompt_tokens", "context_tokens", "history_tokens"))
    fixed = without - context - history
    hinted = 0
    for window in range(without + 16, without + 16 + 600, 30):
        svc, model = build(window=window, evidence_in_prompt=3)
        try:
            outcome = asyncio.run(svc.chat.complete(request(ANSWERED, max_tokens=16, top_k=1, context_token_ratio=0.8)))
        except ContextBudgetError:
            continue
        if EVIDENCE_HEADING in str(model.prompts[-1][0]["content"]):
            hinted += 1
            assert outcome.stats["prompt_tokens"] - fixed <= int((window - fixed - 16) * 0.8), window
    assert hinted  # a window large enough takes it


def test_a_second_question_over_the_same_sources_embeds_no_window_again(build) -> None:
    """The evidence windows' vectors are cached by text (``PassageVectors``): the same sources
    answering another question cost no embedding, and the evidence found is the same as the
    first time (the vectors are the windows' own, not the first question's)."""
    svc, _ = build()
    first = asyncio.run(svc.chat.complete(request(ANSWERED))).response
    passages = svc.chat.passages
    assert passages is not None and len(passages) > 0 and passages.hits == 0
    embedded = passages.misses
    again = asyncio.run(svc.chat.complete(request(ANSWERED.upper()))).response
    assert passages.misses == embedded and passages.hits == embedded  # every window found, none embedded
    assert first is not None and again is not None and first.rag is not None and again.rag is not None
    assert [e.text for e in again.rag.evidence or []] == [e.text for e in first.rag.evidence or []]


def test_passage_cache_size_zero_embeds_every_time_with_the_same_evidence(build) -> None:
    svc, _ = build(passage_cache_size=0)
    first = asyncio.run(svc.chat.complete(request(ANSWERED))).response
    again = asyncio.run(svc.chat.complete(request(ANSWERED))).response
    passages = svc.chat.passages
    assert passages is not None and len(passages) == 0 and passages.hits == 0 and passages.misses > 0
    assert first is not None and again is not None and first.rag is not None and again.rag is not None
    assert [e.text for e in again.rag.evidence or []] == [e.text for e in first.rag.evidence or []]
