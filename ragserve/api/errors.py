"""The two error shapes the server sends (docs/architecture.md §8): the OpenAI error
object on ``/v1/*``, where clients are OpenAI SDKs that parse it, and FastAPI's ``{"detail": ...}``
on the KAITO-style document API, whose clients expect that."""

from __future__ import annotations

from pydantic import BaseModel


class ErrorDetail(BaseModel):
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(BaseModel):
    """``{"error": {...}}``: every error on ``/v1/*``, and the last event of a stream that fails."""

    error: ErrorDetail


class DetailResponse(BaseModel):
    """``{"detail": "..."}``: every error on the document API."""

    detail: str


class DetailErrorResponse(DetailResponse):
    """``{"detail": "...", "error": {...}}``: an error of the document API that is also in the OpenAI
    shape (a 429: a key's limits are the same whichever API it calls, and clients read them as OpenAI's)."""

    error: ErrorDetail


def is_openai_path(path: str) -> bool:
    """Whether ``path`` (without the route prefix) is an OpenAI route, answered in the OpenAI shape."""
    return path.startswith("/v1/")


def error_model(
    path: str,
    message: str,
    *,
    type_: str,
    param: str | None = None,
    code: str | int | None = None,
    openai_too: bool = False,
) -> ErrorResponse | DetailResponse:
    """The error body for a request to ``path`` (``openai_too``: on the document API, with the OpenAI
    ``error`` object beside its ``detail``)."""
    if is_openai_path(path):
        return ErrorResponse(error=ErrorDetail(message=message, type=type_, param=param, code=code))
    if openai_too:
        detail = ErrorDetail(message=message, type=type_, param=param, code=code)
        return DetailErrorResponse(detail=message, error=detail)
    return DetailResponse(detail=message)
