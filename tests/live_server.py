"""The in-process application (real shards, chunker and embedder; the fake OpenAI upstream as the
LLM) served by uvicorn on a loopback port in a thread: what the CLI, the browser and the client
libraries talk to over real HTTP in their tests."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from ragserve.testing.fake_openai import FakeOpenAI
from ragserve.testing.inprocess import inprocess_app


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serve(app: Any) -> Iterator[str]:
    """Serve ``app`` on 127.0.0.1 until the block ends; yields the base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.05)
    try:
        yield base
    finally:
        server.should_exit = True
        thread.join(timeout=10)


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
