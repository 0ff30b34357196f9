"""One shard: a SQLite file (the source of truth) plus one FAISS index per named index (derived).

Writes commit to SQLite before they return (the acknowledgement point), then update FAISS. On open,
each FAISS index is loaded from its snapshot and the change log after it is replayed, or rebuilt
from the chunks table when there is no usable snapshot; so no acknowledged write is ever lost.

Thread safety: one writer at a time (a lock around the write connection); readers use their own
connection per thread (WAL lets them read while a write is in progress); FAISS mutations and
searches are serialised by a lock, and search results are re-read from SQLite so a hit whose
chunk was deleted concurrently is dropped rather than returned stale.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from app.index_spec import IndexSpec
from app.store.faiss_index import (
    VectorIndex,
    load_snapshot,
    remove_snapshot,
    save_snapshot,
    vectors_from_blobs,
)
from app.store.filters import filter_sql
from app.store.gpu import GpuMirror, resolve_faiss_device
from app.store.schema import connect, create_schema
from app.store.types import (
    DimensionMismatchError,
    DocumentWrite,
    IndexNotFoundError,
    SearchHit,
    StoredDocument,
)

DB_FILE = "shard.sqlite"
SNAPSHOT_DIR = "faiss"
_REBUILD_BATCH = 10_000
_SQL_VARS = 900  # stay under SQLite's host-parameter limit
log = logging.getLogger("ragserve.store")


def _chunks(seq: list[Any], size: int = _SQL_VARS) -> Iterator[list[Any]]:
    for i in range(0, len(seq), size):
        yield seq[i:i + size]


class Shard:
    def __init__(self, directory: str | Path, *, faiss_kind: str = "flat", snapshot_every: int = 1000,
                 faiss_device: str = "cpu", faiss_params: dict[str, Any] | None = None):
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
        self._pending: dict[str, int] = {}  # changes since the last snapshot, per index
        self._versions: dict[str, int] = {}  # bumped on every FAISS mutation (GPU mirrors follow it)
        self._gpu = GpuMirror() if resolve_faiss_device(faiss_device) == "gpu" else None
        self._closed = False
        for name, dim in self._write.execute("SELECT name, dim FROM indexes").fetchall():
            self._dims[name] = dim
            self._faiss[name] = self._open_faiss(name, dim)

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
        with self._write_lock:
            self._write.execute("BEGIN IMMEDIATE")
            try:
                yield self._write
            except BaseException:
                self._write.execute("ROLLBACK")
                raise
            self._write.execute("COMMIT")

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
            "SELECT op, chunk_id FROM changes WHERE index_name = ? AND seq > ? ORDER BY seq", (index, seq))
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
        """A new FAISS index from SQLite; IVF trains on a random sample first. Callers hold the write
        lock (or are opening the shard), so no write lands between the read and the swap."""
        fidx = VectorIndex(dim, self.spec)
        n = self._write.execute("SELECT COUNT(*) FROM chunks WHERE index_name = ?", (index,)).fetchone()[0]
        if fidx.wants_training(n):
            size = min(n, max(fidx.spec.training_threshold(), 64 * fidx.spec.lists_for(n)))
            sample = self._write.execute(
                "SELECT vector FROM chunks WHERE index_name = ? ORDER BY RANDOM() LIMIT ?", (index, size)).fetchall()
            fidx.train(vectors_from_blobs([r[0] for r in sample], dim), n)
        last = 0
        while True:
            rows = self._write.execute(
                "SELECT id, vector FROM chunks WHERE index_name = ? AND id > ? ORDER BY id LIMIT ?",
                (index, last, _REBUILD_BATCH)).fetchall()
            if not rows:
                break
            ids = np.asarray([r[0] for r in rows], dtype=np.int64)
            fidx.add(vectors_from_blobs([r[1] for r in rows], dim), ids)
            last = rows[-1][0]
        self._pending[index] = 1 if fidx.ntotal else 0  # snapshot it at the next opportunity
        return fidx

    def _require(self, index: str) -> int:
        dim = self._dims.get(index)
        if dim is None:
            raise IndexNotFoundError(index)
        return dim

    def _note_changes(self, index: str, n: int) -> None:
        self._pending[index] = self._pending.get(index, 0) + n
        if self.snapshot_every and self._pending[index] >= self.snapshot_every:
            self._snapshot_one(index)

    def _snapshot_one(self, index: str) -> None:
        with self._write_lock, self._faiss_lock:
            fidx = self._faiss.get(index)
            if fidx is None:
                return
            seq = self._write.execute("SELECT COALESCE(MAX(seq), 0) FROM changes WHERE index_name = ?",
                                      (index,)).fetchone()[0]
            save_snapshot(self.snapshot_dir, index, fidx, seq)
            self._write.execute("DELETE FROM changes WHERE index_name = ? AND seq <= ?", (index, seq))
            self._pending[index] = 0

    def _maybe_rebuild(self, index: str) -> None:
        """IVF trains (or retrains) and HNSW drops its masked deletions when they are due."""
        with self._write_lock, self._faiss_lock:
            fidx = self._faiss.get(index)
            if fidx is None or not fidx.needs_rebuild():
                return
            log.info("rebuilding the %s index of %r (%d vectors)", fidx.spec.kind, index, fidx.ntotal)
            self._faiss[index] = self._rebuild(index, fidx.dim)
            self._versions[index] = self._versions.get(index, 0) + 1
        self._snapshot_one(index)

    # --- indexes ------------------------------------------------------------------------------
    def list_indexes(self) -> list[str]:
        return sorted(self._dims)

    def has_index(self, index: str) -> bool:
        return index in self._dims

    def dim(self, index: str) -> int:
        return self._require(index)

    def create_index(self, index: str, dim: int) -> None:
        if dim < 1:
            raise ValueError("dim must be positive")
        existing = self._dims.get(index)
        if existing is not None:
            if existing != dim:
                raise DimensionMismatchError(f"index {index!r} holds {existing}-d vectors, got {dim}-d")
            return
        with self._transaction() as db:
            db.execute("INSERT OR IGNORE INTO indexes (name, dim, created_at) VALUES (?, ?, ?)",
                       (index, dim, time.time()))
        with self._faiss_lock:
            self._faiss[index] = VectorIndex(dim, self.spec)
            self._dims[index] = dim
            self._pending[index] = 0

    def drop_index(self, index: str) -> bool:
        if index not in self._dims:
            return False
        with self._transaction() as db:
            for table in ("chunks", "documents", "changes"):
                db.execute(f"DELETE FROM {table} WHERE index_name = ?", (index,))
            db.execute("DELETE FROM indexes WHERE name = ?", (index,))
        with self._faiss_lock:
            self._faiss.pop(index, None)
            self._dims.pop(index, None)
            if self._gpu is not None:
                self._gpu.drop(index)
            self._pending.pop(index, None)
        remove_snapshot(self.snapshot_dir, index)
        return True

    def count_documents(self, index: str) -> int:
        self._require(index)
        return self._reader().execute("SELECT COUNT(*) FROM documents WHERE index_name = ?", (index,)).fetchone()[0]

    def count_chunks(self, index: str) -> int:
        self._require(index)
        return self._reader().execute("SELECT COUNT(*) FROM chunks WHERE index_name = ?", (index,)).fetchone()[0]

    # --- writes -------------------------------------------------------------------------------
    def upsert_documents(self, index: str, docs: list[DocumentWrite], *, only_existing: bool = False) -> list[str]:
        """Insert or replace documents with their chunks, in one transaction; returns the doc ids
        written. ``only_existing`` (updates) skips documents that are no longer there when the
        transaction runs, so an update racing a delete cannot bring the document back."""
        if not docs:
            return []
        dims = {int(np.asarray(c.vector).shape[-1]) for d in docs for c in d.chunks}
        if len(dims) > 1:
            raise DimensionMismatchError(f"vectors of several dimensions in one batch: {sorted(dims)}")
        if index not in self._dims:
            if not dims:
                raise ValueError("cannot create an index from documents without chunks")
            self.create_index(index, dims.pop())
        dim = self._dims[index]
        if dims and dims != {dim}:
            raise DimensionMismatchError(f"index {index!r} holds {dim}-d vectors, got {dims.pop()}-d")
        now = time.time()
        with self._transaction() as db:
            if only_existing:
                present: set[str] = set()
                for part in _chunks([d.doc_id for d in docs]):
                    marks = ",".join("?" * len(part))
                    present |= {r[0] for r in db.execute(
                        f"SELECT doc_id FROM documents WHERE index_name = ? AND doc_id IN ({marks})", (index, *part))}
                docs = [d for d in docs if d.doc_id in present]
            doc_ids = [d.doc_id for d in docs]
            old_ids: list[int] = []
            for part in _chunks(doc_ids):
                marks = ",".join("?" * len(part))
                old_ids += [r[0] for r in db.execute(
                    f"SELECT id FROM chunks WHERE index_name = ? AND doc_id IN ({marks})", (index, *part))]
                db.execute(f"DELETE FROM chunks WHERE index_name = ? AND doc_id IN ({marks})", (index, *part))
            db.executemany("INSERT INTO changes (index_name, op, chunk_id) VALUES (?, 'del', ?)",
                           [(index, i) for i in old_ids])
            db.executemany(
                "INSERT INTO documents (index_name, doc_id, text, metadata, hash_value, updated_at) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (index_name, doc_id) DO UPDATE SET "
                "text = excluded.text, metadata = excluded.metadata, hash_value = excluded.hash_value, "
                "updated_at = excluded.updated_at",
                [(index, d.doc_id, d.text, json.dumps(d.metadata, ensure_ascii=False), d.hash_value, now)
                 for d in docs])
            new_ids: list[int] = []
            vectors: list[np.ndarray] = []
            for d in docs:
                for c in d.chunks:
                    vec = np.ascontiguousarray(c.vector, dtype=np.float32).reshape(dim)
                    cur = db.execute(
                        "INSERT INTO chunks (index_name, doc_id, node_id, chunk_index, text, vector) "
                        "VALUES (?, ?, ?, ?, ?, ?)", (index, d.doc_id, c.node_id, c.chunk_index, c.text,
                                                      vec.tobytes()))
                    new_ids.append(int(cur.lastrowid))
                    vectors.append(vec)
            db.executemany("INSERT INTO changes (index_name, op, chunk_id) VALUES (?, 'add', ?)",
                           [(index, i) for i in new_ids])
        # committed: now the derived FAISS state
        with self._faiss_lock:
            fidx = self._faiss[index]
            if old_ids:
                fidx.remove(old_ids)
            if new_ids:
                fidx.add(np.vstack(vectors), np.asarray(new_ids, dtype=np.int64))
            self._versions[index] = self._versions.get(index, 0) + 1
        self._maybe_rebuild(index)
        self._note_changes(index, len(old_ids) + len(new_ids))
        return doc_ids

    def delete_documents(self, index: str, doc_ids: list[str]) -> tuple[list[str], list[str]]:
        self._require(index)
        unique = list(dict.fromkeys(doc_ids))
        with self._transaction() as db:
            present: set[str] = set()
            removed: list[int] = []
            for part in _chunks(unique):
                marks = ",".join("?" * len(part))
                present |= {r[0] for r in db.execute(
                    f"SELECT doc_id FROM documents WHERE index_name = ? AND doc_id IN ({marks})", (index, *part))}
                removed += [r[0] for r in db.execute(
                    f"SELECT id FROM chunks WHERE index_name = ? AND doc_id IN ({marks})", (index, *part))]
                db.execute(f"DELETE FROM chunks WHERE index_name = ? AND doc_id IN ({marks})", (index, *part))
                db.execute(f"DELETE FROM documents WHERE index_name = ? AND doc_id IN ({marks})", (index, *part))
            db.executemany("INSERT INTO changes (index_name, op, chunk_id) VALUES (?, 'del', ?)",
                           [(index, i) for i in removed])
        if removed:
            with self._faiss_lock:
                self._faiss[index].remove(removed)
                self._versions[index] = self._versions.get(index, 0) + 1
            self._maybe_rebuild(index)
            self._note_changes(index, len(removed))
        return [d for d in unique if d in present], [d for d in unique if d not in present]

    # --- reads --------------------------------------------------------------------------------
    def find_by_hash(self, index: str, hashes: list[str]) -> dict[str, str]:
        self._require(index)
        found: dict[str, str] = {}
        for part in _chunks(list(dict.fromkeys(hashes))):
            marks = ",".join("?" * len(part))
            for h, doc_id in self._reader().execute(
                    f"SELECT hash_value, doc_id FROM documents WHERE index_name = ? AND hash_value IN ({marks}) "
                    "ORDER BY seq", (index, *part)):
                found.setdefault(h, doc_id)
        return found

    def get_documents(self, index: str, doc_ids: list[str]) -> dict[str, StoredDocument]:
        self._require(index)
        out: dict[str, StoredDocument] = {}
        for part in _chunks(list(dict.fromkeys(doc_ids))):
            marks = ",".join("?" * len(part))
            for doc_id, text, meta, h in self._reader().execute(
                    f"SELECT doc_id, text, metadata, hash_value FROM documents WHERE index_name = ? "
                    f"AND doc_id IN ({marks})", (index, *part)):
                out[doc_id] = StoredDocument(doc_id, text, json.loads(meta), h)
        return out

    def list_documents(self, index: str, *, limit: int = 10, offset: int = 0, max_text_length: int | None = 1000,
                       metadata_filter: dict[str, Any] | None = None) -> tuple[list[StoredDocument], int]:
        """A page in insertion order and the total number of matching documents."""
        self._require(index)
        if not 1 <= limit <= 100:
            raise ValueError("limit must be between 1 and 100")
        if offset < 0:
            raise ValueError("offset must be >= 0")
        if max_text_length is not None and max_text_length < 0:
            raise ValueError("max_text_length must be >= 0")
        cond, params = filter_sql(metadata_filter)
        db = self._reader()
        db.execute("BEGIN")  # one snapshot for the count and the page
        try:
            total = db.execute(f"SELECT COUNT(*) FROM documents WHERE index_name = ? AND {cond}",
                               (index, *params)).fetchone()[0]
            rows = db.execute(
                f"SELECT doc_id, text, metadata, hash_value FROM documents WHERE index_name = ? AND {cond} "
                "ORDER BY seq LIMIT ? OFFSET ?", (index, *params, limit, offset)).fetchall()
        finally:
            db.execute("COMMIT")
        docs = []
        for doc_id, text, meta, h in rows:
            truncated = max_text_length is not None and len(text) > max_text_length
            docs.append(StoredDocument(doc_id, text[:max_text_length] if truncated else text, json.loads(meta), h,
                                       is_truncated=truncated))
        return docs, total

    def search(self, index: str, vector: np.ndarray, k: int,
               metadata_filter: dict[str, Any] | None = None) -> list[SearchHit]:
        """Top ``k`` chunks by cosine score. A filter selects ids in SQLite first and FAISS scores only
        those, so a filter never starves the result."""
        dim = self._require(index)
        if k < 1:
            raise ValueError("k must be >= 1")
        query = np.ascontiguousarray(vector, dtype=np.float32).reshape(1, -1)
        if query.shape[1] != dim:
            raise DimensionMismatchError(f"index {index!r} holds {dim}-d vectors, query is {query.shape[1]}-d")
        allowed = None
        if metadata_filter:
            cond, args = filter_sql(metadata_filter, "d.metadata")
            ids = [r[0] for r in self._reader().execute(
                "SELECT c.id FROM chunks c JOIN documents d ON d.index_name = c.index_name AND d.doc_id = c.doc_id "
                f"WHERE c.index_name = ? AND {cond}", (index, *args))]
            if not ids:
                return []
            allowed = ids
        with self._faiss_lock:
            fidx = self._faiss[index]
            if fidx.ntotal == 0:
                return []
            if self._gpu is not None and allowed is None and fidx.gpu_mirrorable:
                scores, ids_found = self._gpu.search(index, fidx.index, self._versions.get(index, 0), query,
                                                     min(k, fidx.ntotal))
            else:
                scores, ids_found = fidx.search(query, k, allowed)
        pairs = [(int(i), float(s)) for i, s in zip(ids_found[0], scores[0], strict=True) if i >= 0]
        if not pairs:
            return []
        marks = ",".join("?" * len(pairs))
        rows = {r[0]: r for r in self._reader().execute(
            "SELECT c.id, c.doc_id, c.node_id, c.chunk_index, c.text, d.metadata FROM chunks c "
            "JOIN documents d ON d.index_name = c.index_name AND d.doc_id = c.doc_id "
            f"WHERE c.id IN ({marks})", [i for i, _ in pairs])}
        hits = []
        for chunk_id, score in pairs:
            row = rows.get(chunk_id)
            if row is not None:  # deleted between the FAISS search and this read
                hits.append(SearchHit(row[1], row[2], row[3], row[4], score, json.loads(row[5])))
        return hits

    # --- durability ---------------------------------------------------------------------------
    def snapshot(self) -> None:
        for index in list(self._dims):
            self._snapshot_one(index)

    def export_index(self, index: str, dest_file: str | Path) -> int:
        from app.store.export import export_index

        self._require(index)
        return export_index(self.db_path, index, self._dims[index], Path(dest_file))

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
    def index_stats(self, index: str) -> dict[str, Any] | None:
        """Documents, chunks, UTF-8 bytes of document text and FAISS vectors of ``index`` in this
        shard, or None when the shard has no such index. The SQLite counts come from one snapshot."""
        dim = self._dims.get(index)
        if dim is None:
            return None
        db = self._reader()
        db.execute("BEGIN")
        try:
            documents, text_bytes = db.execute(
                "SELECT COUNT(*), COALESCE(SUM(LENGTH(CAST(text AS BLOB))), 0) FROM documents WHERE index_name = ?",
                (index,)).fetchone()
            chunks = db.execute("SELECT COUNT(*) FROM chunks WHERE index_name = ?", (index,)).fetchone()[0]
        finally:
            db.execute("COMMIT")
        with self._faiss_lock:
            fidx = self._faiss.get(index)
            vectors = int(fidx.ntotal) if fidx is not None else 0
        return {"documents": int(documents), "chunks": int(chunks), "bytes": int(text_bytes), "vectors": vectors,
                "dimension": dim, "index_kind": self.spec.kind}
