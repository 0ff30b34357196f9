"""FastAPI application: the OpenAI-compatible routes and the KAITO-style document API.

Handlers only translate HTTP to service calls and back; errors become the OpenAI error shape on
``/v1/*`` and ``{"detail": ...}`` elsewhere (ARCHITECTURE §4), never a 500 for a client mistake.
"""

from __future__ import annotations

import base64
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from app.api.documents import (
    DeleteDocumentsRequest,
    DeleteDocumentsResponse,
    DocumentRecord,
    IndexRequest,
    ListDocumentsResponse,
    MessageResponse,
    QueryRequest,
    QueryResponse,
    RetrieveRequest,
    RetrieveResponse,
    UpdateDocumentsRequest,
    UpdateDocumentsResponse,
    validate_index_name,
    validate_metadata_filter,
)
from app.api.openai import (
    ChatCompletionRequest,
    EmbeddingData,
    EmbeddingRequest,
    EmbeddingResponse,
    ModelCard,
    ModelList,
    UsageInfo,
)
from app.engines.base import EngineError
from app.http.limits import BodySizeMiddleware, RequestLimits
from app.http.routes_extra import add_extra_routes
from app.http.security import ApiKeyMiddleware
from app.http.telemetry import NullTelemetry, RequestCountingMiddleware, Telemetry
from app.service.chat import ChatOutcome, ChatService
from app.service.documents import DocumentService
from app.service.errors import BadRequestError, ServiceError

log = logging.getLogger("ragserve.http")


@dataclass
class Services:
    """Everything the routes call; built by the Serve ingress or by a test."""

    documents: DocumentService
    chat: ChatService
    embed_texts: Callable[[list[str]], Awaitable[np.ndarray]]
    count_embedding_tokens: Callable[[list[str]], Awaitable[int]]
    embedding_model: str
    telemetry: Telemetry = field(default_factory=NullTelemetry)
    health: Callable[[], Awaitable[dict[str, Any]]] | None = None
    metrics_text: Callable[[], Awaitable[str]] | None = None
    limits: RequestLimits = field(default_factory=RequestLimits)
    api_keys: list[str] | None = None  # None: no authentication (the local default)


def _is_openai_route(request: Request) -> bool:
    path, root = request.url.path, request.scope.get("root_path", "")
    if root and path.startswith(root):  # mounted under a route prefix
        path = path[len(root):]
    return path.startswith("/v1/")


def error_response(request: Request, status: int, message: str, *, type_: str | None = None,
                   param: str | None = None, code: str | int | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    """OpenAI error shape on /v1/*, ``{"detail": message}`` on the document API."""
    if _is_openai_route(request):
        etype = type_ or ("invalid_request_error" if status < 500 else "server_error")
        body: dict[str, Any] = {"error": {"message": message, "type": etype, "param": param, "code": code}}
    else:
        body = {"detail": message}
    return JSONResponse(body, status_code=status, headers=headers)


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    parts, param = [], None
    for err in exc.errors()[:5]:
        loc = [str(x) for x in err.get("loc", ()) if x not in ("body", "query", "path")]
        where = ".".join(loc) or "body"
        param = param or where
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request", param


def _index_name(name: str) -> str:
    try:
        return validate_index_name(name)
    except ValueError as e:
        raise BadRequestError(str(e), param="index_name") from e


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'), ensure_ascii=False)}\n\n"


def create_app(services: Services) -> FastAPI:
    app = FastAPI(title="ragserve", version="0.1.0",
                  description="OpenAI-compatible RAG server with a KAITO RAGEngine-style document API.")
    docs = services.documents
    chat: ChatService = services.chat
    tel = services.telemetry
    limits = services.limits
    # Outermost last: authentication runs before a body is read, the size limit while it is read.
    app.add_middleware(BodySizeMiddleware, max_bytes=limits.max_request_bytes)
    if services.api_keys:
        app.add_middleware(ApiKeyMiddleware, keys=services.api_keys,
                           on_reject=lambda reason: tel.request("unauthenticated", 401, "", reason))
    app.add_middleware(RequestCountingMiddleware, telemetry=tel)  # outermost: sees every response

    @app.exception_handler(RequestValidationError)
    async def _on_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        status = 400 if _is_openai_route(request) else 422
        return error_response(request, status, message, param=param)

    @app.exception_handler(ServiceError)
    async def _on_service_error(request: Request, exc: ServiceError) -> JSONResponse:
        return error_response(request, exc.status, exc.message, param=exc.param, code=exc.code)

    @app.exception_handler(EngineError)
    async def _on_engine_error(request: Request, exc: EngineError) -> JSONResponse:
        if exc.status >= 500:
            tel.upstream_error(exc.type)
        return error_response(request, exc.status, exc.message, type_=exc.type)

    # --- OpenAI-compatible -------------------------------------------------------------------
    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        t0 = time.perf_counter()
        limits.messages(len(body.messages))
        limits.top_k(body.top_k)
        outcome = await chat.complete(body)
        headers = {"X-RAG-Mode": outcome.mode}
        if outcome.reason:
            headers["X-RAG-Reason"] = outcome.reason
        if outcome.stream is None:
            _report_chat(tel, outcome, time.perf_counter() - t0)
            headers["Server-Timing"] = _server_timing(outcome.timings)
            return JSONResponse(outcome.response, headers=headers)
        stream = outcome.stream
        try:  # the first chunk decides between an HTTP error and a 200 stream
            first = await stream.__anext__()
        except StopAsyncIteration:
            first = None
        return StreamingResponse(_relay(stream, first, outcome, t0), media_type="text/event-stream",
                                 headers={**headers, "Cache-Control": "no-cache"})

    async def _relay(stream: AsyncIterator[dict[str, Any]], first: dict[str, Any] | None,
                     outcome: ChatOutcome, t0: float) -> AsyncIterator[str]:
        try:
            if first is not None:
                yield _sse(first)
            async for chunk in stream:
                yield _sse(chunk)
        except EngineError as e:
            tel.upstream_error(e.type)
            yield _sse({"error": {"message": e.message, "type": e.type, "param": None, "code": e.status}})
        except Exception as e:  # the client gets a final error event, never a hung stream
            log.exception("stream failed")
            tel.upstream_error("internal")
            yield _sse({"error": {"message": f"stream failed: {e}", "type": "server_error", "param": None,
                                  "code": 500}})
        finally:
            await stream.aclose()
            _report_chat(tel, outcome, time.perf_counter() - t0)
        yield "data: [DONE]\n\n"

    @app.get("/v1/models")
    async def list_models() -> ModelList:
        gen = chat.generator
        window = await gen.context_window()
        return ModelList(data=[ModelCard(id=gen.model_id, max_model_len=window)])

    @app.post("/v1/embeddings")
    async def embeddings(body: EmbeddingRequest) -> EmbeddingResponse:
        texts = body.inputs()
        limits.documents(texts, "input")
        vecs = await services.embed_texts(texts)
        tokens = await services.count_embedding_tokens(texts)
        data = []
        for i, v in enumerate(vecs):
            v = np.asarray(v, dtype=np.float32)
            if body.dimensions:
                v = v[: body.dimensions]
                v = v / (np.linalg.norm(v) or 1.0)
            emb: list[float] | str = (base64.b64encode(v.astype("<f4").tobytes()).decode()
                                      if body.encoding_format == "base64" else v.tolist())
            data.append(EmbeddingData(index=i, embedding=emb))
        return EmbeddingResponse(data=data, model=services.embedding_model,
                                 usage=UsageInfo(prompt_tokens=tokens, total_tokens=tokens))

    # --- document API ------------------------------------------------------------------------
    @app.post("/index")
    async def index_documents(body: IndexRequest) -> list[DocumentRecord]:
        limits.documents([d.text for d in body.documents])
        records = await docs.add_documents(body.index_name, body.documents)
        tel.indexed(len(records))
        return records

    @app.get("/indexes")
    async def list_indexes() -> list[str]:
        return await docs.list_indexes()

    @app.get("/indexes/{index_name}/documents")
    async def list_documents(
        index_name: str,
        limit: int = Query(10, ge=1, le=1000),
        offset: int = Query(0, ge=0),
        max_text_length: int | None = Query(1000, ge=1),
        metadata_filter: str | None = Query(None, description="JSON object of key: value pairs"),
    ) -> ListDocumentsResponse:
        name = _index_name(index_name)
        limits.list_limit(limit)
        flt = None
        if metadata_filter:
            try:
                flt = validate_metadata_filter(json.loads(metadata_filter))
            except (ValueError, TypeError) as e:
                raise BadRequestError(f"metadata_filter must be a JSON object of key: value pairs: {e}",
                                      param="metadata_filter") from e
        return await docs.list_documents(name, limit=limit, offset=offset, max_text_length=max_text_length,
                                         metadata_filter=flt)

    @app.post("/indexes/{index_name}/documents")
    async def update_documents(index_name: str, body: UpdateDocumentsRequest) -> UpdateDocumentsResponse:
        limits.documents([d.text for d in body.documents])
        return await docs.update_documents(_index_name(index_name), body.documents)

    @app.post("/indexes/{index_name}/documents/delete")
    async def delete_documents(index_name: str, body: DeleteDocumentsRequest) -> DeleteDocumentsResponse:
        limits.document_count(len(body.doc_ids), "doc_ids")
        return await docs.delete_documents(_index_name(index_name), body.doc_ids)

    @app.delete("/indexes/{index_name}")
    async def delete_index(index_name: str) -> MessageResponse:
        return MessageResponse(message=await docs.drop_index(_index_name(index_name)))

    @app.post("/persist/{index_name}")
    async def persist(index_name: str, path: str | None = None) -> MessageResponse:
        return MessageResponse(message=await docs.persist(_index_name(index_name), path))

    @app.post("/load/{index_name}")
    async def load(index_name: str, path: str | None = None, overwrite: bool = False) -> MessageResponse:
        return MessageResponse(message=await docs.load(_index_name(index_name), path, overwrite))

    @app.post("/query")
    async def query(body: QueryRequest) -> QueryResponse:
        limits.top_k(body.top_k)
        return await chat.query(body)

    @app.post("/retrieve")
    async def retrieve(body: RetrieveRequest, response: Response) -> RetrieveResponse:
        limits.top_k(body.max_node_count, "max_node_count")
        nodes, timings = await docs.retrieve(body.index_name, body.query, body.max_node_count, body.metadata_filter)
        for stage, seconds in timings.items():
            tel.latency(stage, seconds)
        response.headers["Server-Timing"] = _server_timing(timings)
        if body.similarity_threshold is not None:
            nodes = [n for n in nodes if n.score >= body.similarity_threshold]
        return RetrieveResponse(query=body.query, results=nodes, count=len(nodes))

    # --- operations --------------------------------------------------------------------------
    @app.get("/health")
    async def health() -> dict[str, Any]:
        return await services.health() if services.health else {"status": "ok"}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        text = await services.metrics_text() if services.metrics_text else ""
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    add_extra_routes(app, services)  # stats, settings, file upload, the /ui playground (routes_extra.py)
    return app


def _server_timing(timings: dict[str, float]) -> str:
    return ", ".join(f"{k};dur={v * 1000:.1f}" for k, v in timings.items())


def _report_chat(tel: Telemetry, outcome: ChatOutcome, seconds: float) -> None:
    for stage, s in outcome.timings.items():
        tel.latency(stage, s)
    tel.latency("chat_total", seconds)
    if outcome.mode == "rag":
        tel.chat_tokens(outcome.stats.get("context_tokens", 0), outcome.stats.get("history_tokens", 0),
                        outcome.stats.get("history_dropped", 0))
