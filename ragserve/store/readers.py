"""A shard's read connections: one read-only SQLite connection per thread.

WAL lets readers read while the single writer is in a transaction, but one connection cannot run two
transactions at once, so each thread reads through its own (``index_stats`` and ``list_documents``
hold a read transaction across several statements). They are opened on a thread's first read and
all closed with the shard.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from ragserve.store.schema import connect


class Readers:
    def __init__(self, db_path: Path):
        self._db_path = db_path
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._lock = threading.Lock()

    def get(self) -> sqlite3.Connection:
        """This thread's read connection, opened on first use."""
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = connect(self._db_path, readonly=True)
            self._local.conn = conn
            with self._lock:
                self._all.append(conn)
        return conn

    def close(self) -> None:
        with self._lock:
            for conn in self._all:
                conn.close()
            self._all.clear()
