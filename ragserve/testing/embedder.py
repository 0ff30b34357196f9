"""``InProcessEmbedder``: the ``ragserve.ports.TextEmbedder`` seam over the real local embedding
model, in this process, with no Ray and no Embedder deployment in between.

The unit, UI and load smoke tests serve the in-process application (``ragserve.testing.inprocess``)
with it, and ``benchmarks/answer_quality.py`` does the same outside pytest: so it lives here, not in
tests/conftest.py, and imports no pytest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ragserve.hardware import usable_cores
from ragserve.models.embeddings import EncodeWorkers

if TYPE_CHECKING:
    from ragserve.models.embeddings import LocalEmbeddingModel


class InProcessEmbedder:
    """``ragserve.ports.TextEmbedder`` over the real local model, in this process. ``calls`` counts
    the ``embed_documents`` calls (tests assert on it).

    The model runs on workers of its own (``EncodeWorkers``, as in the Embedder deployment), queries
    before an ingestion's ``bulk`` batches, never on the event loop's default thread pool: the
    in-process shards and chunking run there, and a megabyte of document (minutes of encoding) on
    it held every other request's shard call behind its chunks."""

    def __init__(self, model: LocalEmbeddingModel, batch_size: int = 32) -> None:
        self.model = model
        self.batch_size = batch_size
        self.workers = EncodeWorkers(model, usable_cores())
        self.calls = 0

    async def embed_documents(self, texts: list[str], *, bulk: bool = False) -> np.ndarray:
        self.calls += 1
        return await self.workers.encode(texts, self.batch_size, bulk=bulk)

    async def embed_query(self, text: str) -> np.ndarray:
        return (await self.workers.run(self.model.encode, [text]))[0]

    async def count_tokens(
        self, texts: list[str], *, over: int | None = None, total_over: int | None = None
    ) -> list[int]:
        counts: list[int] = await self.workers.run(self.model.count_tokens, texts, over, total_over)  # off the loop
        return counts

    def close(self) -> None:
        """Stop the workers' threads (they also end when the embedder is collected)."""
        self.workers.close()
