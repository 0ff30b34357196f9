"""One shard's durable storage: SQLite (truth) + FAISS (derived, snapshotted)."""

from app.store.export import read_export
from app.store.faiss_index import make_faiss_index
from app.store.shard import Shard
from app.store.types import (
    ChunkWrite,
    DimensionMismatchError,
    DocumentWrite,
    IndexNotFoundError,
    SearchHit,
    StoredDocument,
)

__all__ = [
    "ChunkWrite",
    "DimensionMismatchError",
    "DocumentWrite",
    "IndexNotFoundError",
    "SearchHit",
    "Shard",
    "StoredDocument",
    "make_faiss_index",
    "read_export",
]
