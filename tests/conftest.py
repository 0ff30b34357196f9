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


#: Tests that start nothing shared with their module's other tests: each runs a subprocess of its
#: own, so pytest-xdist may send them to any worker.
SPREAD = {"test_benchmark_smoke_prints_its_table"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist's ``--dist loadgroup`` (``make test``): a module's tests go to one worker
    together, since a module-scoped fixture (a Ray cluster, a deployed application, a loaded
    model) is made once per worker that runs any of its tests; the tests in ``SPREAD`` go wherever a
    worker is free. Without xdist the marks do nothing."""
    for item in items:
        if item.get_closest_marker("xdist_group") is None and getattr(item, "originalname", None) not in SPREAD:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))
