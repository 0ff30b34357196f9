"""``InProcessEmbedder``: the ``ragserve.ports.TextEmbedder`` seam over the real local embedding
model, in this process, with no Ray and no Embedder deployment in between.

The unit, UI and load smoke tests serve the in-process application (``ragserve.testing.inprocess``)
with it, and ``benchmarks/answer_quality.py`` does the same outside pytest: so it lives here, not in
tests/conftest.py, and imports no pytest.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from ragserve.models.embeddings import LocalEmbeddingModel


class InProcessEmbedder:
    """``ragserve.ports.TextEmbedder`` over the real local model, in this process. ``calls`` counts
    the ``embed_documents`` calls (tests assert on it)."""

    def __init__(self, model: LocalEmbeddingModel) -> None:
        self.model = model
        self.calls = 0

    async def embed_documents(self, texts: list[str]) -> np.ndarray:
        self.calls += 1
        return await asyncio.to_thread(self.model.encode, texts)

    async def embed_query(self, text: str) -> np.ndarray:
        return (await asyncio.to_thread(self.model.encode, [text]))[0]

    async def count_tokens(self, texts: list[str]) -> int:
        return await asyncio.to_thread(self.model.count_tokens, texts)  # seconds for 1 MB: off the loop
