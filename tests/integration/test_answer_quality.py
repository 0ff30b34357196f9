"""What a user of the embedded default gets: answers from the sources, no echo of the prompt.

The real packaged Gemma 3 270M (TransformersEngine, default prompt format) behind the in-process
application (real shards and embedder, no Ray), asked through ``/v1/chat/completions``. The set is
``benchmarks/answer_quality.py``'s, which also measures it; greedy decoding makes the answers
repeatable, and the bound below leaves room for a small model's misses (it answered 8 of 8 when
written, against 0 of 8 with chat turns). Steps and lists (the benchmark's ``STEPS``) are answered
over several lines, still with nothing of the prompt after them.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from benchmarks.answer_quality import (
    FACTS,
    STEPS,
    STEPS_INDEX,
    ask,
    ask_facts,
    ask_steps,
    echoes_prompt,
    index_facts,
    index_steps,
)
from ragserve.models.transformers_engine import TransformersEngine
from ragserve.testing.embedder import InProcessEmbedder
from ragserve.testing.inprocess import inprocess_app

pytestmark = pytest.mark.slow

MODEL_CACHE = Path(__file__).resolve().parents[2] / "data" / "test-cache" / "models"
MIN_CORRECT = 6  # of 8
MIN_STEPS_COMPLETE = 3  # of 4 (4 of 4 when written: every step of each procedure, the whole list)

#: The README's "Try it" documents.
README_DOCS = [
    {
        "text": "Retrieval Augmented Generation (RAG) augments a large language model with an information retrieval "
        "system that provides grounding data.",
        "metadata": {"author": "Microsoft"},
    },
    {
        "text": "KAITO is a Kubernetes operator that automates AI and ML model inference and tuning workloads.",
        "metadata": {"author": "KAITO"},
    },
]


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory, embedding_model) -> Iterator[TestClient]:
    engine = TransformersEngine(None, MODEL_CACHE)
    asyncio.run(engine.start())
    try:
        with (
            inprocess_app(
                tmp_path_factory.mktemp("quality"),
                InProcessEmbedder(embedding_model),
                "http://unused.invalid",
                engine=engine,
            ) as (app, _),
            TestClient(app) as c,
        ):
            index_facts(c)
            index_steps(c)
            c.post("/index", json={"index_name": "rag_index", "documents": README_DOCS}).raise_for_status()
            yield c
    finally:
        asyncio.run(engine.stop())


def test_the_embedded_default_answers_single_fact_questions_from_its_sources(client: TestClient) -> None:
    answers = ask_facts(client)
    report = "\n".join(f"{a.fact.question} -> {a.text!r} ({a.seconds:.1f}s)" for a in answers)
    assert all(a.mode == "rag" for a in answers), report
    assert all(any(a.fact.document == s for s in a.sources) for a in answers), report  # source_nodes
    assert not [a.text for a in answers if echoes_prompt(a.text)], report
    assert sum(a.correct for a in answers) >= MIN_CORRECT, report
    assert all(a.finish_reason == "stop" and a.text.strip() for a in answers), report  # it ends by itself


def test_the_readme_example_answers_what_kaito_is(client: TestClient) -> None:
    body, mode, _ = ask(client, "What is KAITO?", index="rag_index")
    answer = body["choices"][0]["message"]["content"]
    assert mode == "rag" and "kubernetes" in answer.lower(), answer
    assert not echoes_prompt(answer), answer


def test_a_plain_question_without_an_index_is_answered_not_echoed(client: TestClient) -> None:
    body, mode, _ = ask(client, "What is the capital of France?", index=None)
    answer = body["choices"][0]["message"]["content"]
    assert mode == "passthrough"
    assert "paris" in answer.lower(), answer
    assert "capital of France?" not in answer and not echoes_prompt(answer), answer
    assert body["choices"][0]["finish_reason"] == "stop"


def ask_streamed(client: TestClient, question: str, index: str, max_tokens: int) -> list[dict]:
    """The chunks of a streamed chat completion (``ask``'s streamed twin), after a 200."""
    request = {
        "index_name": index,
        "max_tokens": max_tokens,
        "stream": True,
        "messages": [{"role": "user", "content": question}],
    }
    with client.stream("POST", "/v1/chat/completions", json=request) as r:
        assert r.status_code == 200
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]


def test_a_streamed_rag_answer_carries_its_sources_and_no_label(client: TestClient) -> None:
    fact = FACTS[1]
    whole, _, _ = ask(client, fact.question)
    chunks = ask_streamed(client, fact.question, "quality_check", 64)
    assert any(n["text"] == fact.document for n in chunks[0]["source_nodes"])
    pieces = [c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]]
    assert "".join(pieces) == whole["choices"][0]["message"]["content"]
    assert not any("\n" in p or "Question" in p for p in pieces)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_max_tokens_still_bounds_the_answer(client: TestClient) -> None:
    body, _, _ = ask(client, FACTS[0].question, max_tokens=3)
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 3


def test_steps_and_lists_are_answered_whole_over_several_lines_with_no_echo(client: TestClient) -> None:
    answers = ask_steps(client)
    report = "\n".join(
        f"{a.steps.question} -> {a.text!r} ({a.found}/{len(a.steps.keys)}, {a.seconds:.1f}s)" for a in answers
    )
    assert not [a.text for a in answers if echoes_prompt(a.text)], report
    assert all(a.finish_reason == "stop" and a.text.strip() for a in answers), report  # it ends by itself
    assert sum(a.complete for a in answers) >= MIN_STEPS_COMPLETE, report
    assert sum(a.text.count("\n") >= 2 for a in answers) >= 2, report  # not one line any more


def test_a_streamed_list_answer_is_the_whole_one_in_pieces_with_no_label(client: TestClient) -> None:
    steps = STEPS[0]
    whole, _, _ = ask(client, steps.question, index=STEPS_INDEX, max_tokens=160)
    chunks = ask_streamed(client, steps.question, STEPS_INDEX, 160)
    pieces = [c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]]
    answer = whole["choices"][0]["message"]["content"]
    assert "".join(pieces) == answer and "\n" in answer
    assert not any("Question" in p or "[1] (" in p for p in pieces)
