"""The cross-encoder behind the optional rerank step (``ragserve.rag.rerank``, setting
``reranker_model``): a ``Reranker`` (``ragserve.ports``) that loads weights, so it lives with the
other models."""

from __future__ import annotations

import asyncio
from typing import Any


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
