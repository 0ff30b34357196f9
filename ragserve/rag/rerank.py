"""Optional reranking: a cross-encoder (``ragserve.models.reranker``) reads the query and each fused
candidate together and reorders them before selection (setting ``reranker_model``).

Why optional: a cross-encoder is far more accurate than comparing two independent embeddings, but it
runs a transformer over every (query, candidate) pair on each request. On CPU that costs tens of
milliseconds per candidate batch, so it is off by default. The cosine ``score`` is left as it is
(thresholds keep their meaning); the reranker's own score is reported as ``rerank_score``.
"""

from __future__ import annotations

from collections.abc import Sequence

from ragserve.api.documents import NodeWithScore
from ragserve.ports import Reranker


async def rerank(reranker: Reranker, query: str, nodes: Sequence[NodeWithScore]) -> list[NodeWithScore]:
    """``nodes`` by the reranker's score, best first (ties keep the fused order), each with its
    ``rerank_score`` set."""
    scores = await reranker.score(query, [n.text for n in nodes])
    order = sorted(range(len(nodes)), key=lambda i: -scores[i])
    return [nodes[i].model_copy(update={"rerank_score": scores[i]}) for i in order]
