"""Errors the services raise for the client to see; the ingress maps them to HTTP.

They carry the status and a message that says what to fix, so no handler has to guess.
"""

from __future__ import annotations


class ServiceError(Exception):
    status = 500

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code

    def __reduce__(self):  # type: ignore[no-untyped-def]
        # survives pickling across Ray handles with its status and fields
        return (_rebuild, (type(self), self.__dict__.copy(), self.message))


class BadRequestError(ServiceError):
    status = 400


class NotFoundError(ServiceError):
    status = 404


class ConflictError(ServiceError):
    status = 409


class UpstreamError(ServiceError):
    """The LLM (or a remote embedder) failed; ``status`` is the upstream's own."""

    def __init__(self, status: int, message: str, *, code: str | None = None):
        super().__init__(message, code=code)
        self.status = status


def _rebuild(cls: type[ServiceError], state: dict, message: str) -> ServiceError:
    err = cls.__new__(cls)
    Exception.__init__(err, message)
    err.__dict__.update(state)
    return err
