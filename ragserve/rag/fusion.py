"""Reciprocal rank fusion: merge several rankings (dense, keyword, shards) without comparing scores."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from ragserve.api.documents import NodeWithScore

if TYPE_CHECKING:  # the store's record type only: importing the store would load FAISS with the prompt code
    from ragserve.store.types import SearchHit


def reciprocal_rank_fusion(
    rankings: Sequence[Sequence[str]], k: int = 60, weights: Sequence[float] | None = None
) -> list[tuple[str, float]]:
    """Each id scores sum(w / (k + rank)) over the rankings it appears in (rank from 1); best first,
    ties broken by first appearance."""
    if k < 0:
        raise ValueError("k must be >= 0")
    if weights is not None and len(weights) != len(rankings):
        raise ValueError("one weight per ranking")
    scores: dict[str, float] = {}
    for r, ranking in enumerate(rankings):
        w = 1.0 if weights is None else weights[r]
        for rank, item in enumerate(dict.fromkeys(ranking), start=1):
            scores[item] = scores.get(item, 0.0) + w / (k + rank)
    order = {item: i for i, item in enumerate(scores)}
    return sorted(scores.items(), key=lambda kv: (-kv[1], order[kv[0]]))


@dataclass(frozen=True)
class FusionOptions:
    """How dense and lexical candidates become one ranking (settings ``rrf_*`` and
    ``lexical_match_min_terms``)."""

    k: int = 60
    dense_weight: float = 1.0
    lexical_weight: float = 1.0
    match_min_terms: int | None = 2


def fuse_candidates(
    dense: Iterable[Sequence[SearchHit]],
    lexical: Iterable[Sequence[SearchHit]],
    top: int,
    options: FusionOptions,
    query_terms: int,
) -> list[NodeWithScore]:
    """The top ``top`` nodes of every shard's candidates, fused.

    Each modality is first merged across shards by its own score (cosine scores compare across
    shards; BM25 scores nearly do, each shard's statistics being a sample of the same corpus), then
    the two rankings are fused by reciprocal rank fusion, which needs no comparable scales between
    them. Every node keeps its cosine ``score``, gains ``fused_score`` and the ``sources`` that
    found it, and ``keyword_match`` when it contains every term of the query and the query holds at
    least ``options.match_min_terms`` tokens (``query_terms``). With one modality the order is that
    modality's own."""
    hits: dict[str, SearchHit] = {}
    rankings: list[list[str]] = []
    weights: list[float] = []
    names: list[Literal["dense", "lexical"]] = []
    modalities: list[
        tuple[Literal["dense", "lexical"], Iterable[Sequence[SearchHit]], Callable[[SearchHit], float], float]
    ] = [
        ("dense", dense, lambda h: h.score, options.dense_weight),
        ("lexical", lexical, lambda h: h.lexical_score or 0.0, options.lexical_weight),
    ]
    for name, lists, key, weight in modalities:
        merged = sorted((h for part in lists for h in part), key=key, reverse=True)
        if not merged:
            continue
        for h in merged:
            hits.setdefault(h.node_id, h)
        rankings.append([h.node_id for h in merged])
        weights.append(weight)
        names.append(name)
    found_by = [set(r) for r in rankings]
    matches = options.match_min_terms is not None and query_terms >= options.match_min_terms
    nodes = []
    for node_id, fused in reciprocal_rank_fusion(rankings, options.k, weights)[:top]:
        h = hits[node_id]
        nodes.append(
            NodeWithScore(
                doc_id=h.doc_id,
                node_id=h.node_id,
                text=h.text,
                score=float(h.score),
                metadata=dict(h.metadata),
                fused_score=fused,
                sources=[n for n, ids in zip(names, found_by, strict=True) if node_id in ids],
                keyword_match=bool(matches and h.all_terms),
            )
        )
    return nodes
