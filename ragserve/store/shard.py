"""One shard: a SQLite file (the source of truth) plus one FAISS index per named index (derived).

Writes commit to SQLite before they return (the acknowledgement point), then update FAISS. On open,
each FAISS index is loaded from its snapshot and the change log after it is replayed, or rebuilt
from the chunks table when there is no usable snapshot; the result is then checked against SQLite
(``verify``: one vector per chunk row, nothing else) and rebuilt when it disagrees. So no
acknowledged write is ever lost, and no deleted one comes back.

Thread safety: one writer at a time. The write lock covers the whole of a write: the existence
check, the SQLite transaction *and* the FAISS mutation that follows the commit. So FAISS changes in
commit order (two updates of one document cannot apply their vectors the other way round), a
snapshot never sees a committed write whose vectors are not in FAISS yet, and an index cannot be
created twice or dropped between a write's check and its commit. Readers use their own connection
per thread (WAL lets them read while a write is in progress); searches take only the FAISS lock,
and their hits are re-read from SQLite so a chunk deleted concurrently is dropped, not returned.

Generations: every index carries a generation number, and the highest dropped generation of each
name is remembered. The document service reads an index's generation on its home shard and sends it
with each write; a shard refuses a write of a dropped generation (``IndexDroppedError``), and a write
of a newer generation first drops what the shard still holds of an older one. So a write racing a
delete-index (or a load that replaces the index) either lands before the drop and is dropped with
it, or fails and stores nothing: it never leaves rows that reappear when the name is reused.
"""

from __future__ import annotations

import json
import logging
import math
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from ragserve.api.documents import MAX_LIST_PAGE, RETRIEVAL_MODES
from ragserve.api.index_spec import IndexSpec
from ragserve.store.faiss_index import (
    VectorIndex,
    load_snapshot,
    remove_snapshot,
    save_snapshot,
    vectors_from_blobs,
)
from ragserve.store.filters import filter_sql
from ragserve.store.gpu import GpuMirror, resolve_faiss_device
from ragserve.store.lexical import FTS_TABLE, LexicalQuery, in_index, lexical_problems, lexical_query
from ragserve.store.schema import connect, create_schema
from ragserve.store.types import (
    DimensionMismatchError,
    DocumentWrite,
    IndexDroppedError,
    IndexExistsError,
    IndexNotFoundError,
    SearchCandidates,
    SearchHit,
    StoredDocument,
)

DB_FILE = "shard.sqlite"
SNAPSHOT_DIR = "faiss"
_REBUILD_BATCH = 10_000
_SQL_VARS = 900  # stay under SQLite's host-parameter limit
MAX_COUNTED_TERMS = 16  # a lexical search considers a query's first 16 content words
log = logging.getLogger("ragserve.store")


def _chunks(seq: list[Any], size: int = _SQL_VARS) -> Iterator[list[Any]]:
    for i in range(0, len(seq), size):
        yield seq[i : i + size]


class Shard:
    def __init__(
        self,
        directory: str | Path,
        *,
        faiss_kind: str = "flat",
        snapshot_every: int = 1000,
        faiss_device: str = "cpu",
        faiss_params: dict[str, Any] | None = None,
    ):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.db_path = self.directory / DB_FILE
        self.snapshot_dir = self.directory / SNAPSHOT_DIR
        self.faiss_kind = faiss_kind
        self.spec = IndexSpec.parse(faiss_kind, faiss_params)
        self.snapshot_every = snapshot_every
        self._write = connect(self.db_path)
        create_schema(self._write)
        self._write_lock = threading.Lock()
        self._faiss_lock = threading.RLock()
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        self._readers_lock = threading.Lock()
        self._faiss: dict[str, VectorIndex] = {}
        self._dims: dict[str, int] = {}
        self._gens: dict[str, int] = {}
        self._pending: dict[str, int] = {}  # changes since the last snapshot, per index
        self._versions: dict[str, int] = {}  # bumped on every FAISS mutation (GPU mirrors follow it)
        self._gpu = GpuMirror() if resolve_faiss_device(faiss_device) == "gpu" else None
        self._closed = False
        self._purge_orphans()
        for name, dim, gen in self._write.execute("SELECT name, dim, generation FROM indexes").fetchall():
            self._dims[name] = dim
            self._gens[name] = gen
            fidx = self._open_faiss(name, dim)
            problems = self._vector_problems(name, fidx)
            if problems:
                log.warning(
                    "the FAISS index of %r disagrees with SQLite (%s): rebuilding it from SQLite",
                    name,
                    "; ".join(problems[:3]),
                )
                remove_snapshot(self.snapshot_dir, name)  # not to be loaded again
                fidx = self._rebuild(name, dim)
            self._faiss[name] = fidx

    # --- connections --------------------------------------------------------------------------
    def _reader(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = connect(self.db_path, readonly=True)
            self._local.conn = conn
            with self._readers_lock:
                self._readers.append(conn)
        return conn

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One SQLite write transaction. Callers hold ``_write_lock`` around it *and* around the
        FAISS change that follows the commit (see the module docstring)."""
        self._write.execute("BEGIN IMMEDIATE")
        try:
            yield self._write
        except BaseException:
            self._write.execute("ROLLBACK")
            raise
        self._write.execute("COMMIT")

    def _purge_orphans(self) -> None:
        """Rows of an index that no longer exists (left by a write that raced a drop before
        generations existed) would come back when the name is reused: remove them at open."""
        with self._transaction() as db:
            counts = {}
            for table in ("chunks", "documents", "changes"):
                n = db.execute(f"DELETE FROM {table} WHERE index_name NOT IN (SELECT name FROM indexes)").rowcount
                if n:
                    counts[table] = n
        if counts:
            log.warning("removed rows of indexes that no longer exist from %s: %s", self.db_path, counts)

    # --- FAISS state --------------------------------------------------------------------------
    def _open_faiss(self, index: str, dim: int) -> VectorIndex:
        """Snapshot + change-log replay, or a full rebuild from SQLite."""
        snap = load_snapshot(self.snapshot_dir, index, dim, self.spec)
        if snap is None:
            return self._rebuild(index, dim)
        fidx, seq = snap
        adds: dict[int, None] = {}  # ordered set
        dels: list[int] = []
        rows = self._write.execute(
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
        for part in _chunks(list(adds)):
            marks = ",".join("?" * len(part))
            found = self._write.execute(f"SELECT id, vector FROM chunks WHERE id IN ({marks})", part).fetchall()
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
        n = self._write.execute("SELECT COUNT(*) FROM chunks WHERE index_name = ?", (index,)).fetchone()[0]
        if fidx.wants_training(n):
            size = min(n, max(fidx.spec.training_threshold(), 64 * fidx.spec.lists_for(n)))
            sample = self._write.execute(
                "SELECT vector FROM chunks WHERE index_name = ? ORDER BY (id * 2654435761) % 4294967291, id LIMIT ?",
                (index, size),
            ).fetchall()
            fidx.train(vectors_from_blobs([r[0] for r in sample], dim), n)
        last = 0
        while True:
            rows = self._write.execute(
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

    def _apply_faiss(self, index: str, removed: list[int], added: list[int], vectors: list[np.ndarray]) -> None:
        """Mirror a committed write in FAISS; callers hold the write lock, so this runs in commit
        order. Should FAISS fail here, the write is committed all the same: FAISS is rebuilt from
        SQLite rather than left disagreeing with it."""
        with self._faiss_lock:
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

    def _vector_problems(self, index: str, fidx: VectorIndex | None) -> list[str]:
        """What is wrong between the chunk rows of ``index`` and its FAISS vectors (empty: nothing)."""
        rows = np.asarray(
            [r[0] for r in self._write.execute("SELECT id FROM chunks WHERE index_name = ?", (index,))], dtype=np.int64
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

    def verify(self) -> list[str]:
        """The shard's self-check: every chunk row has exactly one vector in FAISS, no vector is
        without a row, FAISS counts what SQLite counts, no row belongs to a missing index or
        document, and the lexical index agrees with the chunk rows. Returns the problems found (empty
        when healthy). Runs at open (a failing index is rebuilt from SQLite) and after every
        concurrency test."""
        with self._write_lock, self._faiss_lock:
            problems: list[str] = []
            for table in ("chunks", "documents"):
                for name, n in self._write.execute(
                    f"SELECT index_name, COUNT(*) FROM {table} WHERE index_name NOT IN "
                    "(SELECT name FROM indexes) GROUP BY index_name"
                ):
                    problems.append(f"{n} {table} rows of {name!r}, which is not an index")
            n = self._write.execute(
                "SELECT COUNT(*) FROM chunks c WHERE NOT EXISTS (SELECT 1 FROM documents d WHERE "
                "d.index_name = c.index_name AND d.doc_id = c.doc_id)"
            ).fetchone()[0]
            if n:
                problems.append(f"{n} chunk rows without their document")
            for index in sorted(self._dims):
                problems += self._vector_problems(index, self._faiss.get(index))
            problems += lexical_problems(self._write)
            return problems

    def _require(self, index: str) -> int:
        dim = self._dims.get(index)
        if dim is None:
            raise IndexNotFoundError(index)
        return dim

    def _after_write_locked(self, index: str, n: int) -> None:
        """Maintenance due after a write, under the write lock: an IVF (re)training or HNSW
        compaction, then a snapshot when enough changes have accumulated."""
        fidx = self._faiss.get(index)
        if fidx is not None and fidx.needs_rebuild():
            with self._faiss_lock:
                log.info("rebuilding the %s index of %r (%d vectors)", fidx.spec.kind, index, fidx.ntotal)
                self._faiss[index] = self._rebuild(index, fidx.dim)
                self._versions[index] = self._versions.get(index, 0) + 1
            self._snapshot_locked(index)
            return
        self._pending[index] = self._pending.get(index, 0) + n
        if self.snapshot_every and self._pending[index] >= self.snapshot_every:
            self._snapshot_locked(index)

    def _snapshot_locked(self, index: str) -> None:
        with self._faiss_lock:
            fidx = self._faiss.get(index)
            if fidx is None:
                return
            seq = self._write.execute(
                "SELECT COALESCE(MAX(seq), 0) FROM changes WHERE index_name = ?", (index,)
            ).fetchone()[0]
            save_snapshot(self.snapshot_dir, index, fidx, seq)
            self._write.execute("DELETE FROM changes WHERE index_name = ? AND seq <= ?", (index, seq))
            self._pending[index] = 0

    # --- generations ----------------------------------------------------------------------------
    def _dropped_through(self, index: str) -> int:
        """The highest generation of ``index`` ever dropped here (-1: none)."""
        row = self._write.execute("SELECT generation FROM dropped_indexes WHERE name = ?", (index,)).fetchone()
        return -1 if row is None else int(row[0])

    def _next_generation(self, index: str) -> int:
        return max(self._dropped_through(index), self._gens.get(index, 0)) + 1

    @staticmethod
    def _tombstone(db: sqlite3.Connection, index: str, generation: int) -> None:
        db.execute(
            "INSERT INTO dropped_indexes (name, generation) VALUES (?, ?) ON CONFLICT (name) DO UPDATE "
            "SET generation = MAX(generation, excluded.generation)",
            (index, generation),
        )

    @staticmethod
    def _delete_rows(db: sqlite3.Connection, index: str) -> None:
        for table in ("chunks", "documents", "changes"):
            db.execute(f"DELETE FROM {table} WHERE index_name = ?", (index,))
        db.execute("DELETE FROM indexes WHERE name = ?", (index,))

    def _forget(self, index: str) -> None:
        """Drop the in-memory and snapshot state of an index whose rows were deleted (write lock held)."""
        with self._faiss_lock:
            self._faiss.pop(index, None)
            self._dims.pop(index, None)
            self._gens.pop(index, None)
            if self._gpu is not None:
                self._gpu.drop(index)
            self._pending.pop(index, None)
            self._versions[index] = self._versions.get(index, 0) + 1
        remove_snapshot(self.snapshot_dir, index)

    def _install(self, index: str, dim: int, generation: int, fidx: VectorIndex | None = None) -> None:
        with self._faiss_lock:
            self._faiss[index] = fidx if fidx is not None else VectorIndex(dim, self.spec)
            self._dims[index] = dim
            self._gens[index] = generation
            self._pending[index] = 0
            self._versions[index] = self._versions.get(index, 0) + 1

    # --- indexes ------------------------------------------------------------------------------
    def list_indexes(self) -> list[str]:
        return sorted(self._dims)

    def has_index(self, index: str) -> bool:
        return index in self._dims

    def dim(self, index: str) -> int:
        return self._require(index)

    def generation(self, index: str) -> int | None:
        """The generation of ``index`` here, or None when this shard does not hold it."""
        return self._gens.get(index)

    def _check_dim(self, index: str, dim: int) -> None:
        existing = self._dims[index]
        if existing != dim:
            raise DimensionMismatchError(f"index {index!r} holds {existing}-d vectors, got {dim}-d")

    def ensure_index(self, index: str, dim: int) -> int:
        """The generation of ``index``, creating the index (empty, next generation) when absent.
        Atomic under the write lock: two first writes agree on one index and one generation."""
        if dim < 1:
            raise ValueError("dim must be positive")
        held, gen = self._dims.get(index), self._gens.get(index)
        if held == dim and gen is not None:  # the common case, without waiting for the write lock
            return gen
        with self._write_lock:
            if index in self._dims:
                self._check_dim(index, dim)
                return self._gens[index]
            gen = self._next_generation(index)
            with self._transaction() as db:
                db.execute(
                    "INSERT INTO indexes (name, dim, created_at, generation) VALUES (?, ?, ?, ?)",
                    (index, dim, time.time(), gen),
                )
            self._install(index, dim, gen)
            return gen

    def create_index(self, index: str, dim: int) -> None:
        self.ensure_index(index, dim)

    def drop_index(self, index: str, generation: int | None = None) -> bool:
        """Drop ``index``; with ``generation``, only that generation or an older one (a newer one,
        created after the drop was decided, stays), and remember it as dropped either way so a late
        write of it is refused. True when something was dropped here."""
        with self._write_lock:
            held = self._gens.get(index)
            dropped = held is not None and (generation is None or held <= generation)
            tomb = generation if generation is not None else held
            if not dropped and tomb is None:
                return False
            with self._transaction() as db:
                if dropped:
                    self._delete_rows(db, index)
                if tomb is not None:
                    self._tombstone(db, index, tomb)
            if dropped:
                self._forget(index)
            return dropped

    def replace_index(
        self,
        staging: str,
        index: str,
        *,
        generation: int | None = None,
        overwrite: bool = True,
        dim: int | None = None,
        expect_staged: bool = False,
    ) -> int | None:
        """Swap the fully imported index ``staging`` in as ``index``, in one transaction (a load).

        Without ``generation`` (the home shard) a new generation is allocated here, and an existing
        ``index`` is refused unless ``overwrite`` (``IndexExistsError``). With ``generation`` (the
        other shards): an older ``index`` is dropped, a newer one (created after this load) is kept
        and ``staging`` dropped instead, and documents that writers of the same generation stored
        here first are kept over the snapshot's. ``dim`` creates ``index`` empty on a shard that
        received no document of the snapshot. ``expect_staged``: this shard imported documents into
        ``staging``, so its absence is an error (``IndexNotFoundError``), not an empty part.
        Returns the generation installed, or None."""
        with self._write_lock:
            held = self._gens.get(index)
            if held is not None and staging not in self._dims and self._origin(index) == staging:
                return held  # this swap already happened: a retried call (the shard actor restarted)
            if expect_staged and staging not in self._dims:
                raise IndexNotFoundError(staging)
            if generation is None:
                if held is not None and not overwrite:
                    raise IndexExistsError(index)
                gen = self._next_generation(index)
            else:
                gen = generation
                if held is not None and held > gen:
                    self._drop_locked(staging)
                    return None
            merge = held is not None and held == gen
            sdim = self._dims.get(staging)
            new_dim = sdim or dim or self._dims.get(index)
            if new_dim is None:  # nothing staged, nothing held, no dimension to create it with
                return gen
            with self._transaction() as db:
                if held is not None and not merge:
                    self._delete_rows(db, index)
                    self._tombstone(db, index, held)
                if sdim is not None:
                    if merge:  # writers of this generation got here first: their documents win
                        db.execute(
                            "DELETE FROM chunks WHERE index_name = ? AND doc_id IN "
                            "(SELECT doc_id FROM documents WHERE index_name = ?)",
                            (staging, index),
                        )
                        db.execute(
                            "DELETE FROM documents WHERE index_name = ? AND doc_id IN "
                            "(SELECT doc_id FROM documents WHERE index_name = ?)",
                            (staging, index),
                        )
                        db.execute("DELETE FROM indexes WHERE name = ?", (staging,))
                    else:
                        db.execute("UPDATE indexes SET name = ?, generation = ? WHERE name = ?", (index, gen, staging))
                    for table in ("chunks", "documents", "changes"):
                        db.execute(f"UPDATE {table} SET index_name = ? WHERE index_name = ?", (index, staging))
                elif not merge:
                    db.execute(
                        "INSERT INTO indexes (name, dim, created_at, generation) VALUES (?, ?, ?, ?)",
                        (index, new_dim, time.time(), gen),
                    )
                db.execute("UPDATE indexes SET origin = ? WHERE name = ?", (staging, index))
            staged = self._faiss.get(staging)
            if sdim is not None:
                self._forget(staging)
            if held is not None and not merge:
                self._forget(index)
            remove_snapshot(self.snapshot_dir, index)
            if merge and sdim is not None:
                with self._faiss_lock:
                    self._faiss[index] = self._rebuild(index, new_dim)
                    self._versions[index] = self._versions.get(index, 0) + 1
            elif not merge:
                self._install(index, new_dim, gen, staged)
            self._pending[index] = 1  # snapshot it at the next opportunity
            return gen

    def created_at(self, index: str) -> float | None:
        """When ``index`` was created here (seconds since the epoch), None when absent."""
        row = self._write.execute("SELECT created_at FROM indexes WHERE name = ?", (index,)).fetchone()
        return None if row is None else float(row[0])

    def _origin(self, index: str) -> str | None:
        row = self._write.execute("SELECT origin FROM indexes WHERE name = ?", (index,)).fetchone()
        return None if row is None else row[0]

    def _drop_locked(self, index: str) -> None:
        if index in self._dims:
            with self._transaction() as db:
                self._delete_rows(db, index)
            self._forget(index)

    def count_documents(self, index: str) -> int:
        self._require(index)
        return self._reader().execute("SELECT COUNT(*) FROM documents WHERE index_name = ?", (index,)).fetchone()[0]

    def count_chunks(self, index: str) -> int:
        self._require(index)
        return self._reader().execute("SELECT COUNT(*) FROM chunks WHERE index_name = ?", (index,)).fetchone()[0]

    # --- writes -------------------------------------------------------------------------------
    def upsert_documents(
        self,
        index: str,
        docs: list[DocumentWrite],
        *,
        only_existing: bool = False,
        if_absent: bool = False,
        generation: int | None = None,
    ) -> list[str]:
        """Insert or replace documents with their chunks, in one transaction; returns the doc ids
        written. ``only_existing`` (updates) skips documents that are no longer there when the
        transaction runs, so an update racing a delete cannot bring the document back.
        ``if_absent`` (new documents with content-derived ids) skips documents whose id is already
        stored, so identical concurrent writes store one document. ``generation`` (see the module
        docstring) makes a write for a dropped or replaced index fail with ``IndexDroppedError``,
        storing nothing; without it the write goes to the index as it is, created when absent."""
        if not docs:
            return []
        dims = {int(np.asarray(c.vector).shape[-1]) for d in docs for c in d.chunks}
        if len(dims) > 1:
            raise DimensionMismatchError(
                f"vectors of several dimensions in one batch: {sorted(dims)}", another_model=False
            )
        with self._write_lock:
            held = self._gens.get(index)
            stale = False  # the shard still holds an older generation than the writer's: drop it
            if held is not None and generation is not None and held not in (0, generation):
                if held > generation:
                    raise IndexDroppedError(index, generation)
                if only_existing:
                    return []
                stale = True
            create = held is None or stale
            if create:
                if only_existing:
                    return []
                if generation is not None and generation <= self._dropped_through(index):
                    raise IndexDroppedError(index, generation)
                if not dims:
                    raise ValueError("cannot create an index from documents without chunks")
                dim = next(iter(dims))
                gen = generation if generation is not None else self._next_generation(index)
            else:
                dim = self._dims[index]
                if dims and dims != {dim}:
                    raise DimensionMismatchError(f"index {index!r} holds {dim}-d vectors, got {dims.pop()}-d")
                gen = generation if generation is not None else self._gens[index]
            now = time.time()
            with self._transaction() as db:
                if stale:
                    assert held is not None
                    self._delete_rows(db, index)
                    self._tombstone(db, index, held)
                if create:
                    db.execute(
                        "INSERT INTO indexes (name, dim, created_at, generation) VALUES (?, ?, ?, ?)",
                        (index, dim, now, gen),
                    )
                elif held == 0 and generation:  # an index from before generations: adopt the writer's
                    db.execute("UPDATE indexes SET generation = ? WHERE name = ?", (generation, index))
                if (only_existing or if_absent) and not create:
                    present: dict[str, str] = {}
                    for part in _chunks([d.doc_id for d in docs]):
                        marks = ",".join("?" * len(part))
                        present.update(
                            db.execute(
                                "SELECT doc_id, hash_value FROM documents "
                                f"WHERE index_name = ? AND doc_id IN ({marks})",
                                (index, *part),
                            ).fetchall()
                        )
                    docs = [d for d in docs if (d.doc_id in present) == only_existing]
                doc_ids = [d.doc_id for d in docs]
                old_ids: list[int] = []
                for part in _chunks(doc_ids):
                    marks = ",".join("?" * len(part))
                    old_ids += [
                        r[0]
                        for r in db.execute(
                            f"SELECT id FROM chunks WHERE index_name = ? AND doc_id IN ({marks})", (index, *part)
                        )
                    ]
                    db.execute(f"DELETE FROM chunks WHERE index_name = ? AND doc_id IN ({marks})", (index, *part))
                db.executemany(
                    "INSERT INTO changes (index_name, op, chunk_id) VALUES (?, 'del', ?)", [(index, i) for i in old_ids]
                )
                db.executemany(
                    "INSERT INTO documents (index_name, doc_id, text, metadata, hash_value, updated_at) "
                    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (index_name, doc_id) DO UPDATE SET "
                    "text = excluded.text, metadata = excluded.metadata, hash_value = excluded.hash_value, "
                    "updated_at = excluded.updated_at",
                    [
                        (index, d.doc_id, d.text, json.dumps(d.metadata, ensure_ascii=False), d.hash_value, now)
                        for d in docs
                    ],
                )
                new_ids: list[int] = []
                vectors: list[np.ndarray] = []
                for d in docs:
                    for c in d.chunks:
                        vec = np.ascontiguousarray(c.vector, dtype=np.float32).reshape(dim)
                        cur = db.execute(
                            "INSERT INTO chunks (index_name, doc_id, node_id, chunk_index, text, vector) "
                            "VALUES (?, ?, ?, ?, ?, ?)",
                            (index, d.doc_id, c.node_id, c.chunk_index, c.text, vec.tobytes()),
                        )
                        assert cur.lastrowid is not None  # an INSERT into a rowid table always sets it
                        new_ids.append(cur.lastrowid)
                        vectors.append(vec)
                db.executemany(
                    "INSERT INTO changes (index_name, op, chunk_id) VALUES (?, 'add', ?)", [(index, i) for i in new_ids]
                )
            # committed; still under the write lock, so FAISS follows in commit order
            if stale:
                self._forget(index)
            if create:
                self._install(index, dim, gen)
            elif held == 0 and generation:
                self._gens[index] = generation
            self._apply_faiss(index, old_ids, new_ids, vectors)
            self._after_write_locked(index, len(old_ids) + len(new_ids))
            return doc_ids

    def delete_documents(self, index: str, doc_ids: list[str]) -> tuple[list[str], list[str]]:
        unique = list(dict.fromkeys(doc_ids))
        with self._write_lock:
            self._require(index)
            with self._transaction() as db:
                present: set[str] = set()
                removed: list[int] = []
                for part in _chunks(unique):
                    marks = ",".join("?" * len(part))
                    present |= {
                        r[0]
                        for r in db.execute(
                            f"SELECT doc_id FROM documents WHERE index_name = ? AND doc_id IN ({marks})", (index, *part)
                        )
                    }
                    removed += [
                        r[0]
                        for r in db.execute(
                            f"SELECT id FROM chunks WHERE index_name = ? AND doc_id IN ({marks})", (index, *part)
                        )
                    ]
                    db.execute(f"DELETE FROM chunks WHERE index_name = ? AND doc_id IN ({marks})", (index, *part))
                    db.execute(f"DELETE FROM documents WHERE index_name = ? AND doc_id IN ({marks})", (index, *part))
                db.executemany(
                    "INSERT INTO changes (index_name, op, chunk_id) VALUES (?, 'del', ?)", [(index, i) for i in removed]
                )
            if removed:
                self._apply_faiss(index, removed, [], [])
                self._after_write_locked(index, len(removed))
        return [d for d in unique if d in present], [d for d in unique if d not in present]

    # --- reads --------------------------------------------------------------------------------
    def find_by_hash(self, index: str, hashes: list[str]) -> dict[str, str]:
        self._require(index)
        found: dict[str, str] = {}
        for part in _chunks(list(dict.fromkeys(hashes))):
            marks = ",".join("?" * len(part))
            for h, doc_id in self._reader().execute(
                f"SELECT hash_value, doc_id FROM documents WHERE index_name = ? AND hash_value IN ({marks}) "
                "ORDER BY seq",
                (index, *part),
            ):
                found.setdefault(h, doc_id)
        return found

    def get_documents(self, index: str, doc_ids: list[str]) -> dict[str, StoredDocument]:
        self._require(index)
        out: dict[str, StoredDocument] = {}
        for part in _chunks(list(dict.fromkeys(doc_ids))):
            marks = ",".join("?" * len(part))
            for doc_id, text, meta, h in self._reader().execute(
                f"SELECT doc_id, text, metadata, hash_value FROM documents WHERE index_name = ? "
                f"AND doc_id IN ({marks})",
                (index, *part),
            ):
                out[doc_id] = StoredDocument(doc_id, text, json.loads(meta), h)
        return out

    def list_documents(
        self,
        index: str,
        *,
        limit: int = 10,
        offset: int = 0,
        max_text_length: int | None = 1000,
        metadata_filter: dict[str, Any] | None = None,
    ) -> tuple[list[StoredDocument], int]:
        """A page in insertion order and the total number of matching documents."""
        self._require(index)
        if not 1 <= limit <= MAX_LIST_PAGE:
            raise ValueError(f"limit must be between 1 and {MAX_LIST_PAGE}")
        if offset < 0:
            raise ValueError("offset must be >= 0")
        if max_text_length is not None and max_text_length < 0:
            raise ValueError("max_text_length must be >= 0")
        cond, params = filter_sql(metadata_filter)
        db = self._reader()
        db.execute("BEGIN")  # one snapshot for the count and the page
        try:
            total = db.execute(
                f"SELECT COUNT(*) FROM documents WHERE index_name = ? AND {cond}", (index, *params)
            ).fetchone()[0]
            rows = db.execute(
                f"SELECT doc_id, text, metadata, hash_value FROM documents WHERE index_name = ? AND {cond} "
                "ORDER BY seq LIMIT ? OFFSET ?",
                (index, *params, limit, offset),
            ).fetchall()
        finally:
            db.execute("COMMIT")
        docs = []
        for doc_id, text, meta, h in rows:
            truncated = max_text_length is not None and len(text) > max_text_length
            docs.append(
                StoredDocument(
                    doc_id, text[:max_text_length] if truncated else text, json.loads(meta), h, is_truncated=truncated
                )
            )
        return docs, total

    def _query_vector(self, index: str, vector: np.ndarray, k: int) -> np.ndarray:
        dim = self._require(index)
        if k < 1:
            raise ValueError("k must be >= 1")
        query = np.ascontiguousarray(vector, dtype=np.float32).reshape(1, -1)
        if query.shape[1] != dim:
            raise DimensionMismatchError(f"index {index!r} holds {dim}-d vectors, query is {query.shape[1]}-d")
        return query

    def _dense(
        self, index: str, query: np.ndarray, k: int, metadata_filter: dict[str, Any] | None
    ) -> list[tuple[int, float]] | None:
        """(chunk id, cosine) of the top ``k`` by FAISS; None when the filter matches nothing. A
        filter selects ids in SQLite first and FAISS scores only those, so it never starves the result."""
        allowed = None
        if metadata_filter:
            cond, args = filter_sql(metadata_filter, "d.metadata")
            ids = [
                r[0]
                for r in self._reader().execute(
                    "SELECT c.id FROM chunks c JOIN documents d ON d.index_name = c.index_name AND d.doc_id = c.doc_id "
                    f"WHERE c.index_name = ? AND {cond}",
                    (index, *args),
                )
            ]
            if not ids:
                return None
            allowed = ids
        with self._faiss_lock:
            fidx = self._faiss.get(index)
            if fidx is None:  # dropped since the check above
                raise IndexNotFoundError(index)
            if fidx.ntotal == 0:
                return []
            if self._gpu is not None and allowed is None and fidx.gpu_mirrorable:
                scores, ids_found = self._gpu.search(
                    index, fidx.index, self._versions.get(index, 0), query, min(k, fidx.ntotal)
                )
            else:
                scores, ids_found = fidx.search(query, k, allowed)
        return [(int(i), float(s)) for i, s in zip(ids_found[0], scores[0], strict=True) if i >= 0]

    def _rows(self, ids: list[int], *, vectors: bool = False) -> dict[int, tuple[Any, ...]]:
        """Chunk rows with their document's metadata, by id; (id, doc_id, node_id, chunk_index,
        text, metadata[, vector]). A chunk deleted meanwhile is simply absent."""
        rows: dict[int, tuple[Any, ...]] = {}
        extra = ", c.vector" if vectors else ""
        for part in _chunks(ids):
            marks = ",".join("?" * len(part))
            rows.update(
                (r[0], r)
                for r in self._reader().execute(
                    f"SELECT c.id, c.doc_id, c.node_id, c.chunk_index, c.text, d.metadata{extra} FROM chunks c "
                    "JOIN documents d ON d.index_name = c.index_name AND d.doc_id = c.doc_id "
                    f"WHERE c.id IN ({marks})",
                    part,
                )
            )
        return rows

    def search(
        self, index: str, vector: np.ndarray, k: int, metadata_filter: dict[str, Any] | None = None
    ) -> list[SearchHit]:
        """Top ``k`` chunks by cosine score (dense only)."""
        query = self._query_vector(index, vector, k)
        pairs = self._dense(index, query, k, metadata_filter)
        if not pairs:
            return []
        rows = self._rows([i for i, _ in pairs])
        return [
            SearchHit(r[1], r[2], r[3], r[4], score, json.loads(r[5]))
            for i, score in pairs
            if (r := rows.get(i)) is not None
        ]

    def _lexical(
        self, index: str, query: LexicalQuery, k: int, metadata_filter: dict[str, Any] | None
    ) -> list[tuple[int, float]]:
        """(chunk id, BM25 score, higher better) of the top ``k`` lexical matches in ``index``.

        The query is ANDed with the index's own token (``LexicalQuery.match_in``), so FTS5 returns
        and ranks this index's matching rows only; the BM25 statistics it ranks them by (row count,
        average length, each term's document frequency) are the whole shard's, so another index's
        text shifts the scores and order of these rows (docs/architecture.md §6); a metadata
        filter joins the documents."""
        db = self._reader()
        match = query.match_in(index)
        if not metadata_filter:
            return [
                (int(i), -float(r))
                for i, r in db.execute(
                    f"SELECT rowid, rank FROM {FTS_TABLE} WHERE {FTS_TABLE} MATCH ? ORDER BY rank LIMIT ?", (match, k)
                )
            ]
        cond, args = filter_sql(metadata_filter, "d.metadata")
        return [
            (int(i), -float(r))
            for i, r in db.execute(
                f"SELECT c.id, {FTS_TABLE}.rank FROM {FTS_TABLE} JOIN chunks c ON c.id = {FTS_TABLE}.rowid "
                "JOIN documents d ON d.index_name = c.index_name AND d.doc_id = c.doc_id "
                f"WHERE {FTS_TABLE} MATCH ? AND {cond} ORDER BY {FTS_TABLE}.rank LIMIT ?",
                (match, *args, k),
            )
        ]

    def _terms_matched(self, index: str, query: LexicalQuery, ids: list[int]) -> dict[int, int]:
        """How many of ``query``'s terms each of ``ids`` (rows of ``index``) contains: one query per
        term over the rowid range the ids span, kept to the ids here. FTS5 seeks a rowid range in its
        doclists but runs ``rowid IN (...)`` as one full-text lookup per listed id: with 60
        candidates and 3 terms that was 2.5 ms a shard, the range 0.08 ms (docs/benchmarks.md). The
        range walks at most each term's postings in this index, which the BM25 query over the same
        terms has just walked."""
        counts = dict.fromkeys(ids, 0)
        if not ids:
            return counts
        lo, hi = min(ids), max(ids)
        db = self._reader()
        for term in query.terms:
            for (i,) in db.execute(
                f"SELECT rowid FROM {FTS_TABLE} WHERE {FTS_TABLE} MATCH ? AND rowid BETWEEN ? AND ?",
                (in_index(index, term), lo, hi),
            ):
                if i in counts:
                    counts[i] += 1
        return counts

    def _selective(self, index: str, query: LexicalQuery, max_postings: int) -> tuple[LexicalQuery, int]:
        """The terms of ``query`` to search ``index`` with, rarest first while the rows of ``index``
        they match add up to at most ``max_postings`` (each count stops at that bound and walks only
        this index's postings, so counting is cheap too and another index's rows never count); and
        how many terms match no row of ``index`` at all."""
        db = self._reader()
        counts: list[tuple[int, int]] = []
        absent = 0
        for pos, term in enumerate(query.terms[:MAX_COUNTED_TERMS]):
            n = db.execute(
                f"SELECT count(*) FROM (SELECT 1 FROM {FTS_TABLE} WHERE {FTS_TABLE} MATCH ? LIMIT ?)",
                (in_index(index, term), max_postings + 1),
            ).fetchone()[0]
            if n:
                counts.append((n, pos))
            else:
                absent += 1
        kept: set[int] = set()
        spent = 0
        for n, pos in sorted(counts):
            if spent + n > max_postings:
                break
            kept.add(pos)
            spent += n
        return LexicalQuery(tuple(t for pos, t in enumerate(query.terms) if pos in kept)), absent

    def search_candidates(
        self,
        index: str,
        vector: np.ndarray,
        text: str,
        k: int,
        *,
        mode: str = "hybrid",
        metadata_filter: dict[str, Any] | None = None,
        min_match: float = 0.0,
        max_postings: int | None = None,
    ) -> SearchCandidates:
        """A retrieval's candidates from this shard, in one call: the top ``k`` by cosine (unless
        ``mode`` is ``lexical``) and the top ``k`` by BM25 over ``text`` (unless it is ``dense``).
        Every hit carries its cosine score (lexical-only ones from their stored vector), so a
        similarity threshold means the same in every mode; lexical hits also carry their BM25 score,
        and every hit whether it contains all the query's terms. The metadata filter applies to both.

        ``min_match``: the share of the query's terms a lexical hit must contain (rounded up, at
        least one), BM25's "minimum should match". A hit sharing one common word with a long
        question is no evidence, but rank fusion would credit it as much as a real match; so the
        top ``3k`` matches are counted and the weak ones left out. Terms that no row contains count
        in the share (a chunk with one of six words of a question is weak evidence, even when four
        of the six occur nowhere); terms left out for cost (below) do not.

        ``max_postings`` bounds the lexical search's cost (``_selective``): BM25 is computed for
        every row a term matches, so the terms are taken rarest first while the rows they match
        add up to at most this; the frequent ones left out weigh little in BM25 anyway (low IDF).
        ``all_terms`` then means every term searched, and is never true when a term matches
        nothing here."""
        if mode not in RETRIEVAL_MODES:
            raise ValueError(f"mode must be one of {', '.join(RETRIEVAL_MODES)}")
        query = self._query_vector(index, vector, k)
        dense = self._dense(index, query, k, metadata_filter) if mode != "lexical" else []
        if dense is None:  # the filter matches nothing in this index
            return SearchCandidates()
        lex = lexical_query(text) if mode != "dense" else LexicalQuery(())
        absent = 0  # terms no row here contains: they still count in the share a hit must match
        if lex and max_postings is not None:
            lex, absent = self._selective(index, lex, max_postings)
        need = max(1, math.ceil(min_match * (len(lex.terms) + absent) - 1e-9))
        lexical = self._lexical(index, lex, 3 * k if need > 1 else k, metadata_filter) if lex else []
        dense_ids = {i for i, _ in dense}
        matched = self._terms_matched(index, lex, list(dense_ids | {i for i, _ in lexical})) if lex else {}
        lexical_scores = dict([(i, s) for i, s in lexical if matched[i] >= need][:k])
        rows = self._rows(list(dense_ids))
        lexical_only = [i for i in lexical_scores if i not in dense_ids]
        rows.update(self._rows(lexical_only, vectors=True))

        def hit(i: int, score: float) -> SearchHit:
            r = rows[i]
            return SearchHit(
                r[1],
                r[2],
                r[3],
                r[4],
                score,
                json.loads(r[5]),
                lexical_scores.get(i),
                bool(lex) and not absent and matched.get(i, 0) == len(lex.terms),
            )

        cosines = dict(dense)
        for i in lexical_only:
            if i in rows:
                cosines[i] = float(np.frombuffer(rows[i][6], dtype=np.float32) @ query[0])
        return SearchCandidates(
            dense=[hit(i, s) for i, s in dense if i in rows],
            lexical=[hit(i, cosines[i]) for i in lexical_scores if i in rows],
        )

    # --- durability ---------------------------------------------------------------------------
    def snapshot(self) -> None:
        with self._write_lock:
            for index in list(self._dims):
                self._snapshot_locked(index)

    def export_index(self, index: str, dest_file: str | Path) -> int:
        from ragserve.store.export import export_index

        dim = self._require(index)
        return export_index(self.db_path, index, dim, Path(dest_file))

    def close(self) -> None:
        if self._closed:
            return
        self.snapshot()
        self._closed = True
        with self._readers_lock:
            for conn in self._readers:
                conn.close()
            self._readers.clear()
        self._write.close()

    # --- statistics (GET /indexes/{name}/stats) -----------------------------------------------
    def index_stats(self, index: str, *, text_bytes: bool = True) -> dict[str, Any] | None:
        """Documents, chunks, UTF-8 bytes of document text and FAISS vectors of ``index`` in this
        shard, or None when the shard has no such index. The rows are counted in one read
        transaction whose snapshot is taken, with FAISS's count, under the write lock (a write holds
        it from its SQLite transaction until FAISS has its vectors), so the counts are never those of
        a half-applied write (its rows committed, its vectors not yet added); the counting itself
        runs once the lock is released, so a large index does not hold writes up. ``text_bytes=False``
        leaves the document texts unread (``bytes`` is 0): the shard metrics need only the counts."""
        db = self._reader()
        with self._write_lock:
            dim = self._dims.get(index)
            if dim is None:
                return None
            db.execute("BEGIN")
            try:
                db.execute("SELECT 1 FROM chunks LIMIT 1").fetchall()  # the read snapshot starts here
                with self._faiss_lock:
                    fidx = self._faiss.get(index)
                    vectors = int(fidx.ntotal) if fidx is not None else 0
            except BaseException:
                db.execute("COMMIT")
                raise
        size = "COALESCE(SUM(LENGTH(CAST(text AS BLOB))), 0)" if text_bytes else "0"
        try:
            documents, n_bytes = db.execute(
                f"SELECT COUNT(*), {size} FROM documents WHERE index_name = ?", (index,)
            ).fetchone()
            chunks = db.execute("SELECT COUNT(*) FROM chunks WHERE index_name = ?", (index,)).fetchone()[0]
        finally:
            db.execute("COMMIT")
        return {
            "documents": int(documents),
            "chunks": int(chunks),
            "bytes": int(n_bytes),
            "vectors": vectors,
            "dimension": dim,
            "index_kind": self.spec.kind,
        }
