"""Reranking with a cross-encoder built here (a tiny BERT with random weights and MiniLM's
tokenizer, saved to a temporary folder): nothing is downloaded. Its scores mean nothing, so the
tests check the mechanics: the fused candidates come back in the cross-encoder's order, each with
its ``rerank_score``, the cosine ``score`` and the threshold untouched, over HTTP too."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from ragserve.api.documents import NodeWithScore
from ragserve.models.reranker import CrossEncoderReranker
from ragserve.rag.rerank import rerank
from ragserve.testing.fake_openai import FakeOpenAI
from ragserve.testing.inprocess import inprocess_app


@pytest.fixture(scope="module")
def cross_encoder_dir(tmp_path_factory, embedding_model) -> Path:
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    tokenizer = embedding_model.tokenizer
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
        num_labels=1,
    )
    path = tmp_path_factory.mktemp("cross-encoder")
    BertForSequenceClassification(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def node(i: int, text: str) -> NodeWithScore:
    return NodeWithScore(doc_id=f"d{i}", node_id=f"d{i}-0", text=text, score=0.1 * i, fused_score=1.0 / (60 + i))


async def test_rerank_orders_by_the_cross_encoders_scores(cross_encoder_dir: Path) -> None:
    reranker = CrossEncoderReranker(str(cross_encoder_dir))
    nodes = [
        node(i, t)
        for i, t in enumerate(["pumps move water", "lamps give light", "seals stop leaks", "valves shut lines"])
    ]
    expected = reranker.model.predict([("how do pumps work", n.text) for n in nodes])
    out = await rerank(reranker, "how do pumps work", nodes)
    assert [n.rerank_score for n in out] == sorted((float(s) for s in expected), reverse=True)
    assert {n.node_id: n.score for n in out} == {n.node_id: n.score for n in nodes}  # cosine kept
    assert await rerank(reranker, "q", []) == []


@pytest.fixture
def client(tmp_path, embedder, cross_encoder_dir: Path) -> Iterator[TestClient]:
    with (
        FakeOpenAI() as fake,
        inprocess_app(tmp_path, embedder, fake.url, reranker_model=str(cross_encoder_dir)) as (app, _),
        TestClient(app) as c,
    ):
        docs = [{"text": f"Document {i} about pumps, valves and seals number {i}."} for i in range(12)]
        assert c.post("/index", json={"index_name": "kb", "documents": docs}).status_code == 200
        yield c


def test_retrieve_over_http_returns_the_reranked_top_k(client: TestClient) -> None:
    r = client.post("/retrieve", json={"index_name": "kb", "query": "pump seals", "max_node_count": 4})
    assert r.status_code == 200, r.text
    nodes = r.json()["results"]
    assert len(nodes) == 4
    scores = [n["rerank_score"] for n in nodes]
    assert scores == sorted(scores, reverse=True)
    assert "rerank;dur=" in r.headers["server-timing"]
    strict = client.post(
        "/retrieve", json={"index_name": "kb", "query": "pump", "max_node_count": 4, "similarity_threshold": 0.99}
    ).json()
    assert strict["results"] == []  # the threshold still reads the cosine score (one word: no keyword match)
