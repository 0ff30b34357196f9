"""Document API models, shaped after KAITO RAGEngine's REST API (docs/architecture.md §8)."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from typing import Annotated, Any, Literal, get_args

from pydantic import AfterValidator, AliasChoices, BaseModel, ConfigDict, Field, field_validator, model_validator

from ragserve.api.sampling import SamplingParams, check_stop
from ragserve.api.values import INT64_MAX, INT64_MIN, RequestModel, check_filter, check_metadata

#: Matched whole with ``fullmatch`` (``$`` would also match before a trailing newline).
INDEX_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
INDEX_NAME_RULE = "index names are 1-128 characters: letters, digits, '_', '-' and '.', starting with a letter or digit"

#: Flat metadata, checked by :func:`ragserve.api.values.check_metadata`.
Metadata = Annotated[dict[str, Any], AfterValidator(check_metadata)]
#: Document and query text (valid Unicode, as every string of a :class:`RequestModel`).
Text = Annotated[str, Field(min_length=1)]


def validate_index_name(name: str) -> str:
    """Raise ``ValueError`` with the rule when ``name`` is not a valid index name."""
    if not INDEX_NAME_RE.fullmatch(name) or name in {".", ".."}:
        raise ValueError(f"invalid index name {name!r}: {INDEX_NAME_RULE}")
    return name


#: The most indexes one query may search: each is searched on every shard it has a part on, in
#: the same call to that shard (``Retriever.retrieve``).
MAX_QUERY_INDEXES = 64


def validate_index_names(value: str | list[str]) -> str | list[str]:
    """One index name, or a list of 1 to ``MAX_QUERY_INDEXES`` of them searched as one (a name
    repeated counts once; the first order is kept). ``ValueError`` says what to fix."""
    if isinstance(value, str):
        return validate_index_name(value)
    if not value:
        raise ValueError(f"name at least one index: a name, or a list of 1 to {MAX_QUERY_INDEXES} names")
    if len(value) > MAX_QUERY_INDEXES:
        raise ValueError(f"{len(value)} indexes named: one query searches at most {MAX_QUERY_INDEXES}")
    return list(dict.fromkeys(validate_index_name(v) for v in value))


#: ``index_name`` of a query (``/retrieve``, ``/query``, chat): one index, or several searched as
#: one ranking. :func:`index_names` reads either as a tuple.
IndexNames = Annotated[str | list[str], AfterValidator(validate_index_names)]


def index_names(value: str | Sequence[str]) -> tuple[str, ...]:
    """The names an ``index_name`` field holds, as a tuple (one name is a tuple of one)."""
    return (value,) if isinstance(value, str) else tuple(value)


def validate_metadata_filter(flt: Any) -> dict[str, Any] | None:
    """A filter is ``{key: scalar}`` (see :func:`ragserve.api.values.check_filter`)."""
    return check_filter(flt)


#: A request's ``metadata_filter``, checked as part of its type: its key count is refused before
#: anything walks its keys (``RequestModel.values_checked_by_type``).
MetadataFilter = Annotated[dict[str, Any] | None, AfterValidator(check_filter)]


#: How a retrieval searches: dense and lexical candidates fused, cosine only, or BM25 only.
RetrievalMode = Literal["hybrid", "dense", "lexical"]
RETRIEVAL_MODES: tuple[str, ...] = get_args(RetrievalMode)
#: How chat turns a follow-up question into a retrieval query (besides joining earlier turns).
QueryRewrite = Literal["off", "llm"]
#: The largest page of documents a listing can return; ``max_list_limit`` may lower it.
MAX_LIST_PAGE = 1000


#: Format characters that reorder or break what a terminal or a log line shows (bidirectional
#: embeddings, overrides and isolates); other format characters (a zero-width joiner in an emoji)
#: are text.
_BIDI_CONTROLS = frozenset("\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def id_character(c: str) -> bool:
    """Whether ``c`` may stand in a new document's id: not a control character (C0, C1), a line or
    paragraph separator, or a bidirectional control."""
    return unicodedata.category(c) not in ("Cc", "Zl", "Zp") and c not in _BIDI_CONTROLS


class Document(RequestModel):
    """A document to index: text plus optional metadata and client-chosen id."""

    model_config = ConfigDict(extra="forbid")
    values_checked_by_type = frozenset({"metadata"})
    text: Text
    metadata: Metadata = Field(default_factory=dict)
    doc_id: str | None = Field(default=None, min_length=1, max_length=256)

    @field_validator("doc_id")
    @classmethod
    def _printable_id(cls, v: str | None) -> str | None:
        """A new document's id is text a URL, a log line and a terminal can carry: not blank, no
        control characters (a NUL, a newline). Ids stored before this rule can still be updated and
        deleted: only a new id is checked."""
        if v is None:
            return v
        if not v.strip():
            raise ValueError("doc_id must not be blank (only whitespace)")
        bad = next((c for c in v if not id_character(c)), None)
        if bad is not None:
            raise ValueError(
                f"doc_id contains a control character (U+{ord(bad):04X}) at {v.index(bad)}: use printable text"
            )
        return v


#: What ``POST /index`` and ``POST /jobs`` do with a given doc_id the index already holds with other
#: content: replace it (KAITO's behaviour, the default), or keep it and leave the new document out.
IfExists = Literal["replace", "keep"]
#: What ``GET /ui/config`` lists as ``features``: the options above that a client (the CLI) may
#: send, where KAITO's server and a ragserve before them would refuse or ignore them.
DOCUMENT_FEATURES = ("if_exists", "if_hash_value")
IF_EXISTS_DESCRIPTION = (
    "A document whose doc_id the index already holds with other text or metadata: 'replace' it (the "
    "default), or 'keep' the stored one and leave this one out (POST /index returns the stored document, "
    "whose hash_value is not this one's; a job records a 'document_exists' error for it). Decided under "
    "the shard's write lock: a document another client writes meanwhile is never overwritten."
)


class IndexRequest(RequestModel):
    """``POST /index``: create an index or extend it with documents."""

    model_config = ConfigDict(extra="forbid")
    index_name: str
    documents: list[Document] = Field(min_length=1)
    if_exists: IfExists = Field(default="replace", description=IF_EXISTS_DESCRIPTION)

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


class UpdateDocument(RequestModel):
    model_config = ConfigDict(extra="ignore")  # KAITO clients send hash_value back; it is recomputed
    values_checked_by_type = frozenset({"metadata"})
    doc_id: str = Field(min_length=1)
    text: Text
    metadata: Metadata | None = None  # omitted: keep the stored metadata
    if_hash_value: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        exclude_if=lambda v: v is None,  # echoed in not_found_documents only when sent (KAITO's shape)
        description="Update only if the stored document's hash_value is this one (the one read before): "
        "a document another client changed since is left as it is and listed in conflicting_documents.",
    )


class UpdateDocumentsRequest(RequestModel):
    """``POST /indexes/{name}/documents``: new text (and metadata) for documents by id."""

    model_config = ConfigDict(extra="forbid")
    documents: list[UpdateDocument] = Field(min_length=1)


class UpdateDocumentsResponse(BaseModel):
    """Which documents changed (re-chunked and re-embedded), which were already so, which do not exist."""

    updated_documents: list[DocumentRecord] = Field(description="Changed: re-chunked and re-embedded.")
    unchanged_documents: list[DocumentRecord] = Field(description="Same text and metadata: nothing was done.")
    not_found_documents: list[UpdateDocument] = Field(description="No such doc_id in the index (as sent).")
    conflicting_documents: list[DocumentRecord] = Field(
        default_factory=list,
        exclude_if=lambda v: not v,  # KAITO's shape unless there are some
        description="if_hash_value was not the stored hash_value: left as it is (the stored document).",
    )


class DeleteDocumentsRequest(RequestModel):
    """``POST /indexes/{name}/documents/delete``."""

    model_config = ConfigDict(extra="forbid")
    doc_ids: list[str] = Field(min_length=1, description="Ids to delete; a repeated id counts once.")
    if_hash_values: dict[str, Annotated[str, Field(min_length=1, max_length=256)]] | None = Field(
        default=None,
        description="doc_id -> the hash_value read before: such a document is deleted only if it is still "
        "that one (one another client changed since is left, in conflicting_doc_ids). Every key must be in "
        "doc_ids.",
    )

    @model_validator(mode="after")
    def _conditions_name_asked_ids(self) -> DeleteDocumentsRequest:
        if self.if_hash_values:
            asked = set(self.doc_ids)
            extra = next((k for k in self.if_hash_values if k not in asked), None)
            if extra is not None:
                raise ValueError(f"if_hash_values names {extra!r}, which doc_ids does not: list it in doc_ids too")
        return self


class DeleteDocumentsResponse(BaseModel):
    """Each requested id once, in one of the lists."""

    deleted_doc_ids: list[str] = Field(description="Deleted, in the order asked.")
    not_found_doc_ids: list[str] = Field(description="Not in the index (already deleted, or never there).")
    conflicting_doc_ids: list[str] = Field(
        default_factory=list,
        exclude_if=lambda v: not v,  # KAITO's shape unless there are some
        description="Left: its hash_value is not the one if_hash_values gave.",
    )


class MessageResponse(BaseModel):
    message: str


class NodeWithScore(BaseModel):
    """A retrieved chunk: which document, which node, its text, cosine score and metadata; with how
    retrieval ranked it. ``score`` stays the cosine similarity in every mode, so that
    ``similarity_threshold`` keeps one meaning."""

    doc_id: str
    node_id: str
    text: str
    score: float = Field(description="Cosine similarity to the query (lexical hits too, from their stored vector).")
    index_name: str | None = Field(
        default=None, description="The index it is from (a query may search several: index_name as a list)."
    )
    metadata: dict[str, Any] = Field(default_factory=dict)
    fused_score: float | None = Field(
        default=None,
        description="Its fused score (hybrid: hybrid_dense_weight x the cosine scaled over the candidates + "
        "the rest x lexical_coverage when the lexical search found it; docs/quality.md): results are in this order.",
    )
    lexical_coverage: float | None = Field(
        default=None,
        description="The share of the query's information (its terms weighed by IDF) this text holds; "
        "None in dense mode.",
    )
    sources: list[Literal["dense", "lexical"]] | None = Field(
        default=None, description="Which rankings found it: dense (cosine), lexical (BM25)."
    )
    rerank_score: float | None = Field(
        default=None, description="The reranker's score (reranker_model), when one reordered the candidates."
    )
    keyword_match: bool | None = Field(
        default=None,
        description="It contains every term of a query of at least lexical_match_min_terms terms, "
        "so it counts as relevant whatever its score.",
    )


class _RetrievalRequest(RequestModel):
    """The fields ``/query`` and ``/retrieve`` share: which index, what to look for, how relevant."""

    model_config = ConfigDict(extra="forbid")
    values_checked_by_type = frozenset({"metadata_filter"})
    index_name: IndexNames = Field(
        description="The index to search, or a list of indexes searched as one ranking (each node names its index)."
    )
    query: Text
    metadata_filter: MetadataFilter = None
    similarity_threshold: float | None = Field(default=None, ge=-1.0, le=1.0)
    retrieval_mode: RetrievalMode | None = Field(
        default=None, description="hybrid, dense or lexical; the server's retrieval_mode when omitted."
    )

    @property
    def indexes(self) -> tuple[str, ...]:
        """The indexes searched (``index_name`` as a tuple)."""
        return index_names(self.index_name)


class LLMParams(RequestModel):
    """``/query``'s ``llm_params``: the sampling fields the engines serve, strictly typed (a string
    where a number belongs is the client's mistake to hear about, not the engine's to choke on);
    any other key is refused by name rather than dropped."""

    model_config = ConfigDict(extra="forbid", strict=True)
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0, allow_inf_nan=False)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0, allow_inf_nan=False)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=INT64_MIN, le=INT64_MAX)

    _check_stop = field_validator("stop")(lambda cls, v: check_stop(v))

    def to_sampling_params(self, max_tokens: int, *, grounded: bool = False) -> SamplingParams:
        """What the engine needs, once the budget has fixed ``max_tokens`` and built the prompt
        (``grounded`` when it carries sources)."""
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            stop=stop,
            seed=self.seed,
            grounded=grounded,
        )


class QueryRequest(_RetrievalRequest):
    """``POST /query``: retrieve and answer (KAITO's shape)."""

    top_k: int = Field(default=5, ge=1, le=1000)
    llm_params: LLMParams = Field(default_factory=LLMParams)


class Evidence(BaseModel):
    """A passage of a retrieved source that best supports an answer to the question: the source's
    own words (extractive, never generated), so a reader can check the answer against it."""

    text: str = Field(description="The passage, verbatim from the source's text.")
    source: int = Field(description="1-based number of the source in source_nodes: the [n] an answer cites.")
    node_id: str
    start: int = Field(description="Where the passage starts in that source node's text (characters).")
    end: int = Field(description="Where it ends (exclusive).")
    score: float = Field(description="How strongly it answers the question, from 0 to 1.")


class QueryResponse(BaseModel):
    response: str
    source_nodes: list[NodeWithScore]
    metadata: dict[str, Any] = Field(
        default_factory=dict,
        description="Each source node's metadata by node_id; by 'index_name/node_id' when several indexes "
        "were searched.",
    )
    evidence: list[Evidence] | None = Field(
        default=None, description="The passages of source_nodes that best support an answer, best first."
    )
    answerable: bool | None = Field(
        default=None,
        description="False when nothing retrieved is strong enough to answer: the response then says the indexed "
        "documents do not cover the question and source_nodes are the closest sources.",
    )


class RetrieveRequest(_RetrievalRequest):
    """``POST /retrieve``: nodes only, no generation."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    max_node_count: int = Field(default=5, ge=1, le=1000, validation_alias=AliasChoices("max_node_count", "top_k"))


class RetrieveResponse(BaseModel):
    query: str
    results: list[NodeWithScore]
    count: int


class HealthResponse(BaseModel):
    """``GET /health``: ``ok`` once every shard and the model are ready, with what is served."""

    model_config = ConfigDict(extra="allow")
    status: str = "ok"
    model: str | None = None
    embedding_model: str | None = None
    shards: int | None = None
