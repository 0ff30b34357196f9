"""Query embedding in the ingress (issue 13), without Ray: where queries are embedded, and the
in-process embedder's cache, micro-batching and delegation of documents."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from ragserve.service.query_embedding import (
    MAX_INGRESS_EMBEDDING_PARAMS,
    InProcessQueryEmbedder,
    choose_query_embedding,
)


class SlowModel:
    """Records every model call; each takes 30 ms, like a small encoder on a busy CPU."""

    tokenizer = None

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[list[str]] = []
        self.threads: set[str] = set()
        self.fail = fail

    def encode(self, texts: list[str], batch_size: int = 32) -> np.ndarray:
        self.calls.append(list(texts))
        self.threads.add(threading.current_thread().name)
        time.sleep(0.03)
        if self.fail:
            raise RuntimeError("model broke")
        return np.array([[float(len(t)), 1.0] for t in texts], dtype=np.float32)


class Deployment:
    """Stands in for the Embedder deployment's handle adapter."""

    def __init__(self) -> None:
        self.documents: list[list[str]] = []

    async def embed_documents(self, texts: list[str], *, bulk: bool = False) -> np.ndarray:
        self.documents.append(texts)
        return np.zeros((len(texts), 2), dtype=np.float32)

    async def count_tokens(
        self, texts: list[str], *, over: int | None = None, total_over: int | None = None
    ) -> list[int]:
        return [7] * len(texts)


@pytest.mark.parametrize(
    ("setting", "remote", "device", "params", "where"),
    [
        ("auto", False, "cpu", 22_700_000, "ingress"),  # all-MiniLM-L6-v2
        ("auto", False, "cpu", MAX_INGRESS_EMBEDDING_PARAMS + 1, "deployment"),
        ("auto", False, "cuda", 33_000_000, "deployment"),  # a GPU embedder
        ("auto", True, "remote", None, "deployment"),  # a remote /v1/embeddings
        ("ingress", False, "cuda", 400_000_000, "ingress"),  # asked for explicitly
        ("ingress", True, "remote", None, "deployment"),  # nothing to load
        ("deployment", False, "cpu", 22_700_000, "deployment"),
    ],
)
def test_where_queries_are_embedded(setting, remote: bool, device: str, params: int | None, where: str) -> None:
    assert choose_query_embedding(setting, remote=remote, device=device, params=params) == where


def test_a_query_alone_is_encoded_at_once_and_repeats_come_from_the_cache() -> None:
    model, lookups = SlowModel(), []
    emb = InProcessQueryEmbedder(model, Deployment(), on_lookup=lookups.append)

    async def run() -> None:
        t0 = time.perf_counter()
        first = await emb.embed_query("Where is  the PUMP?")
        assert time.perf_counter() - t0 < 0.5
        again = await emb.embed_query("where is the pump?")  # the same query, normalised
        assert np.array_equal(first, again)

    asyncio.run(run())
    assert model.calls == [["Where is  the PUMP?"]] and lookups == [False, True]
    assert model.threads == {"query-embed_0"}  # off the event loop, on the one encoder thread


def test_queries_arriving_while_the_encoder_is_busy_share_the_next_call() -> None:
    model = SlowModel()
    emb = InProcessQueryEmbedder(model, Deployment(), max_batch=4)

    async def run() -> list[np.ndarray]:
        first = asyncio.create_task(emb.embed_query("query "))
        await asyncio.sleep(0.01)  # the encoder is now busy with the first
        rest = await asyncio.gather(*(emb.embed_query(f"query {'x' * i}") for i in range(1, 9)))
        return [await first, *rest]

    vecs = asyncio.run(run())
    assert [v[0] for v in vecs] == [float(len(f"query {'x' * i}")) for i in range(9)]  # each its own vector
    assert [len(c) for c in model.calls] == [1, 4, 4]  # the first alone, the rest batched while busy


def test_a_caller_that_leaves_does_not_strand_the_others() -> None:
    model = SlowModel()
    emb = InProcessQueryEmbedder(model, Deployment())

    async def run() -> np.ndarray:
        first = asyncio.create_task(emb.embed_query("first"))
        await asyncio.sleep(0)
        second = asyncio.create_task(emb.embed_query("second"))
        await asyncio.sleep(0.005)
        first.cancel()
        return await asyncio.wait_for(second, timeout=2)

    assert asyncio.run(run())[0] == float(len("second"))


def test_a_model_failure_reaches_every_waiting_caller_and_the_next_query_works() -> None:
    model = SlowModel(fail=True)
    emb = InProcessQueryEmbedder(model, Deployment())

    async def run() -> list[object]:
        return await asyncio.gather(*(emb.embed_query(q) for q in ("a", "b", "c")), return_exceptions=True)

    assert all(isinstance(r, RuntimeError) for r in asyncio.run(run()))
    model.fail = False
    assert asyncio.run(emb.embed_query("a"))[0] == 1.0  # failures are not cached


def test_documents_and_token_counts_go_to_the_deployment() -> None:
    model, deployment = SlowModel(), Deployment()
    emb = InProcessQueryEmbedder(model, deployment)
    assert asyncio.run(emb.embed_documents(["d1", "d2"])).shape == (2, 2)
    assert asyncio.run(emb.count_tokens(["d1", "d2"])) == [7, 7]
    assert deployment.documents == [["d1", "d2"]] and model.calls == []
