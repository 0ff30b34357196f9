"""Document API models, shaped after KAITO RAGEngine's REST API (ARCHITECTURE §8)."""

from __future__ import annotations

import re
from typing import Any

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator

INDEX_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
INDEX_NAME_RULE = (
    "index names are 1-128 characters: letters, digits, '_', '-' and '.', starting with a letter or digit"
)

# Metadata values a filter can match on; nested objects are stored but not filterable.
MetadataValue = str | int | float | bool | None


def validate_index_name(name: str) -> str:
    """Raise ``ValueError`` with the rule when ``name`` is not a valid index name."""
    if not INDEX_NAME_RE.match(name) or name in {".", ".."}:
        raise ValueError(f"invalid index name {name!r}: {INDEX_NAME_RULE}")
    return name


def validate_metadata_filter(flt: dict[str, Any] | None) -> dict[str, Any] | None:
    """A filter is ``{key: scalar}``, matched by equality; all keys must match."""
    if flt is None:
        return None
    if not isinstance(flt, dict):
        raise ValueError("metadata_filter must be a JSON object of key: value pairs")
    for k, v in flt.items():
        if not isinstance(k, str) or not k:
            raise ValueError("metadata_filter keys must be non-empty strings")
        if not isinstance(v, str | int | float | bool) and v is not None:
            raise ValueError(f"metadata_filter[{k!r}] must be a string, number, boolean or null")
    return flt


class Document(BaseModel):
    """A document to index: text plus optional metadata and client-chosen id."""

    model_config = ConfigDict(extra="forbid")
    text: str = Field(min_length=1)
    metadata: dict[str, Any] = Field(default_factory=dict)
    doc_id: str | None = Field(default=None, min_length=1, max_length=256)


class IndexRequest(BaseModel):
    """``POST /index``: create an index or extend it with documents."""

    model_config = ConfigDict(extra="forbid")
    index_name: str
    documents: list[Document] = Field(min_length=1)

    _check_name = field_validator("index_name")(lambda cls, v: validate_index_name(v))


class DocumentRecord(BaseModel):
    """A stored document as the API returns it."""

    doc_id: str
    text: str
    hash_value: str
    metadata: dict[str, Any] = Field(default_factory=dict)
    is_truncated: bool = False


class ListDocumentsResponse(BaseModel):
    documents: list[DocumentRecord]
    count: int
    total_items: int


class UpdateDocument(BaseModel):
    model_config = ConfigDict(extra="ignore")  # KAITO clients send hash_value back; it is recomputed
    doc_id: str = Field(min_length=1)
    text: str = Field(min_length=1)
    metadata: dict[str, Any] | None = None  # omitted: keep the stored metadata


class UpdateDocumentsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    documents: list[UpdateDocument] = Field(min_length=1)


class UpdateDocumentsResponse(BaseModel):
    updated_documents: list[DocumentRecord]
    unchanged_documents: list[DocumentRecord]
    not_found_documents: list[UpdateDocument]


class DeleteDocumentsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    doc_ids: list[str] = Field(min_length=1)


class DeleteDocumentsResponse(BaseModel):
    deleted_doc_ids: list[str]
    not_found_doc_ids: list[str]


class MessageResponse(BaseModel):
    message: str


class NodeWithScore(BaseModel):
    """A retrieved chunk: which document, which node, its text, cosine score and metadata."""

    doc_id: str
    node_id: str
    text: str
    score: float
    metadata: dict[str, Any] = Field(default_factory=dict)


class QueryRequest(BaseModel):
    """``POST /query``: retrieve and answer (KAITO's shape)."""

    model_config = ConfigDict(extra="forbid")
    index_name: str
    query: str = Field(min_length=1)
    top_k: int = Field(default=5, ge=1, le=1000)
    llm_params: dict[str, Any] = Field(default_factory=dict)
    metadata_filter: dict[str, Any] | None = None
    similarity_threshold: float | None = Field(default=None, ge=-1.0, le=1.0)

    _check_name = field_validator("index_name")(lambda cls, v: validate_index_name(v))
    _check_filter = field_validator("metadata_filter")(lambda cls, v: validate_metadata_filter(v))


class QueryResponse(BaseModel):
    response: str
    source_nodes: list[NodeWithScore]
    metadata: dict[str, Any] = Field(default_factory=dict)


class RetrieveRequest(BaseModel):
    """``POST /retrieve``: nodes only, no generation."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    index_name: str
    query: str = Field(min_length=1)
    max_node_count: int = Field(default=5, ge=1, le=1000, validation_alias=AliasChoices("max_node_count", "top_k"))
    metadata_filter: dict[str, Any] | None = None
    similarity_threshold: float | None = Field(default=None, ge=-1.0, le=1.0)

    _check_name = field_validator("index_name")(lambda cls, v: validate_index_name(v))
    _check_filter = field_validator("metadata_filter")(lambda cls, v: validate_metadata_filter(v))


class RetrieveResponse(BaseModel):
    query: str
    results: list[NodeWithScore]
    count: int
