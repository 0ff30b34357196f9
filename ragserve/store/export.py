"""Portable snapshots of one index's part on one shard: a self-contained SQLite file.

Portable because it holds documents with their chunks and vectors, not shard internals: a snapshot
taken with N shards can be loaded into any number of shards (each document is routed again).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ragserve.store.schema import connect
from ragserve.store.types import ChunkWrite, DocumentWrite

EXPORT_FORMAT = 1

_EXPORT_DDL = """
CREATE TABLE exp.info (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE exp.documents (seq INTEGER PRIMARY KEY, doc_id TEXT NOT NULL UNIQUE, text TEXT NOT NULL,
                            metadata TEXT NOT NULL, hash_value TEXT NOT NULL);
CREATE TABLE exp.chunks (doc_id TEXT NOT NULL, node_id TEXT NOT NULL, chunk_index INTEGER NOT NULL,
                         text TEXT NOT NULL, vector BLOB NOT NULL);
"""


def export_index(db_path: Path, index: str, dim: int, dest: Path) -> int:
    """Copy ``index`` from the shard database at ``db_path`` into a new file ``dest``, inside one
    read transaction (a consistent cut even while writes continue). Returns the document count."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(dest.suffix + ".tmp")
    tmp.unlink(missing_ok=True)
    conn = connect(db_path)
    try:
        conn.execute("ATTACH DATABASE ? AS exp", (str(tmp),))
        # one self-contained file in rollback-journal mode: readers then need no -wal/-shm files and
        # no write lock (every shard reads every part of a snapshot at once on /load)
        conn.execute("PRAGMA exp.journal_mode=DELETE")
        conn.executescript(_EXPORT_DDL)
        conn.execute("BEGIN")
        conn.executemany(
            "INSERT INTO exp.info (key, value) VALUES (?, ?)",
            [("format", str(EXPORT_FORMAT)), ("dim", str(dim)), ("index_name", index)],
        )
        conn.execute(
            "INSERT INTO exp.documents (seq, doc_id, text, metadata, hash_value) "
            "SELECT seq, doc_id, text, metadata, hash_value FROM main.documents WHERE index_name = ?",
            (index,),
        )
        conn.execute(
            "INSERT INTO exp.chunks (doc_id, node_id, chunk_index, text, vector) "
            "SELECT doc_id, node_id, chunk_index, text, vector FROM main.chunks WHERE index_name = ? "
            "ORDER BY id",
            (index,),
        )
        count = conn.execute("SELECT COUNT(*) FROM exp.documents").fetchone()[0]
        conn.execute("COMMIT")
        conn.execute("CREATE INDEX exp.chunks_by_doc ON chunks (doc_id, chunk_index)")
        conn.execute("DETACH DATABASE exp")
    finally:
        conn.close()
    tmp.replace(dest)
    return count


def read_export(src_file: str | Path) -> tuple[int, Iterator[DocumentWrite]]:
    """(dim, documents in their original order) of an export file.

    Opened read-only and immutable (an export never changes once written): no locks and no pragma
    that writes, so any number of shards can read the same part at once. Opening it like a shard
    database (WAL, ``journal_mode`` set on open) made concurrent readers fail with "database is
    locked"."""
    conn = sqlite3.connect(
        f"{Path(src_file).resolve().as_uri()}?mode=ro&immutable=1", uri=True, check_same_thread=False
    )
    info = dict(conn.execute("SELECT key, value FROM info").fetchall())
    if int(info.get("format", 0)) != EXPORT_FORMAT:
        conn.close()
        raise ValueError(f"{src_file}: unsupported snapshot format {info.get('format')!r}")
    dim = int(info["dim"])

    def documents() -> Iterator[DocumentWrite]:
        try:
            docs = conn.execute("SELECT doc_id, text, metadata, hash_value FROM documents ORDER BY seq").fetchall()
            for doc_id, text, meta, h in docs:
                chunks = [
                    ChunkWrite(node_id=n, chunk_index=i, text=t, vector=np.frombuffer(v, dtype=np.float32).copy())
                    for n, i, t, v in conn.execute(
                        "SELECT node_id, chunk_index, text, vector FROM chunks WHERE doc_id = ? ORDER BY chunk_index",
                        (doc_id,),
                    )
                ]
                yield DocumentWrite(doc_id=doc_id, text=text, metadata=json.loads(meta), hash_value=h, chunks=chunks)
        finally:
            conn.close()

    return dim, documents()
