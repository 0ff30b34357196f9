"""One shard: a SQLite file (the source of truth) plus one FAISS index per named index (derived).

``Shard`` is the facade the shard service calls; it owns the SQLite write connection, the write
lock, the index lifecycle (create, drop, a load's swap, generations) and the writes and reads of
documents, and delegates to its parts: ``readers`` (one read connection per thread), ``mirror``
(the FAISS indexes, loaded, checked, changed and snapshotted) and ``search`` (dense and lexical).

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

Change versions (what the answer cache compares, docs/architecture.md §4, "Answer cache"): every
change of what a search of an index sees here (documents written or deleted, the index created,
dropped, or replaced by a load) stamps the index, under the write lock and *after* the change is
visible to readers (committed and in FAISS), with the next value of a per-shard counter.
``versions`` reads ``(epoch, generation, stamp)`` without the lock: a version that includes a change
was read after readers could see it. The counter lives in memory only; ``epoch`` is drawn at open,
so a reopened (restarted) shard can never repeat an earlier version. An index this shard does not
hold has stamp 0 (it contributes nothing to a search, whatever it held before).
"""

from __future__ import annotations

import json
import logging
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from ragserve.api.documents import MAX_LIST_PAGE
from ragserve.api.index_spec import IndexSpec
from ragserve.store.filters import filter_sql
from ragserve.store.lexical import lexical_problems
from ragserve.store.mirror import FaissMirror
from ragserve.store.readers import Readers
from ragserve.store.schema import chunked, connect, create_schema, write_transaction
from ragserve.store.search import candidates, dense_search, mentioned
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
log = logging.getLogger("ragserve.store")


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
        self._readers = Readers(self.db_path)
        self._mirror = FaissMirror(self._write, self.snapshot_dir, self.spec, faiss_device)
        self._closed = False
        # change versions (module docstring): a random epoch per open, a counter, each index's stamp
        self.epoch = secrets.token_hex(8)
        self._clock = 0
        self._stamps: dict[str, int] = {}
        self._purge_orphans()
        for name, dim, gen in self._write.execute("SELECT name, dim, generation FROM indexes").fetchall():
            self._mirror.load(name, dim, gen)

    # --- connections --------------------------------------------------------------------------
    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One SQLite write transaction. Callers hold ``_write_lock`` around it *and* around the
        FAISS change that follows the commit (see the module docstring)."""
        with write_transaction(self._write) as conn:
            yield conn

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

    # --- the self-check -----------------------------------------------------------------------
    def verify(self) -> list[str]:
        """The shard's self-check: every chunk row has exactly one vector in FAISS, no vector is
        without a row, FAISS counts what SQLite counts, no row belongs to a missing index or
        document, and the lexical index agrees with the chunk rows. Returns the problems found (empty
        when healthy). Runs at open (a failing index is rebuilt from SQLite) and after every
        concurrency test."""
        with self._write_lock, self._mirror.lock:
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
            for index in sorted(self._mirror.names()):
                problems += self._mirror.problems(index)
            problems += lexical_problems(self._write)
            return problems

    def _require(self, index: str) -> int:
        return self._mirror.require(index)

    # --- change versions (module docstring) ---------------------------------------------------
    def _changed(self, index: str) -> None:
        """Stamp ``index`` as changed; the write lock is held and the change is already visible."""
        self._clock += 1
        self._stamps[index] = self._clock

    def _gone(self, index: str) -> None:
        """``index`` is no longer held here (write lock held, after it was forgotten). The counter
        moves too: its rows left the shard's lexical statistics (``changes``)."""
        self._clock += 1
        self._stamps.pop(index, None)

    def changes(self) -> int:
        """How many changes this shard has seen since it opened: it moves with every write to any of
        its indexes, after the write is visible (read without the lock). A search of any index here
        that began after this value was read sees everything it counts; BM25's statistics are the
        whole shard's (docs/architecture.md §6), so a write to one index can reorder another's
        lexical hits, and only this shard-wide count says that nothing at all changed."""
        return self._clock

    def versions(self, indexes: list[str]) -> list[tuple[str, int | None, int]]:
        """``(epoch, generation, stamp)`` of each of ``indexes`` here, in their order (stamp 0 and
        generation None for one not held). Equal versions mean no write changed what a search of
        the index here sees; read without the write lock, so a write in progress is not waited for."""
        return [(self.epoch, self._mirror.generation(i), self._stamps.get(i, 0)) for i in indexes]

    # --- generations ----------------------------------------------------------------------------
    def _dropped_through(self, index: str) -> int:
        """The highest generation of ``index`` ever dropped here (-1: none)."""
        row = self._write.execute("SELECT generation FROM dropped_indexes WHERE name = ?", (index,)).fetchone()
        return -1 if row is None else int(row[0])

    def _next_generation(self, index: str) -> int:
        return max(self._dropped_through(index), (self._mirror.generation(index) or 0)) + 1

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

    # --- indexes ------------------------------------------------------------------------------
    def list_indexes(self) -> list[str]:
        return sorted(self._mirror.names())

    def has_index(self, index: str) -> bool:
        return index in self._mirror

    def dim(self, index: str) -> int:
        return self._require(index)

    def generation(self, index: str) -> int | None:
        """The generation of ``index`` here, or None when this shard does not hold it."""
        return self._mirror.generation(index)

    def _check_dim(self, index: str, dim: int) -> None:
        existing = self._mirror.require(index)
        if existing != dim:
            raise DimensionMismatchError(f"index {index!r} holds {existing}-d vectors, got {dim}-d")

    def ensure_index(self, index: str, dim: int) -> int:
        """The generation of ``index``, creating the index (empty, next generation) when absent.
        Atomic under the write lock: two first writes agree on one index and one generation."""
        if dim < 1:
            raise ValueError("dim must be positive")
        held, gen = self._mirror.dim(index), self._mirror.generation(index)
        if held == dim and gen is not None:  # the common case, without waiting for the write lock
            return gen
        with self._write_lock:
            held_gen = self._mirror.generation(index)
            if held_gen is not None:
                self._check_dim(index, dim)
                return held_gen
            gen = self._next_generation(index)
            with self._transaction() as db:
                db.execute(
                    "INSERT INTO indexes (name, dim, created_at, generation) VALUES (?, ?, ?, ?)",
                    (index, dim, time.time(), gen),
                )
            try:
                self._mirror.install(index, dim, gen)
            finally:
                self._changed(index)
            return gen

    def create_index(self, index: str, dim: int) -> None:
        self.ensure_index(index, dim)

    def drop_index(self, index: str, generation: int | None = None) -> bool:
        """Drop ``index``; with ``generation``, only that generation or an older one (a newer one,
        created after the drop was decided, stays), and remember it as dropped either way so a late
        write of it is refused. True when something was dropped here."""
        with self._write_lock:
            held = self._mirror.generation(index)
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
                try:
                    self._mirror.forget(index)
                finally:
                    self._gone(index)
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
            held = self._mirror.generation(index)
            if held is not None and staging not in self._mirror and self._origin(index) == staging:
                return held  # this swap already happened: a retried call (the shard actor restarted)
            if expect_staged and staging not in self._mirror:
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
            sdim = self._mirror.dim(staging)
            new_dim = sdim or dim or self._mirror.dim(index)
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
            try:  # committed: stamped even when the FAISS side fails after (see upsert)
                staged = self._mirror.get(staging)
                if sdim is not None:
                    self._mirror.forget(staging)
                if held is not None and not merge:
                    self._mirror.forget(index)
                self._mirror.remove_snapshot(index)
                if merge and sdim is not None:
                    self._mirror.reload(index, new_dim)
                elif not merge:
                    self._mirror.install(index, new_dim, gen, staged)
                self._mirror.mark_changed(index)  # snapshot it at the next opportunity
            finally:
                self._gone(staging)
                self._changed(index)
            return gen

    def created_at(self, index: str) -> float | None:
        """When ``index`` was created here (seconds since the epoch), None when absent."""
        row = self._write.execute("SELECT created_at FROM indexes WHERE name = ?", (index,)).fetchone()
        return None if row is None else float(row[0])

    def _origin(self, index: str) -> str | None:
        row = self._write.execute("SELECT origin FROM indexes WHERE name = ?", (index,)).fetchone()
        return None if row is None else row[0]

    def _drop_locked(self, index: str) -> None:
        if index in self._mirror:
            with self._transaction() as db:
                self._delete_rows(db, index)
            try:
                self._mirror.forget(index)
            finally:
                self._gone(index)

    def count_documents(self, index: str) -> int:
        self._require(index)
        db = self._readers.get()
        return db.execute("SELECT COUNT(*) FROM documents WHERE index_name = ?", (index,)).fetchone()[0]

    def count_chunks(self, index: str) -> int:
        self._require(index)
        return self._readers.get().execute("SELECT COUNT(*) FROM chunks WHERE index_name = ?", (index,)).fetchone()[0]

    # --- writes -------------------------------------------------------------------------------
    def upsert_documents(
        self,
        index: str,
        docs: list[DocumentWrite],
        *,
        only_existing: bool = False,
        if_absent: bool = False,
        generation: int | None = None,
        expected: dict[str, str] | None = None,
    ) -> list[str]:
        """Insert or replace documents with their chunks, in one transaction; returns the doc ids
        written. ``only_existing`` (updates) skips documents that are no longer there when the
        transaction runs, so an update racing a delete cannot bring the document back; with it,
        ``expected`` (doc id -> hash) skips a named document whose stored hash is another by then
        (a compare-and-set: a write of another client since the caller read it stands).
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
            held = self._mirror.generation(index)
            stale = False  # the shard still holds an older generation than the writer's: drop it
            if held is not None and generation is not None and held not in (0, generation):
                if held > generation:
                    raise IndexDroppedError(index, generation)
                if only_existing:
                    return []
                stale = True
            create = held is None or stale
            if create:
                # dropped first: an update racing a drop is the drop's 409, not "no such document"
                if generation is not None and generation <= self._dropped_through(index):
                    raise IndexDroppedError(index, generation)
                if only_existing:
                    return []
                if not dims:
                    raise ValueError("cannot create an index from documents without chunks")
                dim = next(iter(dims))
                gen = generation if generation is not None else self._next_generation(index)
            else:
                assert held is not None  # not created: the index is held
                dim = self._mirror.require(index)
                if dims and dims != {dim}:
                    raise DimensionMismatchError(f"index {index!r} holds {dim}-d vectors, got {dims.pop()}-d")
                gen = generation if generation is not None else held
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
                    for part in chunked([d.doc_id for d in docs]):
                        marks = ",".join("?" * len(part))
                        present.update(
                            db.execute(
                                "SELECT doc_id, hash_value FROM documents "
                                f"WHERE index_name = ? AND doc_id IN ({marks})",
                                (index, *part),
                            ).fetchall()
                        )
                    docs = [d for d in docs if (d.doc_id in present) == only_existing]
                    if expected:
                        docs = [
                            d for d in docs if expected.get(d.doc_id, present.get(d.doc_id)) == present.get(d.doc_id)
                        ]
                doc_ids = [d.doc_id for d in docs]
                old_ids: list[int] = []
                for part in chunked(doc_ids):
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
            # committed; still under the write lock, so FAISS follows in commit order. The stamp comes
            # last but always: a snapshot that fails after the rows are searchable still changed them
            try:
                if stale:
                    self._mirror.forget(index)
                if create:
                    self._mirror.install(index, dim, gen)
                elif held == 0 and generation:
                    self._mirror.set_generation(index, generation)
                self._mirror.apply(index, old_ids, new_ids, vectors)
                self._mirror.after_write(index, len(old_ids) + len(new_ids), self.snapshot_every)
            finally:
                if docs or create or stale:  # not when every document was filtered out (nothing changed)
                    self._changed(index)
            return doc_ids

    def delete_documents(
        self, index: str, doc_ids: list[str], expected: dict[str, str] | None = None
    ) -> tuple[list[str], list[str]]:
        """Delete documents by id, in one transaction; returns (deleted, not found). ``expected``
        (doc id -> hash): a named document whose stored hash is another is left (in neither list)."""
        unique = list(dict.fromkeys(doc_ids))
        with self._write_lock:
            self._require(index)
            with self._transaction() as db:
                present: dict[str, str] = {}
                for part in chunked(unique):
                    marks = ",".join("?" * len(part))
                    present.update(
                        db.execute(
                            f"SELECT doc_id, hash_value FROM documents WHERE index_name = ? AND doc_id IN ({marks})",
                            (index, *part),
                        ).fetchall()
                    )
                want = expected or {}
                targets = [d for d in unique if d in present and want.get(d, present[d]) == present[d]]
                removed: list[int] = []
                for part in chunked(targets):
                    marks = ",".join("?" * len(part))
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
            try:  # committed: stamped even when FAISS or its snapshot fails after (see upsert)
                if removed:
                    self._mirror.apply(index, removed, [], [])
                    self._mirror.after_write(index, len(removed), self.snapshot_every)
            finally:
                if targets or removed:
                    self._changed(index)
        return targets, [d for d in unique if d not in present]

    # --- reads --------------------------------------------------------------------------------
    def find_by_hash(self, index: str, hashes: list[str]) -> dict[str, str]:
        self._require(index)
        found: dict[str, str] = {}
        for part in chunked(list(dict.fromkeys(hashes))):
            marks = ",".join("?" * len(part))
            for h, doc_id in self._readers.get().execute(
                f"SELECT hash_value, doc_id FROM documents WHERE index_name = ? AND hash_value IN ({marks}) "
                "ORDER BY seq",
                (index, *part),
            ):
                found.setdefault(h, doc_id)
        return found

    def get_documents(self, index: str, doc_ids: list[str]) -> dict[str, StoredDocument]:
        self._require(index)
        out: dict[str, StoredDocument] = {}
        for part in chunked(list(dict.fromkeys(doc_ids))):
            marks = ",".join("?" * len(part))
            for doc_id, text, meta, h in self._readers.get().execute(
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
        db = self._readers.get()
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

    # --- search (ragserve.store.search) -------------------------------------------------------
    def search(
        self, index: str, vector: np.ndarray, k: int, metadata_filter: dict[str, Any] | None = None
    ) -> list[SearchHit]:
        """Top ``k`` chunks by cosine score (dense only)."""
        return dense_search(self._readers, self._mirror, index, vector, k, metadata_filter)

    def mentioned(self, index: str, words: list[str]) -> list[str]:
        """Those of ``words`` some chunk of ``index`` holds (``ragserve.store.search.mentioned``)."""
        if not self.has_index(index):
            raise IndexNotFoundError(index)
        return mentioned(self._readers, index, words)

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
        """A retrieval's dense and lexical candidates from this shard, in one call
        (``ragserve.store.search.candidates``, which says what each argument does)."""
        return candidates(
            self._readers,
            self._mirror,
            index,
            vector,
            text,
            k,
            mode=mode,
            metadata_filter=metadata_filter,
            min_match=min_match,
            max_postings=max_postings,
        )

    # --- durability ---------------------------------------------------------------------------
    def snapshot(self) -> None:
        with self._write_lock:
            for index in self._mirror.names():
                self._mirror.snapshot(index)

    def export_index(self, index: str, dest_file: str | Path) -> int:
        from ragserve.store.export import export_index

        dim = self._require(index)
        return export_index(self.db_path, index, dim, Path(dest_file))

    def close(self) -> None:
        if self._closed:
            return
        self.snapshot()
        self._closed = True
        self._readers.close()
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
        db = self._readers.get()
        with self._write_lock:
            dim = self._mirror.dim(index)
            if dim is None:
                return None
            db.execute("BEGIN")
            try:
                db.execute("SELECT 1 FROM chunks LIMIT 1").fetchall()  # the read snapshot starts here
                vectors = self._mirror.ntotal(index)
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
