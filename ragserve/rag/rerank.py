"""Optional reranking: a cross-encoder reads the query and each fused candidate together and
reorders them before selection (setting ``reranker_model``).

Why optional: a cross-encoder is far more accurate than comparing two independent embeddings, but it
runs a transformer over every (query, candidate) pair on each request. On CPU that costs tens of
milliseconds per candidate batch, so it is off by default. The cosine ``score`` is left as it is
(thresholds keep their meaning); the reranker's own score is reported as ``rerank_score``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from ragserve.api.documents import NodeWithScore
from ragserve.ports import Reranker


class CrossEncoderReranker:
    """A sentence-transformers ``CrossEncoder`` loaded from a local path (nothing is downloaded:
    ``local_files_only``), run in a worker thread so the event loop stays free."""

    def __init__(self, model_path: str, device: str = "cpu", batch_size: int = 32):
        from sentence_transformers import CrossEncoder

        self.model: Any = CrossEncoder(model_path, device=device, local_files_only=True)
        self.batch_size = batch_size

    async def score(self, query: str, texts: list[str]) -> list[float]:
        if not texts:
            return []
        pairs = [(query, t) for t in texts]
        scores = await asyncio.to_thread(self.model.predict, pairs, batch_size=self.batch_size, show_progress_bar=False)
        return [float(s) for s in scores]


async def rerank(reranker: Reranker, query: str, nodes: Sequence[NodeWithScore]) -> list[NodeWithScore]:
    """``nodes`` by the reranker's score, best first (ties keep the fused order), each with its
    ``rerank_score`` set."""
    scores = await reranker.score(query, [n.text for n in nodes])
    order = sorted(range(len(nodes)), key=lambda i: -scores[i])
    return [nodes[i].model_copy(update={"rerank_score": scores[i]}) for i in order]
