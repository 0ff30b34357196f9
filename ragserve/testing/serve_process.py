"""The in-process application (``ragserve.testing.inprocess``: real shards, MiniLM, the job runner;
an upstream LLM that is never called unless asked) served by uvicorn in a process of its own, so a
test or a benchmark can kill it (SIGKILL, no shutdown) and start it again on the same storage.

    python -m ragserve.testing.serve_process STORAGE_DIR PORT [SETTING=VALUE ...]

Wait for ``/health`` to answer before using it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(argv: list[str]) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import uvicorn

    from ragserve import heap
    from ragserve.models.embeddings import LocalEmbeddingModel
    from ragserve.testing.embedder import InProcessEmbedder
    from ragserve.testing.inprocess import inprocess_app

    storage, port = Path(argv[0]), int(argv[1])
    settings = {}
    for pair in argv[2:]:
        key, _, value = pair.partition("=")
        settings[key] = json.loads(value)
    embedder = InProcessEmbedder(LocalEmbeddingModel(None, device="cpu"))
    llm_url = settings.pop("llm_url", "http://127.0.0.1:9/v1")
    with inprocess_app(storage, embedder, llm_url, **settings) as (app, _):
        heap.settle("serve_process")  # a serving process, as the deployments' replicas
        uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")).run()


if __name__ == "__main__":
    main(sys.argv[1:])
