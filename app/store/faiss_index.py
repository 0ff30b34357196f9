"""FAISS indexes of a shard: construction, and snapshots for a fast restart.

FAISS is derived state: it can always be rebuilt from SQLite. A snapshot saves the rebuild; its
sidecar records the change-log sequence number it includes, so a restart loads it and replays
only the changes after it.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import faiss
import numpy as np

SUPPORTED_KINDS = ("flat",)


def make_faiss_index(dim: int, kind: str = "flat", **params: Any) -> Any:
    """An id-mapped inner-product index (cosine on normalised vectors). ``flat`` is exact."""
    if kind != "flat":
        raise ValueError(f"unknown faiss index kind {kind!r}; supported: {', '.join(SUPPORTED_KINDS)}")
    if params:
        raise ValueError(f"the flat index takes no parameters, got {sorted(params)}")
    return faiss.IndexIDMap2(faiss.IndexFlatIP(dim))


def vectors_from_blobs(blobs: list[bytes], dim: int) -> np.ndarray:
    if not blobs:
        return np.zeros((0, dim), dtype=np.float32)
    return np.frombuffer(b"".join(blobs), dtype=np.float32).reshape(len(blobs), dim)


def _file_stem(index: str) -> str:
    # index names may hold any character; file names must not
    return hashlib.sha1(index.encode("utf-8")).hexdigest()[:20]


def snapshot_paths(directory: Path, index: str) -> tuple[Path, Path]:
    stem = _file_stem(index)
    return directory / f"{stem}.faiss", directory / f"{stem}.json"


def save_snapshot(directory: Path, index: str, faiss_index: Any, seq: int) -> None:
    """Write index then sidecar, each atomically (tmp + fsync + rename)."""
    directory.mkdir(parents=True, exist_ok=True)
    data_path, meta_path = snapshot_paths(directory, index)
    tmp = data_path.with_suffix(".faiss.tmp")
    faiss.write_index(faiss_index, str(tmp))
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    tmp.replace(data_path)
    meta_tmp = meta_path.with_suffix(".json.tmp")
    with open(meta_tmp, "w") as f:
        json.dump({"index": index, "seq": seq, "ntotal": int(faiss_index.ntotal), "file": data_path.name}, f)
        f.flush()
        os.fsync(f.fileno())
    meta_tmp.replace(meta_path)


def load_snapshot(directory: Path, index: str, dim: int) -> tuple[Any, int] | None:
    """(index, seq) or None when there is no usable snapshot (missing, torn, other dimension)."""
    data_path, meta_path = snapshot_paths(directory, index)
    try:
        meta = json.loads(meta_path.read_text())
        if meta.get("index") != index:
            return None
        loaded = faiss.read_index(str(data_path))
    except (OSError, ValueError, RuntimeError):
        return None
    if loaded.d != dim or loaded.ntotal != meta.get("ntotal"):
        return None
    return loaded, int(meta["seq"])


def remove_snapshot(directory: Path, index: str) -> None:
    for p in snapshot_paths(directory, index):
        p.unlink(missing_ok=True)
