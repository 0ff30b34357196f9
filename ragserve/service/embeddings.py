"""``/v1/embeddings``: the OpenAI embeddings API over the application's own embedder.

The vectors are the ones the index is built from (L2-normalised float32), so a client can compare
its own vectors with retrieval scores. ``dimensions`` truncates and re-normalises (the Matryoshka
convention OpenAI's ``text-embedding-3`` models follow); asking for more dimensions than the model
has is refused, not silently ignored.

Inputs are bounded as OpenAI bounds them: an input over ``max_embedding_input_tokens`` (8,192) or a
request over ``max_embedding_request_tokens`` (300,000 in all) is a 400 before anything is embedded
(a remote embedding model's server applies its own bounds instead: the counts here would be guesses).
Within that, the model reads only its first ``max_input_tokens`` of an input (256 for
all-MiniLM-L6-v2; sentence-transformers truncates the same way), and ``usage`` counts the tokens it
read, not the ones it cut.
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
        count_tokens: Callable[..., Awaitable[list[int]]],
        model: str,
        *,
        max_input_tokens: int | None = None,
        max_tokens_per_input: int = 8192,
        max_tokens_per_request: int = 300_000,
    ):
        """``count_tokens(texts, over=n, total_over=m)``: ``TextEmbedder.count_tokens``. ``max_input_tokens``: what the
        model reads of an input; None for a remote model, whose server bounds its inputs itself: the
        counts here are then estimates (characters / 4), for usage only, and no bound is applied."""
        self._embed = embed_texts
        self._count = count_tokens
        self.model = model
        self.max_input_tokens = max_input_tokens
        self.max_tokens_per_input = max_tokens_per_input
        self.max_tokens_per_request = max_tokens_per_request

    async def create(self, request: EmbeddingRequest) -> EmbeddingResponse:
        texts = request.inputs()
        if self.max_input_tokens is None:  # a remote model: it bounds its inputs; the counts here are estimates
            counts = await self._count(texts)
        else:
            counts = await self._count(texts, over=self.max_tokens_per_input, total_over=self.max_tokens_per_request)
            self._check(counts, isinstance(request.input, list))
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
        read = self.max_input_tokens
        tokens = sum(counts) if read is None else sum(min(n, read) for n in counts)
        data = [EmbeddingData(index=i, embedding=_encode(v, request.encoding_format)) for i, v in enumerate(vectors)]
        return EmbeddingResponse(data=data, model=self.model, usage=UsageInfo.of(tokens, 0))

    def _check(self, counts: list[int], listed: bool) -> None:
        """400 for an input over ``max_tokens_per_input`` (a count over it may be a prefix's, a
        lower bound: "at least") or a request over ``max_tokens_per_request``; ``counts`` stops at
        the first input over, or where the sum passed (``TextEmbedder.count_tokens``). A local
        model's exact counts only: ``max_input_tokens`` is known."""
        most = self.max_tokens_per_input
        for i, n in enumerate(counts):
            if n > most:
                where = f"input[{i}]" if listed else "input"
                raise BadRequestError(
                    f"{where} has at least {n:,} tokens; {self.model} accepts at most {most:,} an input "
                    f"(and reads the first {self.max_input_tokens:,}): split the text or shorten it",
                    param="input",
                )
        total = sum(counts)
        if total > self.max_tokens_per_request:
            raise BadRequestError(
                f"the inputs have at least {total:,} tokens in all; at most {self.max_tokens_per_request:,} are "
                "accepted in one request: send them in several",
                param="input",
            )


def _encode(vector: np.ndarray, encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode()
    values: list[float] = vector.tolist()
    return values
