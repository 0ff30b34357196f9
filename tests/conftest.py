"""Shared fixtures: the real packaged embedding model, loaded once per test session."""

from __future__ import annotations

import os
from collections.abc import Iterator

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


@pytest.fixture(scope="session", autouse=True)
def _no_heap_freeze_in_the_test_process() -> Iterator[None]:
    """A deployment's class built in this process (its replica's start) would freeze the test
    session's heap (``ragserve.heap.settle``): every application a later test drops would then keep
    its reference cycles. Servers in processes of their own (serve_process, Ray) still settle.
    Patched once, with a MonkeyPatch of its own: a test's ``monkeypatch`` must still be undone
    before that test's other fixtures tear down (a shard closed with its snapshot still faked)."""
    from ragserve import heap

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(heap, "settle", lambda role: 0)
        yield
