"""A shard's FAISS mirror: one in-memory FAISS index per named index, derived from the vectors in
SQLite, with the dimension and generation the shard holds each index at.

SQLite is the truth; this is derived from it. On open, each FAISS index is loaded from its snapshot
and the change log after it is replayed, or rebuilt from the chunks table when there is no usable
snapshot; the result is then checked against SQLite (one vector per chunk row, nothing else) and
rebuilt when it disagrees. After that the shard mirrors each committed write here (``apply``), and
every so many changes snapshots the index and trims the change log (``after_write``), so a restart
replays only what came after the snapshot.

Locks: ``lock`` (re-entrant) guards the FAISS indexes: a search holds it while it reads one, and
every change of the mirror takes it. The shard's write lock is its caller's: every method that
changes the mirror runs under it (or while the shard is being opened), because a write holds it from
its SQLite transaction until its vectors are here (``ragserve.store.shard``), so FAISS changes in
commit order. The SQLite reads of a replay, a rebuild and a snapshot go through the shard's write
connection, which only the holder of the write lock uses.

An index's dimension and generation live here because they come and go with its FAISS index:
``install`` and ``forget`` change all three under ``lock``, the FAISS index first, so an index
whose dimension can be read has (or, when dropped meanwhile, just had) a FAISS index.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from pathlib import Path

import numpy as np

from ragserve.api.index_spec import IndexSpec
from ragserve.store.faiss_index import (
    VectorIndex,
    load_snapshot,
    remove_snapshot,
    save_snapshot,
    vectors_from_blobs,
)
from ragserve.store.gpu import GpuMirror, resolve_faiss_device
from ragserve.store.schema import chunked
from ragserve.store.types import IndexNotFoundError

_REBUILD_BATCH = 10_000
log = logging.getLogger("ragserve.store")


class FaissMirror:
    def __init__(self, db: sqlite3.Connection, snapshot_dir: Path, spec: IndexSpec, faiss_device: str = "cpu"):
        self._db = db  # the shard's write connection
        self.snapshot_dir = snapshot_dir
        self.spec = spec
        self.lock = threading.RLock()
        self._faiss: dict[str, VectorIndex] = {}
        self._dims: dict[str, int] = {}
        self._gens: dict[str, int] = {}
        self._pending: dict[str, int] = {}  # changes since the last snapshot, per index
        self._versions: dict[str, int] = {}  # bumped on every FAISS mutation (GPU mirrors follow it)
        self._gpu = GpuMirror() if resolve_faiss_device(faiss_device) == "gpu" else None

    # --- what the shard holds -----------------------------------------------------------------
    def names(self) -> list[str]:
        """The indexes held, in the order they were installed."""
        return list(self._dims)

    def __contains__(self, index: str) -> bool:
        return index in self._dims

    def dim(self, index: str) -> int | None:
        return self._dims.get(index)

    def require(self, index: str) -> int:
        """The dimension of ``index``; ``IndexNotFoundError`` when it is not held."""
        dim = self._dims.get(index)
        if dim is None:
            raise IndexNotFoundError(index)
        return dim

    def generation(self, index: str) -> int | None:
        return self._gens.get(index)

    def set_generation(self, index: str, generation: int) -> None:
        """Adopt a writer's generation for an index from before generations (write lock held)."""
        self._gens[index] = generation

    def get(self, index: str) -> VectorIndex | None:
        return self._faiss.get(index)

    def __getitem__(self, index: str) -> VectorIndex:
        return self._faiss[index]

    def ntotal(self, index: str) -> int:
        """How many vectors the FAISS index of ``index`` holds (0: none, or no such index)."""
        with self.lock:
            fidx = self._faiss.get(index)
            return int(fidx.ntotal) if fidx is not None else 0

    # --- open ---------------------------------------------------------------------------------
    def load(self, index: str, dim: int, generation: int) -> None:
        """Bring ``index`` up at open: its snapshot and the changes after it, or a rebuild; rebuilt
        from SQLite (and its snapshot removed) when the result disagrees with the chunk rows."""
        self._dims[index] = dim
        self._gens[index] = generation
        fidx = self._open(index, dim)
        problems = self._vector_problems(index, fidx)
        if problems:
            log.warning(
                "the FAISS index of %r disagrees with SQLite (%s): rebuilding it from SQLite",
                index,
                "; ".join(problems[:3]),
            )
            remove_snapshot(self.snapshot_dir, index)  # not to be loaded again
            fidx = self._rebuild(index, dim)
        self._faiss[index] = fidx

    def _open(self, index: str, dim: int) -> VectorIndex:
        """Snapshot + change-log replay, or a full rebuild from SQLite."""
        snap = load_snapshot(self.snapshot_dir, index, dim, self.spec)
        if snap is None:
            return self._rebuild(index, dim)
        fidx, seq = snap
        adds: dict[int, None] = {}  # ordered set
        dels: list[int] = []
        rows = self._db.execute(
            "SELECT op, chunk_id FROM changes WHERE index_name = ? AND seq > ? ORDER BY seq", (index, seq)
        )
        for op, chunk_id in rows:
            if op == "add":
                adds[chunk_id] = None
            elif chunk_id in adds:  # added and deleted after the snapshot: never in FAISS
                del adds[chunk_id]
            else:
                dels.append(chunk_id)
        if dels:
            fidx.remove(dels)
        for part in chunked(list(adds)):
            marks = ",".join("?" * len(part))
            found = self._db.execute(f"SELECT id, vector FROM chunks WHERE id IN ({marks})", part).fetchall()
            if found:
                ids = np.asarray([r[0] for r in found], dtype=np.int64)
                fidx.add(vectors_from_blobs([r[1] for r in found], dim), ids)
        self._pending[index] = len(adds) + len(dels)
        if fidx.needs_rebuild():
            return self._rebuild(index, dim)
        return fidx

    def _rebuild(self, index: str, dim: int) -> VectorIndex:
        """A new FAISS index from SQLite; IVF trains on a sample first. Callers hold the write
        lock (or are opening the shard), so no write lands between the read and the swap.

        The sample is spread over the rows by a hash of their ids (a multiplicative hash, taken
        modulo a prime), not ``ORDER BY RANDOM()``: as good a spread, and the same rows give the
        same index, so a rebuild (and a test of its recall) is reproducible."""
        fidx = VectorIndex(dim, self.spec)
        n = self._db.execute("SELECT COUNT(*) FROM chunks WHERE index_name = ?", (index,)).fetchone()[0]
        if fidx.wants_training(n):
            size = min(n, max(fidx.spec.training_threshold(), 64 * fidx.spec.lists_for(n)))
            sample = self._db.execute(
                "SELECT vector FROM chunks WHERE index_name = ? ORDER BY (id * 2654435761) % 4294967291, id LIMIT ?",
                (index, size),
            ).fetchall()
            fidx.train(vectors_from_blobs([r[0] for r in sample], dim), n)
        last = 0
        while True:
            rows = self._db.execute(
                "SELECT id, vector FROM chunks WHERE index_name = ? AND id > ? ORDER BY id LIMIT ?",
                (index, last, _REBUILD_BATCH),
            ).fetchall()
            if not rows:
                break
            ids = np.asarray([r[0] for r in rows], dtype=np.int64)
            fidx.add(vectors_from_blobs([r[1] for r in rows], dim), ids)
            last = rows[-1][0]
        self._pending[index] = 1 if fidx.ntotal else 0  # snapshot it at the next opportunity
        return fidx

    # --- the self-check -----------------------------------------------------------------------
    def problems(self, index: str) -> list[str]:
        """What is wrong between the chunk rows of ``index`` and its FAISS vectors (empty: nothing).
        Callers hold the write lock and ``lock``."""
        return self._vector_problems(index, self._faiss.get(index))

    def _vector_problems(self, index: str, fidx: VectorIndex | None) -> list[str]:
        rows = np.asarray(
            [r[0] for r in self._db.execute("SELECT id FROM chunks WHERE index_name = ?", (index,))], dtype=np.int64
        )
        if fidx is None:
            return [f"{index!r}: no FAISS index for {len(rows)} chunk rows"]
        ids = fidx.ids()
        problems = []
        unique, counts = np.unique(ids, return_counts=True)
        if (counts > 1).any():
            problems.append(f"{index!r}: chunk ids with more than one vector: {unique[counts > 1][:10].tolist()}")
        missing = np.setdiff1d(rows, unique)
        if missing.size:
            problems.append(f"{index!r}: chunk rows without a vector: {missing[:10].tolist()}")
        extra = np.setdiff1d(unique, rows)
        if extra.size:
            problems.append(f"{index!r}: vectors without a row: {extra[:10].tolist()}")
        if fidx.ntotal != len(rows):
            problems.append(f"{index!r}: FAISS holds {fidx.ntotal} vectors for {len(rows)} chunk rows")
        return problems

    # --- changes (callers hold the write lock) ------------------------------------------------
    def install(self, index: str, dim: int, generation: int, fidx: VectorIndex | None = None) -> None:
        """Hold ``index`` at ``dim`` and ``generation``, with ``fidx`` or an empty FAISS index."""
        with self.lock:
            self._faiss[index] = fidx if fidx is not None else VectorIndex(dim, self.spec)
            self._dims[index] = dim
            self._gens[index] = generation
            self._pending[index] = 0
            self._versions[index] = self._versions.get(index, 0) + 1

    def forget(self, index: str) -> None:
        """Drop the in-memory and snapshot state of an index whose rows were deleted."""
        with self.lock:
            self._faiss.pop(index, None)
            self._dims.pop(index, None)
            self._gens.pop(index, None)
            if self._gpu is not None:
                self._gpu.drop(index)
            self._pending.pop(index, None)
            self._versions[index] = self._versions.get(index, 0) + 1
        remove_snapshot(self.snapshot_dir, index)

    def remove_snapshot(self, index: str) -> None:
        """Delete the snapshot of ``index`` (its rows were replaced: it must not be loaded again)."""
        remove_snapshot(self.snapshot_dir, index)

    def apply(self, index: str, removed: list[int], added: list[int], vectors: list[np.ndarray]) -> None:
        """Mirror a committed write in FAISS; callers hold the write lock, so this runs in commit
        order. Should FAISS fail here, the write is committed all the same: FAISS is rebuilt from
        SQLite rather than left disagreeing with it."""
        with self.lock:
            fidx = self._faiss[index]
            try:
                if removed:
                    fidx.remove(removed)
                if added:
                    fidx.add(np.vstack(vectors), np.asarray(added, dtype=np.int64))
            except Exception:
                log.exception("FAISS update of %r failed after the commit: rebuilding it from SQLite", index)
                self._faiss[index] = self._rebuild(index, fidx.dim)
            self._versions[index] = self._versions.get(index, 0) + 1

    def reload(self, index: str, dim: int) -> None:
        """Replace the FAISS index of ``index`` by a rebuild from SQLite."""
        with self.lock:
            self._faiss[index] = self._rebuild(index, dim)
            self._versions[index] = self._versions.get(index, 0) + 1

    def mark_changed(self, index: str) -> None:
        """Snapshot ``index`` at the next opportunity."""
        self._pending[index] = 1

    def after_write(self, index: str, n: int, snapshot_every: int) -> None:
        """Maintenance due after a write of ``n`` changes: an IVF (re)training or HNSW compaction,
        then a snapshot when ``snapshot_every`` changes (0: never) have accumulated."""
        fidx = self._faiss.get(index)
        if fidx is not None and fidx.needs_rebuild():
            with self.lock:
                log.info("rebuilding the %s index of %r (%d vectors)", fidx.spec.kind, index, fidx.ntotal)
                self.reload(index, fidx.dim)
            self.snapshot(index)
            return
        self._pending[index] = self._pending.get(index, 0) + n
        if snapshot_every and self._pending[index] >= snapshot_every:
            self.snapshot(index)

    def snapshot(self, index: str) -> None:
        """Save the FAISS index of ``index`` with the change-log position it includes, then trim the
        change log up to there."""
        with self.lock:
            fidx = self._faiss.get(index)
            if fidx is None:
                return
            seq = self._db.execute(
                "SELECT COALESCE(MAX(seq), 0) FROM changes WHERE index_name = ?", (index,)
            ).fetchone()[0]
            save_snapshot(self.snapshot_dir, index, fidx, seq)
            self._db.execute("DELETE FROM changes WHERE index_name = ? AND seq <= ?", (index, seq))
            self._pending[index] = 0

    # --- search -------------------------------------------------------------------------------
    def search(
        self, index: str, query: np.ndarray, k: int, allowed: list[int] | None
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """(scores, ids) of the top ``k`` of ``index`` for ``query`` (one row), among ``allowed``
        ids when given; None when the index holds no vector. An unfiltered search of an index that
        can be mirrored runs on the GPU when there is one."""
        with self.lock:
            fidx = self._faiss.get(index)
            if fidx is None:  # dropped since the caller looked it up
                raise IndexNotFoundError(index)
            if fidx.ntotal == 0:
                return None
            if self._gpu is not None and allowed is None and fidx.gpu_mirrorable:
                return self._gpu.search(index, fidx.index, self._versions.get(index, 0), query, min(k, fidx.ntotal))
            return fidx.search(query, k, allowed)
