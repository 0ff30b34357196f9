"""OpenAI chat-completions protocol models, with ragserve's RAG extensions.

Requests keep unknown fields (``extra="allow"``) so that a passthrough request reaches the LLM with
everything the client sent, minus the RAG-only fields listed in ``RAG_FIELDS``.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ragserve.api.documents import (
    Evidence,
    IndexNames,
    MetadataFilter,
    NodeWithScore,
    QueryRewrite,
    RetrievalMode,
    index_names,
)
from ragserve.api.sampling import SamplingParams, check_stop, extra_fields
from ragserve.api.values import INT64_MAX, INT64_MIN, RequestModel

# Fields that only ragserve understands; they are removed before a request goes upstream.
RAG_FIELDS = frozenset(
    {
        "index_name",
        "context_token_ratio",
        "top_k",
        "similarity_threshold",
        "metadata_filter",
        "retrieval_mode",
        "query_rewrite",
        "sources_in_content",
        "cache",
    }
)


#: Tools (or legacy functions) in one chat request: OpenAI's own limit.
MAX_TOOLS = 128


class ContentPart(RequestModel):
    """One part of an array-valued message content (text, image_url, input_audio, ...)."""

    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class ChatMessage(RequestModel):
    """A chat message. Role and content are checked by ``ragserve.rag.plan``, not here, so that a
    malformed message gets a message-specific 400 instead of a generic schema error."""

    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None

    def text(self) -> str:
        """The message's text: the string, or its text parts joined by newlines."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(p.text or "" for p in self.content if p.type == "text")


class ChatCompletionRequest(RequestModel):
    """``POST /v1/chat/completions``: the OpenAI body plus the RAG extensions."""

    model_config = ConfigDict(extra="allow")
    values_checked_by_type = frozenset({"metadata_filter"})

    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool = Field(default=False, strict=True)
    stream_options: dict[str, Any] | None = None
    # numbers and flags strictly typed, as OpenAI's API and /query's llm_params take them: "5" or
    # true where a number belongs is the client's mistake to hear about (a 400 naming the field)
    max_tokens: int | None = Field(default=None, ge=1, strict=True)
    max_completion_tokens: int | None = Field(default=None, ge=1, strict=True)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0, strict=True)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0, strict=True)
    n: int | None = Field(default=None, ge=1, le=1, strict=True, description="Only n=1 is supported.")
    stop: str | list[str] | None = None
    user: str | None = None
    seed: int | None = Field(default=None, ge=INT64_MIN, le=INT64_MAX, strict=True)
    tools: list[dict[str, Any]] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: Any = None
    functions: list[dict[str, Any]] | None = Field(default=None, max_length=MAX_TOOLS)
    function_call: Any = None

    # RAG extensions
    index_name: IndexNames | None = Field(
        default=None, description="Answer from this index, or from several searched as one ranking (a list)."
    )
    context_token_ratio: float | None = Field(default=None, ge=0.2, le=0.8, strict=True)
    top_k: int | None = Field(default=None, ge=1, le=1000, strict=True)
    similarity_threshold: float | None = Field(default=None, ge=-1.0, le=1.0, strict=True)
    metadata_filter: MetadataFilter = None
    retrieval_mode: RetrievalMode | None = Field(
        default=None, description="hybrid, dense or lexical; the server's retrieval_mode when omitted."
    )
    query_rewrite: QueryRewrite | None = Field(
        default=None,
        description="llm: rewrite a follow-up into a standalone question with the generator "
        "before retrieving; the server's query_rewrite when omitted.",
    )
    sources_in_content: bool | None = Field(
        default=None,
        strict=True,
        description="Append a plain 'Sources:' list to the answer's text; the server's "
        "sources_in_content when omitted.",
    )

    cache: bool | None = Field(
        default=None,
        strict=True,
        description="The answer cache (RAG answers): false neither reads nor keeps this answer; true also "
        "caches a request with temperature > 0; omitted: the server's rules (X-RAG-Cache says what happened).",
    )

    _check_stop = field_validator("stop")(lambda cls, v: check_stop(v))

    @property
    def indexes(self) -> tuple[str, ...]:
        """The indexes ``index_name`` names (none without it)."""
        return () if self.index_name is None else index_names(self.index_name)

    def requested_max_tokens(self) -> int | None:
        """``max_completion_tokens`` (the newer name) wins over ``max_tokens``."""
        return self.max_completion_tokens or self.max_tokens

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def to_sampling_params(self, max_tokens: int, *, grounded: bool = False) -> SamplingParams:
        """What an engine needs to generate for this request, once the budget has fixed ``max_tokens``
        (and built the prompt: ``grounded`` when it carries sources)."""
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            stop=tuple(self.stop_list()),
            seed=self.seed,
            model=self.model,
            extra=extra_fields(self.upstream_body()),
            grounded=grounded,
        )

    def upstream_body(self) -> dict[str, Any]:
        """The body to forward upstream: everything the client sent except the RAG fields."""
        body = self.model_dump(exclude_unset=True, exclude_none=False)
        for f in RAG_FIELDS:
            body.pop(f, None)
        return body


class UsageInfo(BaseModel):
    """Token usage; upstreams may add detail fields (``prompt_tokens_details``), which are kept."""

    model_config = ConfigDict(extra="allow")
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int) -> UsageInfo:
        return cls(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
        )


class ResponseMessage(BaseModel):
    """The answer's message; an upstream's extra fields (``tool_calls``, ``refusal``) are kept."""

    model_config = ConfigDict(extra="allow")
    role: str = "assistant"
    content: str | None = None


class ChatCompletionChoice(BaseModel):
    model_config = ConfigDict(extra="allow")
    index: int = 0
    message: ResponseMessage
    finish_reason: str | None = "stop"


def new_completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


class Citation(BaseModel):
    """A ``[marker]`` in the answer that names a source the model was given: which node and document,
    and the span ``[start, end)`` of the answer's text it supports (the marker included)."""

    marker: int
    node_id: str
    doc_id: str
    index_name: str | None = Field(default=None, description="The index of that source (a query may search several).")
    start: int
    end: int


class InvalidCitation(BaseModel):
    """A ``[marker]`` that names no source the model was given (the model invented it)."""

    marker: int
    start: int
    end: int


#: Where a RAG answer's retrieval query came from: the newest user turn as sent (``message``), that
#: turn with the salient terms of earlier user turns, for one that refers back (``followup``,
#: ``ragserve.rag.followup``), or the generator's standalone rewrite (``rewritten``, ``query_rewrite: llm``).
QuerySource = Literal["message", "followup", "rewritten"]


class RagInfo(BaseModel):
    """How a RAG answer retrieved: the query it searched with (for a follow-up that refers back, the
    question with the salient terms of earlier turns, or rewritten), where that query came from,
    and the retrieval mode. ``X-RAG-Query`` carries the same query (``ragserve.http.headers``)."""

    query: str = Field(description="The query retrieval searched with; X-RAG-Query carries it too.")
    query_source: QuerySource = Field(
        description="message: the newest user turn; followup: it with the salient terms of earlier user turns "
        "(it referred back: 'How do I set it up?'); rewritten: the generator's standalone rewrite (query_rewrite: llm)."
    )
    retrieval_mode: str
    evidence: list[Evidence] | None = Field(
        default=None, description="The passages of the sources that best support an answer, best first."
    )
    answerable: bool | None = Field(
        default=None,
        description="False when nothing retrieved is strong enough to answer: the answer then says the indexed "
        "documents do not cover the question and lists the closest sources.",
    )


class _CompletionBody(BaseModel):
    """What a whole completion and a chunk of one share. Bodies are written with ``exclude_unset``,
    so a relayed upstream body keeps its own fields and ragserve's own set every field they send."""

    model_config = ConfigDict(extra="allow")
    id: str = ""
    object: str
    created: int = 0
    model: str = ""
    usage: UsageInfo | None = None
    source_nodes: list[NodeWithScore] | None = Field(
        default=None,
        description="RAG answers: the retrieved chunks the answer was given, with their scores "
        "(on the first chunk of a stream).",
    )
    citations: list[Citation] | None = Field(
        default=None,
        description="RAG answers: the answer's [n] markers that name a source in source_nodes "
        "(on the final chunk of a stream).",
    )
    invalid_citations: list[InvalidCitation] | None = Field(
        default=None, description="RAG answers: [n] markers that name no source the model was given."
    )
    rag: RagInfo | None = Field(
        default=None, description="RAG answers: the retrieval query and mode used (on the first chunk of a stream)."
    )


class ChatCompletionResponse(_CompletionBody):
    """A full chat completion."""

    object: str = "chat.completion"
    choices: list[ChatCompletionChoice]


class DeltaMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str | None = None
    content: str | None = None


class ChatCompletionChunkChoice(BaseModel):
    model_config = ConfigDict(extra="allow")
    index: int = 0
    delta: DeltaMessage
    finish_reason: str | None = None


class ChatCompletionChunk(_CompletionBody):
    """One streamed piece (``text/event-stream`` events of a streamed chat completion)."""

    object: str = "chat.completion.chunk"
    choices: list[ChatCompletionChunkChoice]


class EmbeddingRequest(RequestModel):
    """``POST /v1/embeddings``."""

    model_config = ConfigDict(extra="allow")
    input: str | list[str] = Field(description="A string or a list of strings (token arrays are not supported).")
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(
        default=None,
        ge=1,
        strict=True,
        description="Truncate (and re-normalise) to this many dimensions; at most the model's own.",
    )
    user: str | None = None

    @field_validator("input")
    @classmethod
    def _non_empty(cls, v: str | list[str]) -> str | list[str]:
        items = [v] if isinstance(v, str) else v
        if not items:
            raise ValueError("input must not be empty")
        if any(not isinstance(s, str) or not s for s in items):
            raise ValueError("every input must be a non-empty string")
        return v

    def inputs(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)


class EmbeddingData(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[EmbeddingData]
    model: str
    usage: UsageInfo


class ModelCard(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "ragserve"
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
