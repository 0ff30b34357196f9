"""The durable record of OpenAI vector stores and the files attached to them (one SQLite file,
``<storage_dir>/vector_stores.sqlite3``, WAL with ``synchronous=FULL``: what was acknowledged
survives a crash).

It holds what only the Vector Stores API knows: a store's name, description and metadata, and for
each attached file its attributes, chunking and the ingestion job that indexes it. Nothing here
says whether a file is indexed: that is its job item's status (``ragserve.jobs``), read when a file
is shown, so a file can never be reported done while its job is not. The documents themselves live
in the index named by the store's id, like any other index.

Synchronous and thread-safe (one connection behind a lock): the async service calls it through
``asyncio.to_thread``.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ragserve.store.schema import connect, write_transaction

SCHEMA = """
CREATE TABLE IF NOT EXISTS stores (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    name TEXT NOT NULL,
    description TEXT,
    metadata TEXT NOT NULL,
    chunking TEXT,
    created_at INTEGER NOT NULL,
    last_active_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS store_files (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    store_id TEXT NOT NULL,
    file_id TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    attributes TEXT NOT NULL,
    chunking TEXT,
    job_id TEXT NOT NULL,
    UNIQUE (store_id, file_id)
);
CREATE INDEX IF NOT EXISTS store_files_by_job ON store_files (job_id);
-- What a detach or a store's deletion still has to remove from the index (a file's documents; with
-- file_id NULL, the store's whole index), written in the transaction that forgets the file or the
-- store and deleted once removed: a crash between the two leaves a row that the next start resumes.
CREATE TABLE IF NOT EXISTS removals (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    store_id TEXT NOT NULL,
    file_id TEXT
);
"""


@dataclass(frozen=True)
class Removal:
    """A removal still owed (``removals``): ``file_id`` None is the store's whole index."""

    seq: int
    store_id: str
    file_id: str | None


Order = Literal["asc", "desc"]


@dataclass(frozen=True)
class StoreRecord:
    id: str
    name: str
    description: str | None
    metadata: dict[str, str]
    chunking: dict[str, int] | None  # the store's default static chunking, None: the server's
    created_at: int
    last_active_at: int


@dataclass(frozen=True)
class StoreFileRecord:
    store_id: str
    file_id: str
    created_at: int
    attributes: dict[str, Any]
    chunking: dict[str, int] | None
    job_id: str


def _store(row: sqlite3.Row | tuple[Any, ...]) -> StoreRecord:
    sid, name, description, metadata, chunking, created, active = row
    return StoreRecord(
        sid, name, description, json.loads(metadata), json.loads(chunking) if chunking else None, created, active
    )


def _file(row: sqlite3.Row | tuple[Any, ...]) -> StoreFileRecord:
    sid, fid, created, attributes, chunking, job = row
    return StoreFileRecord(sid, fid, created, json.loads(attributes), json.loads(chunking) if chunking else None, job)


_STORE_COLS = "id, name, description, metadata, chunking, created_at, last_active_at"
_FILE_COLS = "store_id, file_id, created_at, attributes, chunking, job_id"


class VectorStoreCatalog:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = connect(self.path)
        self._conn.executescript(SCHEMA)
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock, write_transaction(self._conn) as conn:
            yield conn

    # --- stores ---------------------------------------------------------------------------------
    def create_store(
        self,
        store_id: str,
        name: str,
        description: str | None,
        metadata: dict[str, str],
        chunking: dict[str, int] | None,
        files: list[tuple[str, dict[str, Any], dict[str, int] | None]],
        job_id: str | None,
    ) -> StoreRecord:
        """A new store, with ``files`` (file id, attributes, chunking) attached under ``job_id`` in
        the same transaction: a store is never seen with half its initial files."""
        now = int(time.time())
        with self._tx() as c:
            c.execute(
                "INSERT INTO stores (id, name, description, metadata, chunking, created_at, last_active_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    store_id,
                    name,
                    description,
                    json.dumps(metadata),
                    json.dumps(chunking) if chunking else None,
                    now,
                    now,
                ),
            )
            self._put_files(c, store_id, files, job_id or "", now)
        return StoreRecord(store_id, name, description, metadata, chunking, now, now)

    def get_store(self, store_id: str) -> StoreRecord | None:
        with self._lock:
            row = self._conn.execute(f"SELECT {_STORE_COLS} FROM stores WHERE id = ?", (store_id,)).fetchone()
        return _store(row) if row else None

    def list_stores(
        self, limit: int, order: Order = "desc", after: str | None = None, before: str | None = None
    ) -> tuple[list[StoreRecord], bool]:
        """A page of stores by creation order, and whether more follow."""
        rows, more = self._page("stores", f"SELECT {_STORE_COLS} FROM stores", "id", [], limit, order, after, before)
        return [_store(r) for r in rows], more

    def update_store(self, store_id: str, name: str | None, metadata: dict[str, str] | None) -> StoreRecord | None:
        with self._tx() as c:
            if name is not None:
                c.execute("UPDATE stores SET name = ? WHERE id = ?", (name, store_id))
            if metadata is not None:
                c.execute("UPDATE stores SET metadata = ? WHERE id = ?", (json.dumps(metadata), store_id))
            c.execute("UPDATE stores SET last_active_at = ? WHERE id = ?", (int(time.time()), store_id))
            row = c.execute(f"SELECT {_STORE_COLS} FROM stores WHERE id = ?", (store_id,)).fetchone()
        return _store(row) if row else None

    def touch(self, store_id: str) -> None:
        with self._tx() as c:
            c.execute("UPDATE stores SET last_active_at = ? WHERE id = ?", (int(time.time()), store_id))

    def delete_store(self, store_id: str) -> tuple[list[StoreFileRecord], Removal] | None:
        """Forget the store and its files, recording the removal of its index; returns the files it
        had and that removal (None: no such store)."""
        with self._tx() as c:
            if c.execute("SELECT 1 FROM stores WHERE id = ?", (store_id,)).fetchone() is None:
                return None
            files = [
                _file(r) for r in c.execute(f"SELECT {_FILE_COLS} FROM store_files WHERE store_id = ?", (store_id,))
            ]
            c.execute("DELETE FROM store_files WHERE store_id = ?", (store_id,))
            c.execute("DELETE FROM stores WHERE id = ?", (store_id,))
            seq = c.execute("INSERT INTO removals (store_id, file_id) VALUES (?, NULL)", (store_id,)).lastrowid
        assert seq is not None
        return files, Removal(seq, store_id, None)

    def pending_removals(self) -> list[Removal]:
        """The removals not done yet, oldest first."""
        with self._lock:
            rows = self._conn.execute("SELECT seq, store_id, file_id FROM removals ORDER BY seq").fetchall()
        return [Removal(*r) for r in rows]

    def removal_done(self, seq: int) -> None:
        with self._tx() as c:
            c.execute("DELETE FROM removals WHERE seq = ?", (seq,))

    # --- files ----------------------------------------------------------------------------------
    @staticmethod
    def _put_files(
        c: sqlite3.Connection,
        store_id: str,
        files: list[tuple[str, dict[str, Any], dict[str, int] | None]],
        job_id: str,
        now: int,
    ) -> None:
        # a file attached again is indexed again, by the new job, with the new attributes; it keeps
        # its place (seq) in the listing
        c.executemany(
            "INSERT INTO store_files (store_id, file_id, created_at, attributes, chunking, job_id) "
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (store_id, file_id) DO UPDATE SET "
            "created_at = excluded.created_at, attributes = excluded.attributes, "
            "chunking = excluded.chunking, job_id = excluded.job_id",
            [
                (store_id, fid, now, json.dumps(attrs), json.dumps(chunking) if chunking else None, job_id)
                for fid, attrs, chunking in files
            ],
        )

    def attach(
        self, store_id: str, files: list[tuple[str, dict[str, Any], dict[str, int] | None]], job_id: str
    ) -> bool:
        """Attach ``files`` to the store under ``job_id``; False if the store is gone."""
        now = int(time.time())
        with self._tx() as c:
            if c.execute("SELECT 1 FROM stores WHERE id = ?", (store_id,)).fetchone() is None:
                return False
            self._put_files(c, store_id, files, job_id, now)
            c.execute("UPDATE stores SET last_active_at = ? WHERE id = ?", (now, store_id))
        return True

    def get_file(self, store_id: str, file_id: str) -> StoreFileRecord | None:
        with self._lock:
            row = self._conn.execute(
                f"SELECT {_FILE_COLS} FROM store_files WHERE store_id = ? AND file_id = ?", (store_id, file_id)
            ).fetchone()
        return _file(row) if row else None

    def files_by_id(self, store_id: str, file_ids: list[str]) -> dict[str, StoreFileRecord]:
        out: dict[str, StoreFileRecord] = {}
        with self._lock:
            for i in range(0, len(file_ids), 500):
                part = file_ids[i : i + 500]
                marks = ",".join("?" * len(part))
                for r in self._conn.execute(
                    f"SELECT {_FILE_COLS} FROM store_files WHERE store_id = ? AND file_id IN ({marks})",
                    (store_id, *part),
                ):
                    rec = _file(r)
                    out[rec.file_id] = rec
        return out

    def all_files(self, store_id: str, job_id: str | None = None) -> list[StoreFileRecord]:
        sql = f"SELECT {_FILE_COLS} FROM store_files WHERE store_id = ?"
        args: list[Any] = [store_id]
        if job_id is not None:
            sql += " AND job_id = ?"
            args.append(job_id)
        with self._lock:
            return [_file(r) for r in self._conn.execute(sql + " ORDER BY seq", args)]

    def set_attributes(self, store_id: str, file_id: str, attributes: dict[str, Any]) -> StoreFileRecord | None:
        with self._tx() as c:
            c.execute(
                "UPDATE store_files SET attributes = ? WHERE store_id = ? AND file_id = ?",
                (json.dumps(attributes), store_id, file_id),
            )
            row = c.execute(
                f"SELECT {_FILE_COLS} FROM store_files WHERE store_id = ? AND file_id = ?", (store_id, file_id)
            ).fetchone()
        return _file(row) if row else None

    def detach(self, store_id: str, file_id: str) -> tuple[StoreFileRecord, Removal] | None:
        """Forget an attached file, recording the removal of its documents; returns what it was and
        that removal (None: it was not attached)."""
        with self._tx() as c:
            row = c.execute(
                f"SELECT {_FILE_COLS} FROM store_files WHERE store_id = ? AND file_id = ?", (store_id, file_id)
            ).fetchone()
            if row is None:
                return None
            c.execute("DELETE FROM store_files WHERE store_id = ? AND file_id = ?", (store_id, file_id))
            seq = c.execute("INSERT INTO removals (store_id, file_id) VALUES (?, ?)", (store_id, file_id)).lastrowid
        assert seq is not None
        return _file(row), Removal(seq, store_id, file_id)

    def stores_of_file(self, file_id: str) -> list[str]:
        with self._lock:
            return [r[0] for r in self._conn.execute("SELECT store_id FROM store_files WHERE file_id = ?", (file_id,))]

    # --- paging ---------------------------------------------------------------------------------
    def _page(
        self,
        table: str,
        select: str,
        id_col: str,
        where: list[tuple[str, Any]],
        limit: int,
        order: Order,
        after: str | None,
        before: str | None,
    ) -> tuple[list[Any], bool]:
        """OpenAI's cursor paging over ``table`` in insertion order: ``after``/``before`` name an
        object of the previous page (an id that is not there is a page from the start: the object
        may have been deleted since)."""
        conds = [c for c, _ in where]
        args = [a for _, a in where]
        desc = order == "desc"
        with self._lock:
            for cursor, later in ((after, not desc), (before, desc)):
                if cursor is None:
                    continue
                scope = "".join(f" AND {c}" for c, _ in where)
                found = self._conn.execute(
                    f"SELECT seq FROM {table} WHERE {id_col} = ?{scope}", (cursor, *(a for _, a in where))
                ).fetchone()
                if found is not None:
                    conds.append("seq > ?" if later else "seq < ?")
                    args.append(found[0])
            sql = select + (" WHERE " + " AND ".join(conds) if conds else "")
            # ``before`` alone: the objects just before the cursor, read backwards then put in order
            backwards = before is not None and after is None
            sql_desc = desc != backwards
            sql += f" ORDER BY seq {'DESC' if sql_desc else 'ASC'} LIMIT ?"
            rows = self._conn.execute(sql, [*args, limit + 1]).fetchall()
        more = len(rows) > limit
        rows = rows[:limit]
        if backwards:
            rows.reverse()
        return rows, more

    def list_files(
        self,
        store_id: str,
        limit: int,
        order: Order = "desc",
        after: str | None = None,
        before: str | None = None,
        job_id: str | None = None,
    ) -> tuple[list[StoreFileRecord], bool]:
        where: list[tuple[str, Any]] = [("store_id = ?", store_id)]
        if job_id is not None:
            where.append(("job_id = ?", job_id))
        rows, more = self._page(
            "store_files", f"SELECT {_FILE_COLS} FROM store_files", "file_id", where, limit, order, after, before
        )
        return [_file(r) for r in rows], more
