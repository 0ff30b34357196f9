"""The in-process application (real shards, chunker and embedder; the fake OpenAI upstream as the
LLM) served by uvicorn on a loopback port in a thread: what the CLI, the browser and the client
libraries talk to over real HTTP in their tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from ragserve.testing.fake_openai import FakeOpenAI
from ragserve.testing.inprocess import inprocess_app
from ragserve.testing.live import free_port, serve

__all__ = ["free_port", "live_app", "serve"]


@contextmanager
def live_app(
    storage: Path, embedder: Any, *, answer: str = "The answer is in the sources [1].", **settings: Any
) -> Iterator[tuple[str, FakeOpenAI]]:
    """The whole application on a real socket; yields ``(base_url, fake_upstream)``."""
    with (
        FakeOpenAI(answer=answer, model="fake-model", max_model_len=4096) as fake,
        inprocess_app(storage, embedder, fake.url, **{"similarity_threshold": 0.0, **settings}) as (app, _),
        serve(app) as url,
    ):
        assert httpx.get(f"{url}/health").status_code == 200
        yield url, fake
