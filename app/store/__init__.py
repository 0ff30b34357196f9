"""One shard's durable storage: SQLite (truth) + FAISS (derived, snapshotted)."""

from app.index_spec import INDEX_KINDS, IndexSpec
from app.store.export import read_export
from app.store.faiss_index import VectorIndex
from app.store.shard import Shard
from app.store.types import (
    ChunkWrite,
    DimensionMismatchError,
    DocumentWrite,
    IndexNotFoundError,
    SearchCandidates,
    SearchHit,
    StoredDocument,
)

__all__ = [
    "INDEX_KINDS",
    "ChunkWrite",
    "DimensionMismatchError",
    "DocumentWrite",
    "IndexNotFoundError",
    "IndexSpec",
    "SearchCandidates",
    "SearchHit",
    "Shard",
    "StoredDocument",
    "VectorIndex",
    "read_export",
]
