"""Nothing a client sends blocks the ingress's event loop: while requests of the worst shapes are
processed (a 1 MB punctuation query to ``/retrieve`` in lexical and hybrid mode, a document of a
long run of "." to ``/index``, a 1 MB chat message), ``/health`` keeps answering within a second. Before, the query
parser's backtracking regex ran on the event loop and held it for tens of seconds; the sentence
splitter's held the GIL (so every thread, the loop's too) as long."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import numpy as np

from ragserve.testing.embedder import InProcessEmbedder
from tests.live_server import live_app

HEALTH_BOUND_S = 1.0
WORST_DOCUMENT = "." * 30_000 + "\n" * 960_000 + "x"


class ShortQueryEmbedder(InProcessEmbedder):
    """The real model, embedding a query's first 2000 characters only: it would truncate the query
    to its 256 tokens anyway, but only after tokenizing all of it (about 3 s of a worker thread for
    1 MB), which is the embedder's time, not what this test is about, and would make it slow."""

    async def embed_query(self, text: str) -> np.ndarray:
        return await super().embed_query(text[:2000])


def test_health_answers_while_worst_shape_requests_are_processed(tmp_path, embedding_model) -> None:
    with live_app(tmp_path, ShortQueryEmbedder(embedding_model)) as (url, _):
        r = httpx.post(
            f"{url}/index", json={"index_name": "kb", "documents": [{"text": "The pump is quiet."}]}, timeout=60
        )
        assert r.status_code == 200, r.text
        heavy: list[tuple[str, dict[str, Any]]] = [
            ("/retrieve", {"index_name": "kb", "query": "a" + "!" * 1_000_000 + "a", "retrieval_mode": "lexical"}),
            ("/retrieve", {"index_name": "kb", "query": "-" * 1_000_000 + "a pump", "retrieval_mode": "hybrid"}),
            # chunked (the splitter's worst shapes: a run of "." and a run of newlines), then the batch
            # is refused for its empty second document: nothing is embedded or stored
            ("/index", {"index_name": "kb", "documents": [{"text": WORST_DOCUMENT}, {"text": " "}]}),
            # a chat's messages are counted against the context window (and refused: too long for it)
            (
                "/v1/chat/completions",
                {"model": "fake-model", "messages": [{"role": "user", "content": "! " * 500_000}]},
            ),
        ]
        statuses: list[int] = []

        def send(path: str, body: dict[str, Any]) -> None:
            statuses.append(httpx.post(f"{url}{path}", json=body, timeout=120).status_code)

        workers = [threading.Thread(target=send, args=h) for h in heavy]
        for w in workers:
            w.start()
        slowest = 0.0
        with httpx.Client(timeout=30) as client:
            while any(w.is_alive() for w in workers):
                t0 = time.perf_counter()
                assert client.get(f"{url}/health").status_code == 200
                slowest = max(slowest, time.perf_counter() - t0)
                time.sleep(0.02)
        for w in workers:
            w.join()
        assert sorted(statuses) == [200, 200, 400, 400]
        assert slowest < HEALTH_BOUND_S, f"/health took {slowest:.2f} s while the heavy requests ran"
