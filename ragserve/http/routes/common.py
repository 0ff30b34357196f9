"""Small HTTP helpers the routers share."""

from __future__ import annotations

from collections.abc import Sequence

from fastapi import Request

from ragserve.api.documents import index_names, validate_index_name
from ragserve.errors import BadRequestError
from ragserve.http.asgi import Scope
from ragserve.http.security import principal_of
from ragserve.http.usage import usage_of
from ragserve.service.access import Principal, Role
from ragserve.service.chat import ChatOutcome, ChatService
from ragserve.service.knowledge import ScopedKnowledge
from ragserve.service.limits import RequestLimits
from ragserve.telemetry import Telemetry


def checked_index(name: str) -> str:
    """A path's index name, checked by the same rule as a body's (400 naming the rule)."""
    try:
        return validate_index_name(name)
    except ValueError as e:
        raise BadRequestError(str(e), param="index_name") from e


def allow(request: Request, role: Role, index: str | Sequence[str] | None = None) -> Principal:
    """The caller's principal, once it is known to may act as ``role`` (on ``index``, or on each of
    several); else a 403 naming the first index it does not reach."""
    principal = principal_of(request.scope)
    principal.require(role, index)
    record = usage_of(request)
    if record is not None and index is not None:  # the request's usage is the index's (or each one's)
        record.indexes = index_names(index)
    return principal


def allow_unscoped(request: Request, role: Role, what: str) -> Principal:
    """The caller's principal, once it is known to may act as ``role`` on every index, for ``what``
    belongs to none (``Principal.require_unscoped``); else a 403."""
    principal = principal_of(request.scope)
    principal.require_unscoped(role, what)
    return principal


def allow_files(request: Request) -> Principal:
    """The caller's principal, once it may use the server's uploaded files (``/v1/files``, or a File
    attached to a vector store by id): they are one namespace for every index, so only a key with
    the write role on every index may (else a 403)."""
    return allow_unscoped(request, Role.WRITE, "uploaded files")


def report_latencies(telemetry: Telemetry, timings: dict[str, float]) -> None:
    for stage, seconds in timings.items():
        telemetry.latency(stage, seconds)


def metered_chat(request: Request, outcome: ChatOutcome) -> None:
    """Add a chat's tokens to the request's usage: the engine's or the upstream's count (a
    stream's once it has ended), else the prompt as counted here; the query it retrieved with."""
    record = usage_of(request)
    if record is None:
        return
    usage = outcome.usage or (outcome.response.usage if outcome.response is not None else None)
    if usage is not None:
        record.chat(usage.prompt_tokens, usage.completion_tokens)
    else:  # no count from the engine (a client that left mid-stream; an upstream that sends none):
        # the prompt as counted here, and what was relayed in the model's tokens (on a worker thread)
        record.chat(outcome.stats.get("prompt_tokens", 0), 0)
        text = "".join(outcome.relayed)
        if outcome.response is not None and outcome.response.choices:
            text = outcome.response.choices[0].message.content or ""
        if text and outcome.counter is not None:
            record.completions.append((outcome.counter, text))
    if outcome.embedded is not None:  # an answer from the cache: none, or the question its lookup embedded
        record.query_texts.extend(outcome.embedded)
    elif outcome.rag is not None:
        record.query_texts.append(outcome.rag.query)


def metered_query(request: Request | Scope, query: str, index: str | Sequence[str] | None = None) -> None:
    """A search's query, whose embedding tokens the request used (counted after the response),
    and the indexes it searched where no ``allow`` named them (the scope was checked elsewhere)."""
    record = usage_of(request)
    if record is not None:
        record.query_texts.append(query)
        if index is not None:
            record.indexes = index_names(index)


def metered_documents(request: Request, texts: list[str], *, embedded: bool = True) -> None:
    """Documents the request ingested (their count, bytes and, ``embedded`` here, embedding tokens)."""
    record = usage_of(request)
    if record is not None:
        record.documents = texts
        record.documents_embedded = embedded


def scoped_knowledge(
    request: Request | Scope, chat: ChatService, limits: RequestLimits, telemetry: Telemetry
) -> ScopedKnowledge:
    """What the request's key may read (``/retrieve``, the document route, the MCP tools): its
    searches metered as the request's (the query's embedding tokens, the indexes)."""
    scope = request.scope if isinstance(request, Request) else request

    def on_search(query: str, indexes: Sequence[str]) -> None:
        metered_query(scope, query, indexes)

    return ScopedKnowledge(chat, limits, principal_of(scope), telemetry, on_search)
