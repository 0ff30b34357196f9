"""Request limits checked on parsed requests: each one a setting and each a clear 4xx that names the
field and the allowed maximum (docs/architecture.md §8).

The values come only from :class:`ragserve.config.Settings` (the one place their defaults live); the
body size is enforced while the body streams in, by ``ragserve.http.limits.BodySizeMiddleware``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from ragserve.errors import BadRequestError, PayloadTooLargeError
from ragserve.hardware import usable_cores

if TYPE_CHECKING:
    from ragserve.config import Settings


@dataclass(frozen=True)
class RequestLimits:
    max_request_bytes: int
    max_file_bytes: int
    max_documents_per_request: int
    max_documents_per_job: int
    max_document_chars: int
    max_file_text_chars: int
    max_unpacked_bytes: int
    max_convert_seconds: float
    max_convert_memory_bytes: int
    max_concurrent_conversions: int
    max_chat_messages: int
    max_content_parts: int
    max_top_k: int
    max_list_limit: int

    @classmethod
    def from_settings(cls, settings: Settings) -> RequestLimits:
        values = {f.name: getattr(settings, f.name) for f in fields(cls)}
        values["max_concurrent_conversions"] = values["max_concurrent_conversions"] or usable_cores()
        return cls(**values)

    def document_count(self, n: int, field: str = "documents") -> None:
        if n > self.max_documents_per_request:
            raise PayloadTooLargeError(
                f"{field}: {n} items in one request; at most {self.max_documents_per_request} "
                "are accepted, send them in several requests",
                param=field,
            )

    def documents(self, texts: list[str], field: str = "documents") -> None:
        self.document_count(len(texts), field)
        for i, text in enumerate(texts):
            if len(text) > self.max_document_chars:
                raise PayloadTooLargeError(
                    f"{field}[{i}].text has {len(text)} characters; at most {self.max_document_chars} are "
                    "accepted, split the document",
                    param=f"{field}[{i}].text",
                )

    def messages(self, n: int) -> None:
        if n > self.max_chat_messages:
            raise BadRequestError(
                f"messages: {n} messages; at most {self.max_chat_messages} are accepted", param="messages"
            )

    # --- counted in the JSON as it came, before the body is validated (``ragserve.http.json_body``):
    # validating costs ~10 µs an item on the event loop, so 300,000 tiny messages in a 10 MB body held
    # every request for seconds before the count above refused them
    def raw_messages(self, messages: Any) -> None:
        """``messages`` as sent: how many, and how many content parts they hold together."""
        if not isinstance(messages, list):
            return  # not a list: validation says so
        self.messages(len(messages))
        parts = sum(len(m["content"]) for m in messages if isinstance(m, dict) and isinstance(m.get("content"), list))
        if parts > self.max_content_parts:
            raise BadRequestError(
                f"messages: {parts} content parts in all; at most {self.max_content_parts} are accepted",
                param="messages",
            )

    def raw_job_documents(self, value: Any) -> None:
        """A job's ``documents`` as sent: at most ``max_documents_per_job``."""
        raw_list(lambda n: job_document_count(n, self.max_documents_per_job))(value)

    def raw_documents(self, field: str) -> Callable[[Any], None]:
        """The list ``field`` as sent: at most ``max_documents_per_request`` items (``document_count``)."""
        return raw_list(lambda n: self.document_count(n, field))

    def top_k(self, value: int | None, field: str = "top_k") -> None:
        if value is not None and value > self.max_top_k:
            raise BadRequestError(f"{field} must be at most {self.max_top_k}, got {value}", param=field)

    def list_limit(self, value: int) -> None:
        if value > self.max_list_limit:
            raise BadRequestError(f"limit must be at most {self.max_list_limit}, got {value}", param="limit")


def raw_list(count: Callable[[int], None]) -> Callable[[Any], None]:
    """A check of a field as sent: ``count`` its length when it is a list (anything else is left to
    validation)."""

    def check(value: Any) -> None:
        if isinstance(value, list):
            count(len(value))

    return check


def at_most(field: str, most: int) -> Callable[[int], None]:
    """A count check: a 400 naming ``field`` beyond ``most`` items."""

    def check(n: int) -> None:
        if n > most:
            raise BadRequestError(f"{field}: {n} items; at most {most} are accepted", param=field)

    return check


def job_document_count(n: int, most: int) -> None:
    """A 413 for a job of more than ``most`` (``max_documents_per_job``) documents."""
    if n > most:
        raise PayloadTooLargeError(
            f"documents: {n} in one job; at most {most} are accepted (max_documents_per_job), "
            "send them in several jobs",
            param="documents",
        )
