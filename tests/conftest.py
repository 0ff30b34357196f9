"""Shared fixtures: the real packaged embedding model, loaded once per test session."""

from __future__ import annotations

import os

import pytest

from ragserve.testing.embedder import InProcessEmbedder

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def embedding_model():
    from ragserve.models.embeddings import LocalEmbeddingModel

    return LocalEmbeddingModel(None, device="cpu")


@pytest.fixture
def embedder(embedding_model) -> InProcessEmbedder:
    return InProcessEmbedder(embedding_model)
