"""``LocalEmbeddingModel`` runs a plain sentence-transformers model (transformer, pooling,
normalisation) with transformers alone: the vectors must be sentence-transformers' own."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from ragserve.models.embeddings import LocalEmbeddingModel, packaged_embedding_path, plain_pooling

TEXTS = [
    "What does the pump on line 3 report?",
    "",
    "a",
    "Shards restart on another node. " * 80,
    "Ünïcödé text, emojis 🙂 and numbers 12345.",
    "The warranty covers parts and labour for two years.",
]


def test_the_packaged_model_is_run_without_sentence_transformers(embedding_model) -> None:
    assert embedding_model.pooling == "mean" and embedding_model._st is None
    assert embedding_model.dim == 384 and embedding_model.max_seq_length == 256
    assert 20_000_000 < embedding_model.num_parameters < 30_000_000


@pytest.mark.parametrize("batch_size", [1, 4, 32])
def test_vectors_are_sentence_transformers_own(embedding_model, batch_size: int) -> None:
    reference = LocalEmbeddingModel(None, device="cpu", plain=False)
    assert reference._st is not None
    ours = embedding_model.encode(TEXTS, batch_size=batch_size)
    theirs = reference.encode(TEXTS, batch_size=batch_size)
    assert ours.shape == theirs.shape == (len(TEXTS), 384) and ours.dtype == np.float32
    assert np.abs(ours - theirs).max() < 1e-5
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)


def test_layouts_other_than_transformer_pooling_normalise_are_left_to_sentence_transformers(tmp_path: Path) -> None:
    src = packaged_embedding_path()
    assert plain_pooling(src) == "mean"

    def variant(modules: list[dict] | None = None, pooling: dict | None = None, lower: bool = False) -> Path:
        root = tmp_path / f"v{len(list(tmp_path.iterdir()))}"
        (root / "1_Pooling").mkdir(parents=True)
        (root / "modules.json").write_text(json.dumps(modules or json.loads((src / "modules.json").read_text())))
        (root / "1_Pooling" / "config.json").write_text(
            json.dumps(pooling or json.loads((src / "1_Pooling" / "config.json").read_text()))
        )
        (root / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 256, "do_lower_case": lower}))
        return root

    dense = [
        *json.loads((src / "modules.json").read_text()),
        {"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"},
    ]
    assert plain_pooling(variant()) == "mean"
    assert plain_pooling(variant(modules=dense)) is None
    assert plain_pooling(variant(pooling={"pooling_mode_cls_token": True})) == "cls"
    assert plain_pooling(variant(pooling={"pooling_mode_max_tokens": True})) is None
    assert plain_pooling(variant(pooling={"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": True})) is None
    assert plain_pooling(variant(lower=True)) is None
    assert plain_pooling(tmp_path / "missing") is None


@pytest.mark.parametrize("graph", ["traced", "optimized"])
def test_a_traced_query_model_gives_the_eager_vectors(embedding_model, graph: str) -> None:
    """The ingress's query copy runs as a traced graph: its vectors must be the eager model's for
    texts of every length (one token to past the truncation), alone and batched with padding."""
    traced = LocalEmbeddingModel(None, device="cpu", graph=graph)  # type: ignore[arg-type]
    assert traced.graph == graph and traced._graph is not None
    for batch_size in (1, 4):
        ours = traced.encode(TEXTS, batch_size=batch_size)
        eager = embedding_model.encode(TEXTS, batch_size=batch_size)
        assert np.abs(ours - eager).max() < 1e-5


class ShapeBranching(torch.nn.Module):
    """A stand-in transformer whose Python branches on its input's length: a trace records one
    branch, so the graph is wrong for texts of other lengths (what the probes exist to catch)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(30522, 8)

    def forward(self, input_ids, attention_mask, return_dict=False, **_):
        hidden = self.embed(input_ids)
        if input_ids.shape[1] > 4:  # recorded as a constant by the trace
            hidden = hidden * 2
        return SimpleNamespace(last_hidden_state=hidden) if return_dict else (hidden,)


def test_a_trace_that_disagrees_with_the_eager_model_is_refused(embedding_model, caplog) -> None:
    from ragserve.models.embeddings import _trace_forward

    assert _trace_forward(ShapeBranching(), embedding_model.tokenizer, optimize=False) is None
    assert "disagrees with the eager one" in caplog.text
    assert _trace_forward(embedding_model._transformer, embedding_model.tokenizer, optimize=False) is not None
