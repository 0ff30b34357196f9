"""The OpenAI-compatible routes: chat completions (RAG or passthrough, streamed or not), models,
embeddings. Errors here are the OpenAI error object (``ragserve.http.errors``)."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from ragserve.api.openai import (
    MAX_TOOLS,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    EmbeddingRequest,
    EmbeddingResponse,
    ModelCard,
    ModelList,
)
from ragserve.errors import EngineError, ServiceError
from ragserve.http.errors import OPENAI_ERRORS, error_event
from ragserve.http.headers import query_headers
from ragserve.http.json_body import ChatJSONRoute, counted_first
from ragserve.http.routes.common import allow, metered_chat, report_latencies
from ragserve.http.server_timing import server_timing
from ragserve.http.usage import usage_of
from ragserve.service.access import Role
from ragserve.service.chat import ChatOutcome
from ragserve.service.limits import at_most, raw_list
from ragserve.service.wiring import Services
from ragserve.telemetry import Telemetry

log = logging.getLogger("ragserve.http")

_CHAT_RESPONSES: dict[int | str, dict[str, object]] = {
    200: {
        "description": "A chat completion, or with `stream: true` a `text/event-stream` of "
        "`ChatCompletionChunk` events ending with `data: [DONE]`.",
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    },
    **OPENAI_ERRORS,
}


def _sse(chunk: ChatCompletionChunk) -> str:
    return f"data: {chunk.model_dump_json(exclude_unset=True)}\n\n"


def _sse_error(error: ServiceError) -> str:
    return f"data: {error_event(error).model_dump_json()}\n\n"


def openai_router(services: Services) -> APIRouter:
    # chat completions and embeddings: bodies of at most MAX_CHAT_JSON_VALUES values
    router = APIRouter(tags=["openai"], responses=OPENAI_ERRORS, route_class=ChatJSONRoute)
    chat, limits, tel = services.chat, services.limits, services.telemetry

    @router.post(
        "/v1/chat/completions",
        response_model=ChatCompletionResponse,
        responses=_CHAT_RESPONSES,
        dependencies=[
            counted_first(
                messages=limits.raw_messages,
                tools=raw_list(at_most("tools", MAX_TOOLS)),
                functions=raw_list(at_most("functions", MAX_TOOLS)),
            )
        ],
    )
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        """OpenAI chat completions; with `index_name`, answered from the index (RAG). The response
        says which with `X-RAG-Mode` (and `X-RAG-Reason` for a passthrough), and the query retrieval
        used with `X-RAG-Query`: the body's `rag.query` in its JSON-safe form (what
        `json.dumps(query, ensure_ascii=True)` writes between the quotes: ASCII as it is, other
        characters as `\\uXXXX`, control characters as `\\n`, `\\r`, `\\t` or `\\uXXXX`; read
        it back with a JSON parser), at most 256 bytes: a longer one is cut between characters and
        `X-RAG-Query-Truncated: true` says so; the body's `rag` has it whole."""
        allow(request, Role.READ, body.index_name)
        t0 = time.perf_counter()
        limits.top_k(body.top_k)  # messages: counted before validation (counted_first)
        outcome = await chat.complete(body, request.headers.get("cache-control"))
        headers = {"X-RAG-Mode": outcome.mode}
        if outcome.reason:
            headers["X-RAG-Reason"] = outcome.reason
        if outcome.cache is not None:  # the answer cache: hit, miss or bypass (docs/architecture.md §4)
            headers["X-RAG-Cache"] = outcome.cache
        if outcome.rag is not None:  # the query retrieval searched with (a follow-up's may differ)
            headers.update(query_headers(outcome.rag.query))
        if outcome.stream is None:
            assert outcome.response is not None
            _report_chat(tel, outcome, time.perf_counter() - t0)
            metered_chat(request, outcome)
            headers["Server-Timing"] = server_timing(outcome.timings)
            return Response(
                outcome.response.model_dump_json(exclude_unset=True), media_type="application/json", headers=headers
            )
        stream = outcome.stream
        try:  # the first chunk decides between an HTTP error and a 200 stream
            first = await anext(stream)
        except StopAsyncIteration:
            first = None
        return StreamingResponse(
            _relay(stream, first, outcome, t0, request),
            media_type="text/event-stream",
            headers={**headers, "Cache-Control": "no-cache"},
        )

    async def _relay(
        stream: AsyncGenerator[ChatCompletionChunk, None],
        first: ChatCompletionChunk | None,
        outcome: ChatOutcome,
        t0: float,
        request: Request,
    ) -> AsyncIterator[str]:
        try:
            if first is not None:
                yield _sse(first)
            async for chunk in stream:
                yield _sse(chunk)
        except ServiceError as e:
            if isinstance(e, EngineError):
                tel.upstream_error(e.type)
            yield _sse_error(e)
        except Exception as e:  # the client gets a final error event, never a hung stream
            log.exception("stream failed")
            tel.upstream_error("internal")
            yield _sse_error(ServiceError(f"stream failed: {e}"))
        finally:
            await stream.aclose()
            _report_chat(tel, outcome, time.perf_counter() - t0)
            metered_chat(request, outcome)  # the tokens the stream used, once it has ended
        yield "data: [DONE]\n\n"

    @router.get("/v1/models")
    async def list_models(request: Request) -> ModelList:
        allow(request, Role.READ)
        llm = chat.llm
        return ModelList(data=[ModelCard(id=llm.model_id, max_model_len=await llm.context_window())])

    @router.post("/v1/embeddings", dependencies=[counted_first(input=limits.raw_documents("input"))])
    async def embeddings(body: EmbeddingRequest, request: Request) -> EmbeddingResponse:
        allow(request, Role.READ)
        limits.documents(body.inputs(), "input")
        response = await services.embeddings.create(body)
        record = usage_of(request)
        if record is not None:  # the embedding model's count, as the response reports it
            record.usage.embedding_tokens += response.usage.prompt_tokens
        return response

    return router


def _report_chat(tel: Telemetry, outcome: ChatOutcome, seconds: float) -> None:
    report_latencies(tel, outcome.timings)
    tel.latency("chat_total", seconds)
    if outcome.mode == "rag" and outcome.cache != "hit":  # a cached answer sent no context to a model
        tel.chat_tokens(
            outcome.stats.get("context_tokens", 0),
            outcome.stats.get("history_tokens", 0),
            outcome.stats.get("history_dropped", 0),
        )
