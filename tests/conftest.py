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


@pytest.fixture(autouse=True)
def _no_heap_freeze_in_the_test_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """A deployment's class built in this process (its replica's start) would freeze the test
    session's heap (``ragserve.heap.settle``): every application a later test drops would then keep
    its reference cycles. Servers in processes of their own (serve_process, Ray) still settle."""
    from ragserve import heap

    monkeypatch.setattr(heap, "settle", lambda role: 0)
