"""Shared fixtures: the real packaged embedding model, loaded once per test session."""

from __future__ import annotations

import asyncio
import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


class InProcessEmbedder:
    """``ragserve.service.documents.Embedder`` over the real local model, in this process."""

    def __init__(self, model):
        self.model = model
        self.calls = 0

    async def embed_documents(self, texts: list[str]) -> np.ndarray:
        self.calls += 1
        return await asyncio.to_thread(self.model.encode, texts)

    async def embed_query(self, text: str) -> np.ndarray:
        return (await asyncio.to_thread(self.model.encode, [text]))[0]

    async def count_tokens(self, texts: list[str]) -> int:
        return sum(len(self.model.tokenizer.encode(t)) for t in texts)


@pytest.fixture(scope="session")
def embedding_model():
    from ragserve.models.embeddings import LocalEmbeddingModel

    return LocalEmbeddingModel(None, device="cpu")


@pytest.fixture
def embedder(embedding_model) -> InProcessEmbedder:
    return InProcessEmbedder(embedding_model)
