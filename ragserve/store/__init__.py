"""One shard's durable storage: SQLite (truth) + FAISS (derived, snapshotted)."""

from ragserve.api.index_spec import INDEX_KINDS, IndexSpec
from ragserve.store.export import read_export
from ragserve.store.faiss_index import VectorIndex
from ragserve.store.shard import Shard
from ragserve.store.types import (
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
