"""A streaming ``multipart/form-data`` reader (RFC 7578) for uploads, over python-multipart's
push parser (the one Starlette's forms use): a file part's bytes are handed on as they arrive, so a
route writes them to disk with its own size check instead of buffering the request, or having them
spooled to a temporary file of Starlette's first.

What it accepts is bounded: part headers (``MAX_HEADER_BYTES``), the number of parts, and a text
field's size (:meth:`MultipartReader.read_field`); the body as a whole is bounded by
``ragserve.http.limits.BodySizeMiddleware``. Anything malformed is a 400 naming ``body``.
"""

from __future__ import annotations

import logging
import re
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header

from ragserve.errors import BadRequestError, UnsupportedMediaTypeError

# The parser logs every malformed body it meets as a warning: what a client sends is not the
# server's news (the client gets its 400), and a client could fill the log with it.
logging.getLogger("python_multipart.multipart").setLevel(logging.ERROR)

#: The bytes of one part's headers.
MAX_HEADER_BYTES = 16 * 1024
#: Parts in one form.
MAX_PARTS = 32

#: RFC 2046: 1 to 70 characters.
_BOUNDARY = re.compile(r"^[0-9A-Za-z'()+_,\-./:=? ]{0,69}[0-9A-Za-z'()+_,\-./:=?]$")


def _bad(message: str) -> BadRequestError:
    return BadRequestError(f"malformed multipart/form-data body: {message}", param="body")


def header_params(value: str) -> tuple[str, dict[str, str]]:
    """``form-data; name="file"; filename="a.md"`` -> ``("form-data", {"name": "file", "filename": "a.md"})``
    (names lower-cased; a quoted value unescaped): python-multipart's reading of a header."""
    kind, params = parse_options_header(value.encode("utf-8"))  # a str it would encode as Latin-1
    return (
        kind.decode("latin-1").strip().lower(),
        {k.decode("latin-1").lower(): v.decode("utf-8", "replace") for k, v in params.items()},
    )


def boundary_of(content_type: str) -> bytes:
    """The boundary of a ``multipart/form-data`` content type; a 415 for another type, a 400 for a
    missing or malformed boundary."""
    kind, params = header_params(content_type)
    if kind != "multipart/form-data":
        raise UnsupportedMediaTypeError(
            f"send a multipart/form-data body (fields 'file' and 'purpose'), not {kind or 'no Content-Type'!r}",
            param="body",
        )
    boundary = params.get("boundary", "")
    if not _BOUNDARY.match(boundary):
        raise _bad(f"the Content-Type has no valid boundary: {boundary!r}")
    return boundary.encode("ascii")


@dataclass(frozen=True)
class Part:
    """One part's headers: its field ``name``, the ``filename`` a file part carries (None for a text field)."""

    name: str
    filename: str | None
    content_type: str | None


class MultipartReader:
    """Reads the parts of a body one at a time: :meth:`next_part`, then the part's bytes with
    :meth:`chunks` or :meth:`read_field` (or neither: what is left of it is skipped).

    The parser is fed the body a chunk at a time and reports what it found as events (a part's
    headers, its data, its end, the body's end), which these methods take in order; nothing is read
    from the body before an event is wanted."""

    def __init__(self, content_type: str, stream: AsyncIterator[bytes]) -> None:
        self._stream = stream
        self._events: deque[tuple[str, Any]] = deque()
        self._head = bytearray()  # the current part's header block, as "name: value" lines
        self._field = bytearray()
        self._value = bytearray()
        self._parts = 0
        self._in_part = False
        self._done = False
        self._eof = False
        self._parser = MultipartParser(
            boundary_of(content_type),
            {
                "on_part_begin": self._begin,
                "on_header_field": lambda data, start, end: self._header_bytes(self._field, data, start, end),
                "on_header_value": lambda data, start, end: self._header_bytes(self._value, data, start, end),
                "on_header_end": self._header_end,
                "on_headers_finished": lambda: self._events.append(("part", bytes(self._head))),
                "on_part_data": lambda data, start, end: self._events.append(("data", bytes(data[start:end]))),
                "on_part_end": lambda: self._events.append(("end", None)),
                "on_end": lambda: self._events.append(("done", None)),
            },
        )

    # --- the parser's callbacks ---------------------------------------------------------------
    def _begin(self) -> None:
        self._head.clear()
        self._parts += 1
        if self._parts > MAX_PARTS:
            raise _bad(f"more than {MAX_PARTS} parts")

    def _header_bytes(self, into: bytearray, data: bytes, start: int, end: int) -> None:
        into += data[start:end]
        if len(self._head) + len(self._field) + len(self._value) > MAX_HEADER_BYTES:
            raise _bad(f"a part's headers are longer than {MAX_HEADER_BYTES} bytes")

    def _header_end(self) -> None:
        self._head += bytes(self._field) + b":" + bytes(self._value) + b"\r\n"
        self._field.clear()
        self._value.clear()

    # --- reading ------------------------------------------------------------------------------
    async def _event(self) -> tuple[str, Any]:
        """The next event, feeding the parser more of the body until there is one."""
        while not self._events:
            if self._eof:
                raise _bad("the body ends inside a part (no closing boundary)")
            chunk = b""
            async for chunk in self._stream:
                if chunk:
                    break
            else:
                self._eof = True
                try:
                    self._parser.finalize()
                except MultipartParseError as e:
                    raise _bad(str(e)) from None
                continue
            try:
                self._parser.write(chunk)
            except MultipartParseError as e:
                raise _bad(str(e)) from None
        return self._events.popleft()

    async def chunks(self) -> AsyncIterator[bytes]:
        """The current part's bytes as they arrive, up to the delimiter that ends it."""
        while self._in_part:
            kind, value = await self._event()
            if kind == "data":
                if value:
                    yield value
            elif kind == "end":
                self._in_part = False
            else:  # the parser reports a part's end before anything else
                raise _bad("a part does not end before the next begins")

    async def read_field(self, name: str, max_bytes: int) -> str:
        """The current part as UTF-8 text of at most ``max_bytes`` bytes (else a 400 naming ``name``)."""
        data = bytearray()
        async for chunk in self.chunks():
            data += chunk
            if len(data) > max_bytes:
                raise BadRequestError(f"{name} must be at most {max_bytes} bytes", param=name)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise BadRequestError(f"{name} must be UTF-8 text", param=name) from None

    async def next_part(self) -> Part | None:
        """The next part's headers (skipping what is left of the current part), or None after the last."""
        if self._done:
            return None
        async for _ in self.chunks():
            pass
        kind, value = await self._event()
        if kind == "done":
            self._done = True
            return None
        if kind != "part":
            raise _bad(f"expected a part's headers, found {kind}")
        self._in_part = True
        return _part(value)


def _part(head: bytes) -> Part:
    """A part from its header lines (``Name:value``, as the parser gave them)."""
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        raise _bad("a part's headers are not UTF-8") from None
    headers: dict[str, str] = {}
    for line in text.split("\r\n"):
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    kind, params = header_params(headers.get("content-disposition", ""))
    if kind != "form-data" or "name" not in params:
        raise _bad("a part has no 'Content-Disposition: form-data; name=...' header")
    return Part(name=params["name"], filename=params.get("filename"), content_type=headers.get("content-type"))
