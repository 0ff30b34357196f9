"""FAISS indexes of a shard: construction, and snapshots for a fast restart.

FAISS is derived state: it can always be rebuilt from SQLite. A snapshot saves the rebuild; its
sidecar records the change-log sequence number it includes, so a restart loads it and replays
only the changes after it.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from ragserve.api.index_spec import IndexSpec

#: Queries at most this many rows are searched by the calling thread alone. A server searches one
#: query a request, many requests at once, across shards: the cores are busy with other searches
#: and requests, and an OpenMP team started for one small search then spends more in its barrier
#: than in the search (one query over 1,000 384-d vectors: 5 ms with two threads on a two-core
#: machine doing other work, 0.07 ms with one; over 20,000: 22 against 2.4 ms). Larger batches (a
#: rebuild's, an evaluation's) keep FAISS's threads.
SINGLE_THREAD_QUERIES = 8


@contextmanager
def omp_threads(n: int) -> Iterator[None]:
    """Run FAISS's OpenMP regions that this thread starts on ``n`` threads, then restore its
    setting. OpenMP keeps the setting per thread, so concurrent searches on other threads are not
    affected."""
    before = faiss.omp_get_max_threads()
    if before == n:
        yield
        return
    faiss.omp_set_num_threads(n)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(before)


def vectors_from_blobs(blobs: list[bytes], dim: int) -> np.ndarray:
    if not blobs:
        return np.zeros((0, dim), dtype=np.float32)
    return np.frombuffer(b"".join(blobs), dtype=np.float32).reshape(len(blobs), dim)


class VectorIndex:
    """One index's vectors in FAISS, whatever the kind: add, remove, search, and when to rebuild.

    The shard owns persistence (SQLite is the truth); this class owns what each FAISS kind needs:
    IVF's training (flat until enough vectors, retrained as it grows) and HNSW's deletions (masked
    at search time until a rebuild drops them).
    """

    def __init__(
        self,
        dim: int,
        spec: IndexSpec,
        index: Any | None = None,
        *,
        trained_size: int = 0,
        deleted: set[int] | None = None,
    ):
        self.dim = dim
        self.spec = spec
        self.index = index if index is not None else self._empty()
        self.trained_size = trained_size  # IVF: vectors it was trained on; 0 while still flat
        self.deleted: set[int] = deleted or set()  # HNSW: removed ids still in the graph

    def _empty(self) -> Any:
        if self.spec.kind == "hnsw":
            graph = faiss.IndexHNSWFlat(self.dim, self.spec.m, faiss.METRIC_INNER_PRODUCT)
            graph.hnsw.efConstruction = self.spec.ef_construction
            return faiss.IndexIDMap2(graph)
        return faiss.IndexIDMap2(faiss.IndexFlatIP(self.dim))  # flat, and IVF until it is trained

    @property
    def ntotal(self) -> int:
        """Live vectors (masked HNSW deletions excluded)."""
        return int(self.index.ntotal) - len(self.deleted)

    @property
    def is_ivf(self) -> bool:
        return self.trained_size > 0

    @property
    def gpu_mirrorable(self) -> bool:
        """Flat indexes copy to the GPU as they are; IVF and HNSW are searched on the CPU."""
        return self.spec.kind == "flat"

    def ids(self) -> np.ndarray:
        """The ids of the live vectors (masked HNSW deletions excluded), one entry per vector: what
        the shard's self-check compares with its chunk rows."""
        index = self.index
        if hasattr(index, "id_map"):
            found = faiss.vector_to_array(index.id_map).astype(np.int64)
        else:  # a trained IVF index keeps its ids in the inverted lists
            ivf = faiss.extract_index_ivf(index)
            lists = ivf.invlists
            found = np.concatenate(
                [np.zeros(0, dtype=np.int64)]
                + [
                    faiss.rev_swig_ptr(lists.get_ids(i), lists.list_size(i)).astype(np.int64).copy()
                    for i in range(ivf.nlist)
                    if lists.list_size(i)
                ]
            )
        if self.deleted:
            found = found[~np.isin(found, np.fromiter(self.deleted, dtype=np.int64))]
        return found

    # --- writes -------------------------------------------------------------------------------
    def add(self, vectors: np.ndarray, ids: np.ndarray) -> None:
        self.index.add_with_ids(np.ascontiguousarray(vectors, dtype=np.float32), np.asarray(ids, dtype=np.int64))

    def remove(self, ids: list[int] | np.ndarray) -> None:
        if self.spec.kind == "hnsw":
            self.deleted.update(int(i) for i in ids)
        else:
            self.index.remove_ids(np.asarray(ids, dtype=np.int64))

    def wants_training(self, n: int) -> bool:
        return self.spec.kind == "ivf" and n >= self.spec.training_threshold()

    def train(self, sample: np.ndarray, n: int) -> None:
        """Turn an empty index into a trained IVF index sized for ``n`` vectors."""
        if self.index.ntotal:
            raise ValueError("train an empty index; rebuild to retrain")
        nlist = self.spec.lists_for(n)
        quantizer = faiss.IndexFlatIP(self.dim)
        ivf = faiss.IndexIVFFlat(quantizer, self.dim, nlist, faiss.METRIC_INNER_PRODUCT)
        ivf.train(np.ascontiguousarray(sample, dtype=np.float32))
        ivf.nprobe = self.spec.probes_for(nlist)
        self.index = ivf
        self.trained_size = n

    def needs_rebuild(self) -> bool:
        if self.spec.kind == "ivf":
            if not self.is_ivf:
                return self.wants_training(self.ntotal)
            return self.ntotal > self.spec.retrain_growth * self.trained_size
        if self.spec.kind == "hnsw" and self.deleted:
            return len(self.deleted) > self.spec.max_deleted_ratio * self.index.ntotal
        return False

    # --- reads --------------------------------------------------------------------------------
    def search(self, query: np.ndarray, k: int, allowed: list[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Top ``k`` (scores, ids) for one or more queries; ``allowed`` restricts the ids scored."""
        live = self.ntotal
        if live == 0 or k < 1:
            n = len(query)
            return np.zeros((n, 0), dtype=np.float32), np.zeros((n, 0), dtype=np.int64)
        selector = masked = None  # both stay referenced until the search returns (FAISS keeps raw pointers)
        if allowed is not None:
            keep = [i for i in allowed if i not in self.deleted] if self.deleted else allowed
            if not keep:
                n = len(query)
                return np.zeros((n, 0), dtype=np.float32), np.zeros((n, 0), dtype=np.int64)
            selector = faiss.IDSelectorBatch(np.asarray(keep, dtype=np.int64))
        elif self.deleted:
            masked = faiss.IDSelectorBatch(np.asarray(sorted(self.deleted), dtype=np.int64))
            selector = faiss.IDSelectorNot(masked)
        k = min(k, live)
        if self.spec.kind == "hnsw":
            params = faiss.SearchParametersHNSW(efSearch=max(self.spec.ef_search, k), sel=selector)
        elif self.is_ivf:
            params = faiss.SearchParametersIVF(nprobe=self.spec.probes_for(self.index.nlist), sel=selector)
        else:
            params = faiss.SearchParameters(sel=selector) if selector is not None else None
        rows = np.ascontiguousarray(query, dtype=np.float32)
        if len(rows) > SINGLE_THREAD_QUERIES:
            return self.index.search(rows, k, params=params)
        with omp_threads(1):
            return self.index.search(rows, k, params=params)

    # --- snapshots ----------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """What a snapshot's sidecar must record besides the FAISS file."""
        return {"kind": self.spec.kind, "trained_size": self.trained_size, "deleted": sorted(self.deleted)}


def _file_stem(index: str) -> str:
    # index names may hold any character; file names must not
    return hashlib.sha1(index.encode("utf-8")).hexdigest()[:20]


def snapshot_paths(directory: Path, index: str) -> tuple[Path, Path]:
    stem = _file_stem(index)
    return directory / f"{stem}.faiss", directory / f"{stem}.json"


def save_snapshot(directory: Path, index: str, vectors: VectorIndex, seq: int) -> None:
    """Write index then sidecar, each atomically (tmp + fsync + rename)."""
    faiss_index = vectors.index
    directory.mkdir(parents=True, exist_ok=True)
    data_path, meta_path = snapshot_paths(directory, index)
    tmp = data_path.with_suffix(".faiss.tmp")
    faiss.write_index(faiss_index, str(tmp))
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    tmp.replace(data_path)
    meta_tmp = meta_path.with_suffix(".json.tmp")
    with open(meta_tmp, "w") as f:
        json.dump(
            {"index": index, "seq": seq, "ntotal": int(faiss_index.ntotal), "file": data_path.name, **vectors.state()},
            f,
        )
        f.flush()
        os.fsync(f.fileno())
    meta_tmp.replace(meta_path)


def load_snapshot(directory: Path, index: str, dim: int, spec: IndexSpec) -> tuple[VectorIndex, int] | None:
    """(vectors, seq) or None when there is no usable snapshot (missing, torn, other dimension, or
    another index kind than the one configured now: then the shard rebuilds in the new kind)."""
    data_path, meta_path = snapshot_paths(directory, index)
    try:
        meta = json.loads(meta_path.read_text())
        if meta.get("index") != index or meta.get("kind", "flat") != spec.kind:
            return None
        loaded = faiss.read_index(str(data_path))
    except (OSError, ValueError, RuntimeError):
        return None
    if loaded.d != dim or loaded.ntotal != meta.get("ntotal"):
        return None
    vectors = VectorIndex(
        dim, spec, loaded, trained_size=int(meta.get("trained_size", 0)), deleted=set(meta.get("deleted", []))
    )
    return vectors, int(meta["seq"])


def remove_snapshot(directory: Path, index: str) -> None:
    for p in snapshot_paths(directory, index):
        p.unlink(missing_ok=True)
