"""The shard's SQLite schema: the source of truth for documents, chunks and vectors.

Chunk ids are AUTOINCREMENT so an id is never reused: it is the FAISS id (and the lexical index's
rowid), and the change log can replay adds and deletes after a snapshot without ambiguity.

Versions: 1 chunks and documents; 2 index generations (``indexes.generation``, ``origin``,
``dropped_indexes``); 3 the lexical index (``chunks_fts``, ``ragserve.store.lexical``); 4 its ``idx``
column (each row's index, so a lexical search walks only its own index's postings).
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ragserve.store.lexical import create_lexical_index

SCHEMA_VERSION = 4
SQL_VARS = 900  # stay under SQLite's host-parameter limit
log = logging.getLogger("ragserve.store")

DDL = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS indexes (name TEXT PRIMARY KEY, dim INTEGER NOT NULL, created_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS documents (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    index_name TEXT NOT NULL,
    doc_id TEXT NOT NULL,
    text TEXT NOT NULL,
    metadata TEXT NOT NULL,
    hash_value TEXT NOT NULL,
    updated_at REAL NOT NULL,
    UNIQUE (index_name, doc_id)
);
CREATE INDEX IF NOT EXISTS documents_by_hash ON documents (index_name, hash_value);
CREATE TABLE IF NOT EXISTS chunks (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    index_name TEXT NOT NULL,
    doc_id TEXT NOT NULL,
    node_id TEXT NOT NULL,
    chunk_index INTEGER NOT NULL,
    text TEXT NOT NULL,
    vector BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS chunks_by_doc ON chunks (index_name, doc_id);
CREATE TABLE IF NOT EXISTS changes (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    index_name TEXT NOT NULL,
    op TEXT NOT NULL CHECK (op IN ('add', 'del')),
    chunk_id INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS changes_by_index ON changes (index_name, seq);
CREATE TABLE IF NOT EXISTS dropped_indexes (name TEXT PRIMARY KEY, generation INTEGER NOT NULL);
"""


def connect(path: str | Path, *, readonly: bool = False) -> sqlite3.Connection:
    """A connection in WAL mode with ``synchronous=FULL``: a committed write survives a crash of the
    process and of the machine; readers never block the writer."""
    conn = sqlite3.connect(str(path), timeout=30.0, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA foreign_keys=ON")
    if readonly:
        conn.execute("PRAGMA query_only=ON")
    return conn


@contextmanager
def write_transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One write transaction on ``conn`` (opened by :func:`connect`: no implicit transactions),
    taken at once (``IMMEDIATE``: two writers never both read a state and then both change it),
    committed when the block ends, rolled back when it raises. The caller holds whatever lock
    keeps other threads off ``conn`` meanwhile."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def chunked(seq: list[Any], size: int = SQL_VARS) -> Iterator[list[Any]]:
    """``seq`` in slices of at most ``size``: one ``IN (...)`` statement per slice."""
    for i in range(0, len(seq), size):
        yield seq[i : i + size]


def create_schema(conn: sqlite3.Connection) -> None:
    """Create the tables, and bring an older file up to date: ``indexes.generation`` (0 for
    indexes created before generations existed), ``indexes.origin`` and ``dropped_indexes`` (the highest generation of
    each name ever dropped, so a late write for a dropped index is refused instead of reviving it);
    the lexical index, filled from the chunk rows already there."""
    conn.executescript(DDL)
    columns = {r[1] for r in conn.execute("PRAGMA table_info(indexes)")}
    if "generation" not in columns:
        conn.execute("ALTER TABLE indexes ADD COLUMN generation INTEGER NOT NULL DEFAULT 0")
    if "origin" not in columns:  # the staging index a load swapped in (makes a retried swap a no-op)
        conn.execute("ALTER TABLE indexes ADD COLUMN origin TEXT")
    if create_lexical_index(conn):
        n = conn.execute("SELECT COUNT(*) FROM chunks").fetchone()[0]
        if n:
            log.info("built the lexical index of %d existing chunks", n)
    conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),))
    conn.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
