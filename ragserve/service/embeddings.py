"""``/v1/embeddings``: the OpenAI embeddings API over the application's own embedder.

The vectors are the ones the index is built from (L2-normalised float32), so a client can compare
its own vectors with retrieval scores. ``dimensions`` truncates and re-normalises (the Matryoshka
convention OpenAI's ``text-embedding-3`` models follow); asking for more dimensions than the model
has is refused, not silently ignored.
"""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable

import numpy as np

from ragserve.api.openai import EmbeddingData, EmbeddingRequest, EmbeddingResponse, UsageInfo
from ragserve.errors import BadRequestError


class EmbeddingService:
    def __init__(
        self,
        embed_texts: Callable[[list[str]], Awaitable[np.ndarray]],
        count_tokens: Callable[[list[str]], Awaitable[int]],
        model: str,
    ):
        self._embed = embed_texts
        self._count = count_tokens
        self.model = model

    async def create(self, request: EmbeddingRequest) -> EmbeddingResponse:
        texts = request.inputs()
        vectors = np.asarray(await self._embed(texts), dtype=np.float32)
        size = vectors.shape[1] if vectors.ndim == 2 else 0
        if request.dimensions is not None:
            if request.dimensions > size:
                raise BadRequestError(
                    f"dimensions must be at most {size} for {self.model}, got {request.dimensions}", param="dimensions"
                )
            vectors = vectors[:, : request.dimensions]
            norms = np.linalg.norm(vectors, axis=1, keepdims=True)
            vectors = (vectors / np.where(norms == 0, 1.0, norms)).astype(np.float32)
        tokens = await self._count(texts)
        data = [EmbeddingData(index=i, embedding=_encode(v, request.encoding_format)) for i, v in enumerate(vectors)]
        return EmbeddingResponse(data=data, model=self.model, usage=UsageInfo.of(tokens, 0))


def _encode(vector: np.ndarray, encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode()
    values: list[float] = vector.tolist()
    return values
