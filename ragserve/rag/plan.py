"""Decide what a chat request becomes: a passthrough, a RAG plan, or a client error (docs/architecture.md §4).

Pure: it looks only at the request and at whether the named index exists, so every bypass and
split rule is testable without a server. The ingress turns the plan into calls.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from ragserve.api.openai import ChatCompletionRequest, ChatMessage
from ragserve.errors import BadRequestError, NotFoundError, ServiceError

RAG_ROLES = frozenset({"system", "developer", "user", "assistant"})
SYSTEM_ROLES = frozenset({"system", "developer"})
EMPTY_QUERY_MESSAGE = "There must be a user prompt since the latest assistant message."


class PassthroughReason(str, Enum):
    """Why a request skips retrieval; sent back as ``X-RAG-Reason``."""

    NO_INDEX = "no_index"
    TOOLS = "tools"
    UNSUPPORTED_ROLE = "unsupported_role"
    NON_TEXT_CONTENT = "non_text_content"
    NO_CONTEXT = "no_context"


@dataclass(frozen=True)
class Passthrough:
    """Forward the request to the LLM unchanged (RAG fields removed)."""

    reason: PassthroughReason
    body: dict[str, Any]


@dataclass(frozen=True)
class RagParams:
    """Per-request retrieval parameters; ``None`` means the server default."""

    indexes: tuple[str, ...]  # one, or several searched as one ranking
    top_k: int | None = None
    similarity_threshold: float | None = None
    context_token_ratio: float | None = None
    metadata_filter: dict[str, Any] | None = None
    retrieval_mode: str | None = None
    query_rewrite: str | None = None
    sources_in_content: bool | None = None


@dataclass(frozen=True)
class RagPlan:
    """Retrieve with ``query``; answer with system messages, history and the retrieved context."""

    query: str
    system: list[dict[str, Any]]
    history: list[dict[str, Any]]
    params: RagParams
    body: dict[str, Any] = field(default_factory=dict)  # the upstream body, for a no_context fallback


#: A client mistake, returned (not raised) so the plan stays a plain value: the status, and a
#: message that says what to fix. The chat service raises it.
ChatError = ServiceError

ChatPlan = Passthrough | RagPlan | ChatError


def _validate_messages(messages: list[ChatMessage]) -> ChatError | None:
    """Malformed messages are a 400 naming the message and what is missing."""
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not m.role:
            return BadRequestError(f"{where}: 'role' is required", param=where)
        if m.role == "assistant":
            continue  # an assistant turn may carry tool_calls and no content
        if m.content is None and m.role in RAG_ROLES:
            return BadRequestError(f"{where}: 'content' is required for role '{m.role}'", param=f"{where}.content")
        if m.role == "user" and isinstance(m.content, str) and not m.content.strip():
            return BadRequestError(f"{where}: user content must not be empty", param=f"{where}.content")
        if m.role == "user" and isinstance(m.content, list):
            if not m.content:
                return BadRequestError(f"{where}: user content must not be an empty list", param=f"{where}.content")
            for j, part in enumerate(m.content):
                if part.type == "text" and part.text is None:
                    return BadRequestError(
                        f"{where}.content[{j}]: a text part needs 'text'", param=f"{where}.content[{j}].text"
                    )
    return None


def _bypass_reason(request: ChatCompletionRequest) -> PassthroughReason | None:
    if request.tools or request.functions:
        return PassthroughReason.TOOLS
    for m in request.messages:
        if m.role not in RAG_ROLES:
            return PassthroughReason.UNSUPPORTED_ROLE
    for m in request.messages:
        if m.role == "user" and isinstance(m.content, list) and any(p.type != "text" for p in m.content):
            return PassthroughReason.NON_TEXT_CONTENT
    return None


def _as_dict(m: ChatMessage) -> dict[str, Any]:
    return m.model_dump(exclude_none=True)


def split_messages(messages: list[ChatMessage]) -> tuple[str, list[dict[str, Any]], list[dict[str, Any]]]:
    """(query, system, history): walk from the newest message; user messages met before the first
    assistant message form the query (oldest first, joined by a blank line); system and developer
    messages are the system part; everything else is history, in order."""
    query_parts: list[str] = []
    system: list[dict[str, Any]] = []
    history: list[dict[str, Any]] = []
    assistant_seen = False
    for m in reversed(messages):
        if m.role in SYSTEM_ROLES:
            system.insert(0, _as_dict(m))
        elif m.role == "user" and not assistant_seen:
            query_parts.insert(0, m.text())
        else:
            if m.role == "assistant":
                assistant_seen = True
            history.insert(0, _as_dict(m))
    query = "\n\n".join(p for p in query_parts if p.strip())
    return query, system, history


def unknown_index(name: str) -> NotFoundError:
    """A request naming an index that does not exist: the one 404 for it, whether the plan, the search
    or a lookup by name finds out."""
    return NotFoundError(f"No such index: '{name}' exists.", param="index_name", code="index_not_found")


def plan(request: ChatCompletionRequest, index_exists: Callable[[str], bool]) -> ChatPlan:
    """The decision of docs/architecture.md §4 for one request. ``index_exists`` may answer True
    optimistically when a search will follow (a RAG plan's search reports a missing index itself);
    the caller then asks again, knowing, for any other outcome (``ChatService.complete``)."""
    error = _validate_messages(request.messages)
    if error is not None:
        return error
    body = request.upstream_body()
    if request.index_name is None:
        return Passthrough(PassthroughReason.NO_INDEX, body)
    missing = next((name for name in request.indexes if not index_exists(name)), None)
    if missing is not None:
        return unknown_index(missing)
    reason = _bypass_reason(request)
    if reason is not None:
        return Passthrough(reason, body)
    query, system, history = split_messages(request.messages)
    if not query:
        return BadRequestError(EMPTY_QUERY_MESSAGE, param="messages")
    params = RagParams(
        indexes=request.indexes,
        top_k=request.top_k,
        similarity_threshold=request.similarity_threshold,
        context_token_ratio=request.context_token_ratio,
        metadata_filter=request.metadata_filter,
        retrieval_mode=request.retrieval_mode,
        query_rewrite=request.query_rewrite,
        sources_in_content=request.sources_in_content,
    )
    return RagPlan(query=query, system=system, history=history, params=params, body=body)
