"""Wire models of OpenAI's Vector Stores API (``/v1/vector_stores``), as the API reference and the
official SDK (``client.vector_stores.*``) define them, so the SDK works unchanged against ragserve
(docs/architecture.md §8b).

A vector store *is* an index: its id is an index name everywhere (chat's ``index_name``,
``/retrieve``, ``/query``, the document API, scoped keys). A file attached to it is indexed by an
ingestion job (``ragserve.jobs``) whose item status is the file's status, so a file is never
reported in a state its job does not hold.

What the reference defines and ragserve does not do is refused with a 400 naming the field
(``expires_after``, ``rewrite_query: true``, a filter other than ``eq`` joined by ``and``), never
accepted and ignored."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from ragserve.api.values import MAX_METADATA_KEYS, RequestModel, check_filter, place
from ragserve.errors import BadRequestError

#: OpenAI's limits on ``attributes``: 16 keys of at most 64 characters, strings of at most 512.
MAX_ATTRIBUTES = 16
MAX_ATTRIBUTE_KEY_CHARS = 64
MAX_ATTRIBUTE_VALUE_CHARS = 512
#: ``metadata`` of a vector store: 16 pairs, keys of 64 characters, values of 512.
MAX_METADATA_PAIRS = 16
#: Files one request may attach (OpenAI's file batch limit).
MAX_BATCH_FILES = 2000
#: What ``max_num_results`` may ask for (OpenAI: 1 to 50).
MAX_SEARCH_RESULTS = 50
#: Static chunking as OpenAI bounds it: 100 to 4096 tokens a chunk, overlap at most half of that.
MIN_CHUNK_TOKENS, MAX_CHUNK_TOKENS = 100, 4096

AttributeValue = str | float | bool
#: A File's id as a request names it.
FileId = Annotated[str, Field(min_length=1, max_length=256)]


def check_attributes(attributes: dict[str, Any] | None) -> dict[str, Any] | None:
    """OpenAI's rules for a file's ``attributes``: at most 16 keys of at most 64 characters, each
    value a string of at most 512 characters, a finite number or a boolean."""
    if attributes is None:
        return None
    if len(attributes) > MAX_ATTRIBUTES:
        raise ValueError(f"attributes has {len(attributes)} keys; at most {MAX_ATTRIBUTES} are accepted")
    for key, value in attributes.items():
        if not key or len(key) > MAX_ATTRIBUTE_KEY_CHARS:
            raise ValueError(f"attributes key {key[:80]!r} must be 1 to {MAX_ATTRIBUTE_KEY_CHARS} characters")
        if isinstance(value, str) and len(value) > MAX_ATTRIBUTE_VALUE_CHARS:
            raise ValueError(f"attributes[{key!r}] is longer than {MAX_ATTRIBUTE_VALUE_CHARS} characters")
    return attributes


def check_store_metadata(metadata: dict[str, str] | None) -> dict[str, str] | None:
    """OpenAI's rules for an object's ``metadata``: at most 16 string pairs, keys of at most 64
    characters, values of at most 512."""
    if metadata is None:
        return None
    if len(metadata) > MAX_METADATA_PAIRS:
        raise ValueError(f"metadata has {len(metadata)} keys; at most {MAX_METADATA_PAIRS} are accepted")
    for key, value in metadata.items():
        if len(key) > MAX_ATTRIBUTE_KEY_CHARS:
            raise ValueError(f"metadata key {key[:80]!r} is longer than {MAX_ATTRIBUTE_KEY_CHARS} characters")
        if len(value) > MAX_ATTRIBUTE_VALUE_CHARS:
            raise ValueError(f"metadata[{key!r}] is longer than {MAX_ATTRIBUTE_VALUE_CHARS} characters")
    return metadata


Attributes = Annotated[dict[str, AttributeValue], AfterValidator(check_attributes)]
StoreMetadata = Annotated[dict[str, str], AfterValidator(check_store_metadata)]


class StaticChunking(RequestModel):
    model_config = ConfigDict(extra="forbid")
    max_chunk_size_tokens: int = Field(ge=MIN_CHUNK_TOKENS, le=MAX_CHUNK_TOKENS)
    chunk_overlap_tokens: int = Field(ge=0)

    @model_validator(mode="after")
    def _overlap_at_most_half(self) -> StaticChunking:
        if self.chunk_overlap_tokens > self.max_chunk_size_tokens // 2:
            raise ValueError(
                "chunk_overlap_tokens must not exceed half of max_chunk_size_tokens "
                f"({self.chunk_overlap_tokens} > {self.max_chunk_size_tokens // 2})"
            )
        return self


class ChunkingStrategy(RequestModel):
    """``{"type": "auto"}`` (the server's ``chunk_size``/``chunk_overlap``) or ``{"type": "static",
    "static": {...}}``; a response says ``static`` with the sizes used."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["auto", "static"]
    static: StaticChunking | None = None

    @model_validator(mode="after")
    def _static_has_sizes(self) -> ChunkingStrategy:
        if self.type == "static" and self.static is None:
            raise ValueError("chunking_strategy of type 'static' needs 'static': {max_chunk_size_tokens, ...}")
        if self.type == "auto" and self.static is not None:
            raise ValueError("chunking_strategy of type 'auto' takes no 'static' sizes")
        return self


class ExpiresAfter(RequestModel):
    anchor: str
    days: int


class FileCounts(BaseModel):
    in_progress: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    total: int = 0


class VectorStore(BaseModel):
    id: str
    object: Literal["vector_store"] = "vector_store"
    created_at: int
    name: str
    description: str | None = None
    usage_bytes: int
    file_counts: FileCounts
    status: Literal["expired", "in_progress", "completed"]
    expires_after: None = None
    expires_at: None = None
    last_active_at: int | None = None
    metadata: dict[str, str] = Field(default_factory=dict)


class _Unsupported(RequestModel):
    """Fields of OpenAI's reference that ragserve refuses by name instead of ignoring."""

    expires_after: ExpiresAfter | None = None

    @model_validator(mode="after")
    def _refuse_expiry(self) -> _Unsupported:
        if self.expires_after is not None:
            raise ValueError(
                "expires_after is not supported: a ragserve vector store lasts until it is deleted "
                "(DELETE /v1/vector_stores/{id}); leave the field out"
            )
        return self


class CreateVectorStoreRequest(_Unsupported):
    model_config = ConfigDict(extra="forbid")
    name: str | None = Field(default=None, max_length=256)
    description: str | None = Field(default=None, max_length=512)
    metadata: StoreMetadata | None = None
    file_ids: list[FileId] | None = Field(default=None, max_length=MAX_BATCH_FILES)
    chunking_strategy: ChunkingStrategy | None = None


class UpdateVectorStoreRequest(_Unsupported):
    model_config = ConfigDict(extra="forbid")
    name: str | None = Field(default=None, max_length=256)
    metadata: StoreMetadata | None = None


class VectorStoreDeleted(BaseModel):
    id: str
    object: Literal["vector_store.deleted"] = "vector_store.deleted"
    deleted: bool = True


class LastError(BaseModel):
    code: Literal["server_error", "unsupported_file", "invalid_file"]
    message: str


class ChunkingStrategyOut(BaseModel):
    type: Literal["static"] = "static"
    static: dict[str, int]


class VectorStoreFile(BaseModel):
    id: str = Field(description="The file's id (a File of /v1/files).")
    object: Literal["vector_store.file"] = "vector_store.file"
    created_at: int
    vector_store_id: str
    status: Literal["in_progress", "completed", "cancelled", "failed"]
    last_error: LastError | None = None
    usage_bytes: int = 0
    attributes: dict[str, AttributeValue] = Field(default_factory=dict)
    chunking_strategy: ChunkingStrategyOut


class CreateVectorStoreFileRequest(RequestModel):
    model_config = ConfigDict(extra="forbid")
    file_id: FileId
    attributes: Attributes | None = None
    chunking_strategy: ChunkingStrategy | None = None


class UpdateVectorStoreFileRequest(RequestModel):
    model_config = ConfigDict(extra="forbid")
    attributes: Attributes | None


class SearchContent(BaseModel):
    type: Literal["text"] = "text"
    text: str


class FileContentPage(BaseModel):
    """``GET .../files/{file_id}/content``: the text the file was indexed as, a part per document
    (a PDF page, a part of a long file), in order."""

    object: Literal["vector_store.file_content.page"] = "vector_store.file_content.page"
    data: list[SearchContent]
    has_more: bool = False
    next_page: str | None = None


class VectorStoreFileDeleted(BaseModel):
    id: str
    object: Literal["vector_store.file.deleted"] = "vector_store.file.deleted"
    deleted: bool = True


class BatchFile(RequestModel):
    model_config = ConfigDict(extra="forbid")
    file_id: FileId
    attributes: Attributes | None = None
    chunking_strategy: ChunkingStrategy | None = None


class CreateFileBatchRequest(RequestModel):
    """``file_ids`` with the batch's ``attributes``/``chunking_strategy``, or ``files`` each with its
    own; not both (OpenAI's rule)."""

    model_config = ConfigDict(extra="forbid")
    file_ids: list[FileId] | None = Field(default=None, min_length=1, max_length=MAX_BATCH_FILES)
    files: list[BatchFile] | None = Field(default=None, min_length=1, max_length=MAX_BATCH_FILES)
    attributes: Attributes | None = None
    chunking_strategy: ChunkingStrategy | None = None

    @model_validator(mode="after")
    def _one_of(self) -> CreateFileBatchRequest:
        if (self.file_ids is None) == (self.files is None):
            raise ValueError("give either file_ids or files (each with its own attributes), not both and not neither")
        return self

    def entries(self) -> list[BatchFile]:
        """The batch as one list of files, the batch's attributes and chunking applied to ``file_ids``."""
        if self.files is not None:
            return list(self.files)
        return [
            BatchFile(file_id=f, attributes=self.attributes, chunking_strategy=self.chunking_strategy)
            for f in self.file_ids or []
        ]


class VectorStoreFileBatch(BaseModel):
    id: str
    object: Literal["vector_store.files_batch"] = "vector_store.files_batch"
    created_at: int
    vector_store_id: str
    status: Literal["in_progress", "completed", "cancelled", "failed"]
    file_counts: FileCounts


class RankingOptions(RequestModel):
    model_config = ConfigDict(extra="forbid")
    ranker: Literal["none", "auto", "default-2024-11-15"] | None = None
    score_threshold: float | None = Field(default=None, ge=0.0, le=1.0)


class SearchRequest(RequestModel):
    model_config = ConfigDict(extra="forbid")
    query: str | list[str]
    max_num_results: int = Field(default=10, ge=1, le=MAX_SEARCH_RESULTS)
    filters: Annotated[dict[str, Any] | None, BeforeValidator(check_filter_size)] = None
    ranking_options: RankingOptions | None = None
    rewrite_query: bool = False

    @model_validator(mode="after")
    def _checked(self) -> SearchRequest:
        queries = [self.query] if isinstance(self.query, str) else self.query
        if not queries or any(not q.strip() for q in queries):
            raise ValueError("query must be a non-empty string or a non-empty list of non-empty strings")
        if len(queries) > 16:
            raise ValueError(f"query holds {len(queries)} strings; at most 16 are searched at once")
        if self.rewrite_query:
            raise ValueError(
                "rewrite_query is not supported: ragserve searches with the query as given; send rewrite_query false"
            )
        return self

    def queries(self) -> list[str]:
        return [self.query] if isinstance(self.query, str) else list(self.query)


class SearchResult(BaseModel):
    file_id: str
    filename: str
    score: float
    attributes: dict[str, AttributeValue] = Field(default_factory=dict)
    content: list[SearchContent]


class SearchResultsPage(BaseModel):
    object: Literal["vector_store.search_results.page"] = "vector_store.search_results.page"
    search_query: list[str]
    data: list[SearchResult]
    has_more: bool = False
    next_page: str | None = None


class Page(BaseModel):
    """OpenAI's cursor page: ``data`` with the ids that bound it (``after``/``before`` take them)."""

    object: Literal["list"] = "list"
    data: list[Any]
    first_id: str | None
    last_id: str | None
    has_more: bool


class VectorStoreList(Page):
    data: list[VectorStore]


class VectorStoreFileList(Page):
    data: list[VectorStoreFile]


#: Comparisons and compound filters one ``filters`` may hold: what it maps to holds at most
#: ``MAX_METADATA_KEYS`` keys, so more is never needed (and a list of 240,000 repeated ``eq``
#: comparisons, one key, was seconds of the event loop before this bound).
MAX_FILTER_NODES = 2 * MAX_METADATA_KEYS


def check_filter_size(flt: Any) -> Any:
    """``flt`` unless it holds more than ``MAX_FILTER_NODES`` comparisons and compound filters
    (``ValueError``): counted before anything validates them, so a list of millions is refused at
    the cost of reading its length."""
    nodes, stack = 1, [flt]
    while stack:
        f = stack.pop()
        parts = f.get("filters") if isinstance(f, dict) else None
        if isinstance(parts, list):
            nodes += len(parts)
            if nodes > MAX_FILTER_NODES:
                raise ValueError(
                    f"filters holds more than {MAX_FILTER_NODES} comparisons and compound filters; it can compare "
                    f"at most {MAX_METADATA_KEYS} keys: send one 'eq' a key"
                )
            stack.extend(parts)
    return flt


def _filter_place(at: tuple[Any, ...] | str) -> str:
    """Where a filter sits (``filters.filters[2].filters[0]``), written out only for an error."""
    return place(at, lambda i: f".filters[{i}]")


def openai_filter(flt: dict[str, Any] | None) -> dict[str, Any] | None:
    """OpenAI's ``filters`` as a ragserve metadata filter (``{key: value}``, every pair must match):
    an ``eq`` comparison, or ``and`` of them (at most ``MAX_FILTER_NODES`` in all). Anything else
    (``ne``, ``gt``, ``in``, ``or``, ...) is a 400 that names it: a filter that cannot be applied is
    never dropped silently. What it maps to is held to a ``metadata_filter``'s rules
    (``check_filter``: how many keys, their length, 64-bit integers), so no filter reaches the
    shards that ``/retrieve`` would refuse."""
    if flt is None:
        return None
    try:
        check_filter_size(flt)
    except ValueError as e:
        raise BadRequestError(str(e), param="filters") from None
    out: dict[str, Any] = {}
    stack: list[tuple[Any, tuple[Any, ...] | str]] = [(flt, "filters")]
    while stack:
        f, at = stack.pop()
        if not isinstance(f, dict):
            raise BadRequestError(
                f"{_filter_place(at)} must be a comparison or compound filter object", param="filters"
            )
        kind = f.get("type")
        if kind == "and":
            parts = f.get("filters")
            if not isinstance(parts, list) or not parts:
                raise BadRequestError(
                    f"{_filter_place(at)}: an 'and' filter needs a non-empty 'filters' list", param="filters"
                )
            stack.extend((p, (at, i)) for i, p in enumerate(parts))
        elif kind == "eq":
            key, value = f.get("key"), f.get("value")
            if not isinstance(key, str) or not key:
                raise BadRequestError(f"{_filter_place(at)}: 'key' must be a non-empty string", param="filters")
            if not isinstance(value, str | int | float | bool) or (isinstance(value, float) and value != value):
                raise BadRequestError(
                    f"{_filter_place(at)}: 'value' of 'eq' must be a string, number or boolean", param="filters"
                )
            if key in out and out[key] != value:
                raise BadRequestError(
                    f"{_filter_place(at)}: key {key!r} must equal two different values", param="filters"
                )
            out[key] = value
        elif kind in ("ne", "gt", "gte", "lt", "lte", "in", "nin", "or"):
            raise BadRequestError(
                f"{_filter_place(at)}: filter type {kind!r} is not supported; ragserve filters by equality: use "
                "'eq' comparisons, joined by 'and'",
                param="filters",
            )
        else:
            raise BadRequestError(
                f"{_filter_place(at)}: unknown filter type {kind!r}: comparison types are eq, ne, gt, gte, lt, lte, "
                "in, nin; compound types and, or",
                param="filters",
            )
    try:
        return check_filter(out)
    except ValueError as e:
        raise BadRequestError(str(e).replace("metadata_filter", "filters", 1), param="filters") from None
