"""The one error family: every failure a client should see is a :class:`ServiceError`.

A ``ServiceError`` carries what the HTTP layer needs to answer (status, a message that says what to
fix, the OpenAI ``param``/``code``/``type`` fields), so no handler guesses a status from an
exception's class, and one mapping (``ragserve.http.errors``) turns any of them into a response. Engines,
limits, the chat pipeline and the storage layer raise subclasses of it. Exceptions cross process
boundaries (Ray handles) by pickling, and :meth:`ServiceError.__reduce__` is the one place that
keeps every field across that hop, for every subclass (docs/architecture.md §10).

This module is a leaf: it imports nothing from the application, so any layer may raise these.
"""

from __future__ import annotations

from typing import Any


class ServiceError(Exception):
    """A failure with the HTTP status and the message a client should get.

    ``status`` and ``type`` default to the class's; an instance may override both (an upstream's
    own status, say)."""

    status: int = 500
    type: str = "server_error"

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        param: str | None = None,
        code: str | int | None = None,
        type_: str | None = None,
    ):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        if status is not None:
            self.status = status
        if type_ is not None:
            self.type = type_

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt without calling __init__, so subclasses with other signatures pickle the same way.
        return (_rebuild, (type(self), self.message, self.__dict__.copy()))


def _rebuild(cls: type[ServiceError], message: str, state: dict[str, Any]) -> ServiceError:
    err = cls.__new__(cls)
    Exception.__init__(err, message)
    err.__dict__.update(state)
    return err


class BadRequestError(ServiceError):
    """The request is malformed or asks for something the server does not allow (400)."""

    status = 400
    type = "invalid_request_error"


class NotFoundError(ServiceError):
    status = 404
    type = "invalid_request_error"  # what OpenAI calls a missing model, say


class ConflictError(ServiceError):
    status = 409
    type = "invalid_request_error"


class PayloadTooLargeError(ServiceError):
    status = 413
    type = "invalid_request_error"


class EngineError(ServiceError):
    """A generation engine or its upstream failed or refused; ``status`` is what the client gets
    (the upstream's own 4xx, 502 for a broken upstream, 504 for a timeout), ``body`` the upstream's
    error body when it sent one. 5xx ones are counted as upstream errors by the HTTP layer."""

    status = 502
    type = "upstream_error"

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type_: str = "upstream_error",
        body: Any = None,
        param: str | None = None,
        code: str | int | None = None,
    ):
        super().__init__(message, status=status, param=param, code=code, type_=type_)
        self.body = body


class UnsupportedMediaTypeError(ServiceError):
    """A file of a kind no converter reads (415)."""

    status = 415
    type = "invalid_request_error"


class ServiceUnavailableError(ServiceError):
    """The server cannot take the request now (busy, or a resource it needs could not be had);
    the client may send it again after ``retry_after`` seconds (503 with a Retry-After header)."""

    status = 503
    type = "server_error"

    def __init__(self, message: str, *, retry_after: int = 1, param: str | None = None, code: str | None = None):
        super().__init__(message, param=param, code=code)
        self.retry_after = retry_after
