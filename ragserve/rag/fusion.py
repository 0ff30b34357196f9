"""Hybrid fusion: dense and lexical candidates, from every shard, as one ranking.

Each candidate is scored ``w · dense + (1 − w) · lexical``:

* ``dense``: its cosine similarity to the query, min-max scaled over the candidates (the best 1,
  the worst 0), so the weight means the same for every embedding model's range of cosines;
* ``lexical``: when the lexical search found it, the share of the query's information its text
  holds (``lexical_coverage``: its terms weighed by IDF, ``ragserve.store.search.term_weights``),
  else 0. A chunk sharing one common word with a long question holds little of it; one that
  names the rare part number or annotation asked for holds most of it.

Why not reciprocal rank fusion (the first version): it credits the k-th lexical hit the same
whether it holds the question's rarest terms or one common word, and ranks alone cannot say which
list is sure of itself. On long questions that lost most of BM25's gain (docs/quality.md: CISI,
76 questions of 21 content words on median). Scores make the strength of each side count.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from ragserve.api.documents import NodeWithScore

if TYPE_CHECKING:  # the store's record type only: importing the store would load FAISS with the prompt code
    from ragserve.store.types import SearchHit


@dataclass(frozen=True)
class FusionOptions:
    """How dense and lexical candidates become one ranking (settings ``hybrid_dense_weight`` and
    ``lexical_match_min_terms``)."""

    dense_weight: float = 0.6
    match_min_terms: int | None = 2

    def __post_init__(self) -> None:
        if not 0.0 <= self.dense_weight <= 1.0:
            raise ValueError("dense_weight must be within [0, 1]")


#: A candidate's identity: its index and node id (a node id is unique only within its index).
Key = tuple[str, str]


def fused_scores(
    dense: Mapping[Key, SearchHit], lexical: Mapping[Key, SearchHit], dense_weight: float
) -> dict[Key, float]:
    """Every candidate's fused score ((index, node id) → score), ``dense`` and ``lexical`` being the
    candidates each list found, by key, best first (a node may be in both). With one list empty
    the other's own order holds: the dense one by cosine, the lexical one by BM25 (its rank,
    scaled into [0, 1])."""
    if not lexical:
        return _scaled({i: h.score for i, h in dense.items()})
    if not dense:
        n = len(lexical)
        return {i: 1.0 - rank / n for rank, i in enumerate(lexical)}
    cosines = _scaled({**{i: h.score for i, h in dense.items()}, **{i: h.score for i, h in lexical.items()}})
    found = {i: h.lexical_coverage or 0.0 for i, h in lexical.items()}
    return {i: dense_weight * c + (1.0 - dense_weight) * found.get(i, 0.0) for i, c in cosines.items()}


def _scaled(scores: dict[Key, float]) -> dict[Key, float]:
    """``scores`` min-max scaled into [0, 1] (all 1 when they are equal). A score that is not
    finite (the cosine of a vector holding NaN or inf) is 0, the worst, and the others are scaled
    among themselves: as a minimum NaN would make every score equal, and as a sort key scramble
    the order."""
    finite = [s for s in scores.values() if math.isfinite(s)]
    if not finite:
        return dict.fromkeys(scores, 0.0)
    lo, hi = min(finite), max(finite)
    return {i: ((s - lo) / (hi - lo) if hi > lo else 1.0) if math.isfinite(s) else 0.0 for i, s in scores.items()}


def fuse_candidates(
    dense: Iterable[Sequence[SearchHit]],
    lexical: Iterable[Sequence[SearchHit]],
    top: int,
    options: FusionOptions,
    query_terms: int,
) -> list[NodeWithScore]:
    """The top ``top`` nodes of every shard's candidates, fused (``fused_scores``); of every index
    searched too, when one query spans several (each hit names its index).

    Each list is first merged across shards (and indexes) by its own score (cosine scores compare
    across shards and indexes, one model having embedded them all; BM25 scores and coverages nearly
    do, each shard's statistics being a sample of its index). Every node keeps its cosine ``score``,
    gains ``fused_score``, ``lexical_coverage``, the ``sources`` that found it and the
    ``index_name`` it is from, and ``keyword_match`` when it contains every term of the query and
    the query holds at least ``options.match_min_terms`` tokens (``query_terms``). Ties keep the
    dense list's order, then the lexical one's."""
    dense_hits = _merged(dense, lambda h: h.score if math.isfinite(h.score) else -math.inf)  # NaN: last
    lexical_hits = _merged(lexical, lambda h: h.lexical_score or 0.0)
    scores = fused_scores(dense_hits, lexical_hits, options.dense_weight)
    hits = {**lexical_hits, **dense_hits}  # of a node both found, the dense list's record
    order = {key: n for n, key in enumerate({**dense_hits, **lexical_hits})}
    found_by: list[tuple[Literal["dense", "lexical"], dict[Key, SearchHit]]] = [
        ("dense", dense_hits),
        ("lexical", lexical_hits),
    ]
    matches = options.match_min_terms is not None and query_terms >= options.match_min_terms
    nodes = []
    for key in sorted(scores, key=lambda i: (-scores[i], order[i]))[:top]:
        h = hits[key]
        nodes.append(
            NodeWithScore(
                doc_id=h.doc_id,
                node_id=h.node_id,
                text=h.text,
                score=float(h.score),
                index_name=h.index or None,
                metadata=dict(h.metadata),
                fused_score=scores[key],
                lexical_coverage=h.lexical_coverage,
                sources=[name for name, keys in found_by if key in keys],
                keyword_match=bool(matches and h.all_terms),
            )
        )
    return nodes


def _merged(lists: Iterable[Sequence[SearchHit]], key: Callable[[SearchHit], float]) -> dict[Key, SearchHit]:
    """Every shard's (and index's) hits by their key, best first by ``key``, each node once."""
    first: dict[Key, SearchHit] = {}
    for h in sorted((h for part in lists for h in part), key=key, reverse=True):
        first.setdefault((h.index, h.node_id), h)
    return first
