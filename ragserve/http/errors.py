"""Errors to HTTP, in one place (docs/architecture.md §10).

Every :class:`ragserve.errors.ServiceError` becomes its status with the body shape of the route: the
OpenAI error object on ``/v1/*``, ``{"detail": ...}`` on the document API. Request-validation
errors are 400 on ``/v1/*`` (what OpenAI answers) and 422 elsewhere (FastAPI's, which KAITO
clients expect). The middlewares that answer before a route runs (authentication, body size) build
their bodies with :func:`error_bytes`, so their shape is the same.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable, MutableMapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ragserve.api.errors import DetailResponse, ErrorResponse, error_model, is_openai_path
from ragserve.api.values import json_error_message
from ragserve.errors import EngineError, ServiceError
from ragserve.service.usage import Decision, RateLimitError
from ragserve.telemetry import Telemetry

log = logging.getLogger("ragserve.http")

#: What the OpenAPI document lists for the errors of each kind of route.
_ERRORS = {
    400: "The request is invalid (the message says what to fix).",
    401: "Missing or wrong API key.",
    403: "The API key does not reach this index or operation.",
    404: "The named index does not exist.",
    409: "Conflicts with the current state (an index that exists, a write racing a drop).",
    413: "The request is too large.",
    422: "The body or query does not match the schema.",
    429: "Over the API key's requests_per_minute or tokens_per_day (Retry-After and x-ratelimit-* say until when).",
    500: "Internal error.",
    502: "The upstream LLM failed.",
    504: "The upstream LLM timed out.",
}


def _declared(model: type, codes: tuple[int, ...]) -> dict[int | str, dict[str, Any]]:
    return {code: {"model": model, "description": _ERRORS[code]} for code in codes}


#: What the OpenAPI document lists for the errors of each kind of route.
OPENAI_ERRORS = _declared(ErrorResponse, (400, 401, 403, 404, 413, 429, 500, 502, 504))
DOCUMENT_ERRORS = _declared(DetailResponse, (400, 401, 403, 404, 409, 413, 422, 429, 500))


def route_path(scope: MutableMapping[str, Any]) -> str:
    """The request path without the Serve route prefix (``root_path``)."""
    path, root = scope.get("path", ""), scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root) :] or "/"
    return str(path)


def error_bytes(
    path: str,
    message: str,
    *,
    type_: str,
    param: str | None = None,
    code: str | int | None = None,
    openai_too: bool = False,
) -> bytes:
    """A serialised error body for a request to ``path``."""
    body = error_model(path, message, type_=type_, param=param, code=code, openai_too=openai_too)
    return body.model_dump_json().encode()


def error_response(request: Request, error: ServiceError) -> JSONResponse:
    body = error_model(
        route_path(request.scope),
        error.message,
        type_=error.type,
        param=error.param,
        code=error.code,
        openai_too=isinstance(error, RateLimitError),
    )
    retry_after = getattr(error, "retry_after", None)  # ServiceUnavailableError, RateLimitError
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
    if isinstance(error, RateLimitError):
        headers.update((k.decode(), v.decode()) for k, v in ratelimit_headers(error.decision))
    return JSONResponse(body.model_dump(), status_code=error.status, headers=headers or None)


def reset_text(seconds: float) -> str:
    """A time until a window resets as OpenAI writes it in ``x-ratelimit-reset-*``: ``250ms``,
    ``17s``, ``6m0s``, ``1h30m0s`` (whole seconds, rounded up, from one second on)."""
    if seconds < 1:
        return f"{max(0, math.ceil(seconds * 1000))}ms"
    total = math.ceil(seconds)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"


def ratelimit_headers(decision: Decision) -> list[tuple[bytes, bytes]]:
    """OpenAI's ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` for the limits a key has."""
    out = []
    for kind, allowance in (("requests", decision.requests), ("tokens", decision.tokens)):
        if allowance is not None:
            out += [
                (f"x-ratelimit-limit-{kind}".encode(), str(allowance.limit).encode()),
                (f"x-ratelimit-remaining-{kind}".encode(), str(max(0, allowance.remaining)).encode()),
                (f"x-ratelimit-reset-{kind}".encode(), reset_text(allowance.reset_s).encode()),
            ]
    return out


def error_event(error: ServiceError) -> ErrorResponse:
    """The last event of a stream that failed after its 200: the OpenAI error object, with the
    status as its ``code`` (there is no status line left to carry it)."""
    model = error_model("/v1/", error.message, type_=error.type, param=error.param, code=error.status)
    assert isinstance(model, ErrorResponse)
    return model


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    parts, param = [], None
    for err in exc.errors()[:5]:
        if err.get("type") == "json_invalid":  # FastAPI's: loc is ("body", offset), the doc exc.body
            return _json_error(exc.body, err), None
        raw = list(err.get("loc", ()))
        if raw and raw[0] in _SOURCES:  # where FastAPI found it; a field may be named "query" too
            raw = raw[1:]
        loc = [str(x) for x in raw if not _union_tag(x)]
        where = ".".join(loc) or "body"
        param = param or (".".join(loc) or None)  # a field, or none for the body as a whole
        msg = _UNICODE_MESSAGE if err.get("type") == "string_unicode" else err.get("msg", "invalid")
        parts.append(f"{where}: {msg}")
    return "; ".join(parts) or "invalid request", param


#: The first part of a FastAPI error's location: where in the request the value was.
_SOURCES = frozenset({"body", "query", "path", "header", "cookie"})
#: pydantic's words for a string it cannot read as text (a lone surrogate, in a constrained field
#: that pydantic checks before ``RequestModel`` does), in ``RequestModel``'s.
_UNICODE_MESSAGE = "contains a lone surrogate (\\ud800-\\udfff): send valid UTF-8 text"

#: What pydantic puts in an error's location for the member of a union that failed (``str``,
#: ``list[ContentPart]``, ``function-after[...]``): not a field, so not shown.
_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none", "bytes"})


def _union_tag(part: Any) -> bool:
    return isinstance(part, str) and (part in _TYPE_TAGS or "[" in part)


def _json_error(doc: Any, err: dict[str, Any]) -> str:
    """Where a body is not JSON, as line and column, and what is wrong there."""
    why = str((err.get("ctx") or {}).get("error", "not JSON"))
    offset = next((x for x in err.get("loc", ()) if isinstance(x, int)), None)
    if isinstance(doc, str) and offset is not None:
        return json_error_message(json.JSONDecodeError(why, doc, offset))
    return f"invalid JSON: {why}"


def install_error_handlers(app: FastAPI, telemetry: Telemetry) -> None:
    @app.exception_handler(RequestValidationError)
    async def _on_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        openai = is_openai_path(route_path(request.scope))
        return error_response(
            request, ServiceError(message, status=400 if openai else 422, param=param, type_="invalid_request_error")
        )

    @app.exception_handler(StarletteHTTPException)
    async def _on_http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # The framework's own (no such route, method not allowed), in the route's error shape.
        type_ = "invalid_request_error" if exc.status_code < 500 else "server_error"
        body = error_model(route_path(request.scope), str(exc.detail), type_=type_)
        return JSONResponse(body.model_dump(), status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(ServiceError)
    async def _on_service_error(request: Request, exc: ServiceError) -> JSONResponse:
        if isinstance(exc, EngineError) and exc.status >= 500:
            telemetry.upstream_error(exc.type)
        return error_response(request, exc)

    @app.exception_handler(Exception)
    async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        # A defect, not a client mistake: a 500 in the route's error shape, the details in the log
        # only (Starlette re-raises it after this answer, so the server logs its traceback too).
        log.error("unexpected %s on %s", type(exc).__name__, route_path(request.scope))
        body = error_model(
            route_path(request.scope),
            "internal server error; its details are in the server's log",
            type_="server_error",
        )
        return JSONResponse(body.model_dump(), status_code=500)


async def send_error(send: Any, status: int, body: bytes, headers: Iterable[tuple[bytes, bytes]] = ()) -> None:
    """Answer from a middleware, before any route ran."""
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers],
        }
    )
    await send({"type": "http.response.body", "body": body})
