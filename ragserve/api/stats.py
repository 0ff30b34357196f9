"""``GET /indexes/{name}/stats``: how big an index is, in total and shard by shard."""

from __future__ import annotations

from pydantic import BaseModel, Field


class ShardStats(BaseModel):
    """One shard's part of an index."""

    shard: int
    documents: int
    chunks: int
    bytes: int = Field(description="UTF-8 bytes of the documents' text stored in this shard.")
    vectors: int = Field(description="Vectors in the shard's FAISS index (HNSW keeps deleted ones until a rebuild).")


class IndexStats(BaseModel):
    """Totals over every shard holding part of the index."""

    index_name: str
    documents: int
    chunks: int
    bytes: int = Field(description="UTF-8 bytes of the documents' text.")
    vectors: int
    vector_bytes: int = Field(description="float32 vector storage: vectors × dimension × 4.")
    dimension: int | None
    index_kind: str = Field(description="flat, ivf or hnsw (Settings.faiss_index_kind); 'mixed' while shards differ.")
    shards: list[ShardStats]
