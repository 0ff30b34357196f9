"""What the MCP tools answer (``ragserve.agent``): results an agent can cite.

Each search result names its index, its document and node, where the document came from (a path or
URL and a title, read from its metadata) and its text, so an answer built on it can say where each
fact was found and fetch the whole document when a passage is not enough.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from ragserve.api.documents import DocumentRecord, NodeWithScore

#: Metadata keys read as where a document came from, in order (the CLI's ``path`` first).
SOURCE_KEYS = ("path", "url", "file_path", "file_name", "filename", "source")


def source_of(metadata: dict[str, Any]) -> str | None:
    """Where a document came from, as its metadata says: the first of :data:`SOURCE_KEYS` that holds text."""
    return next((str(v) for k in SOURCE_KEYS if isinstance(v := metadata.get(k), str) and v), None)


def title_of(metadata: dict[str, Any]) -> str | None:
    title = metadata.get("title")
    return title if isinstance(title, str) and title else None


class IndexList(BaseModel):
    """The indexes the caller's key may read."""

    indexes: list[str]
    count: int


class SearchResult(BaseModel):
    index_name: str = Field(description="The index it is from.")
    doc_id: str = Field(description="Its document: fetch_document(index_name, doc_id) returns the whole text.")
    node_id: str
    score: float = Field(description="Cosine similarity to the query.")
    rank_score: float | None = Field(default=None, description="The fused score results are ordered by (hybrid).")
    source: str | None = Field(default=None, description="Where the document came from (path or URL), if known.")
    title: str | None = None
    text: str = Field(description="The passage, verbatim.")
    metadata: dict[str, Any] = Field(default_factory=dict)

    @classmethod
    def of(cls, node: NodeWithScore, index: str) -> SearchResult:
        """``node`` as a result (``index``: the index searched, when the node does not name one)."""
        return cls(
            index_name=node.index_name or index,
            doc_id=node.doc_id,
            node_id=node.node_id,
            score=node.score,
            rank_score=node.rerank_score if node.rerank_score is not None else node.fused_score,
            source=source_of(node.metadata),
            title=title_of(node.metadata),
            text=node.text,
            metadata=node.metadata,
        )


class SearchResults(BaseModel):
    query: str
    indexes: list[str] = Field(description="The indexes searched.")
    results: list[SearchResult] = Field(description="Best first, one ranking across the indexes.")
    count: int


class FetchedDocument(BaseModel):
    index_name: str
    doc_id: str
    source: str | None = None
    title: str | None = None
    text: str
    is_truncated: bool = Field(description="The text was cut to max_chars: ask for more to read the rest.")
    metadata: dict[str, Any] = Field(default_factory=dict)

    @classmethod
    def of(cls, record: DocumentRecord, index: str) -> FetchedDocument:
        return cls(
            index_name=index,
            doc_id=record.doc_id,
            source=source_of(record.metadata),
            title=title_of(record.metadata),
            text=record.text,
            is_truncated=record.is_truncated,
            metadata=record.metadata,
        )
