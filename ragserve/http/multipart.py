"""A streaming ``multipart/form-data`` reader (RFC 7578) for uploads: a file part's bytes are handed
on as they arrive, so a route can write them to disk with its own size check instead of buffering
the request (Starlette's form parser needs ``python-multipart``, which ragserve does not install, and
spools every file to a temporary file of its own first).

What it accepts is bounded: part headers (``MAX_HEADER_BYTES``), the number of parts, and a text
field's size (:meth:`MultipartReader.read_field`); the body as a whole is bounded by
``ragserve.http.limits.BodySizeMiddleware``. Anything malformed is a 400 naming ``body``.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass

from ragserve.errors import BadRequestError, UnsupportedMediaTypeError

#: The bytes of one part's headers.
MAX_HEADER_BYTES = 16 * 1024
#: Parts in one form.
MAX_PARTS = 32

_TOKEN = r"[^\s;=\"]+"
#: ``; name=value`` or ``; name="quoted \" value"`` in a header (Content-Type, Content-Disposition).
_PARAM = re.compile(rf';\s*({_TOKEN})\s*=\s*(?:"((?:[^"\\]|\\.)*)"|({_TOKEN}))', re.DOTALL)
#: RFC 2046: 1 to 70 characters.
_BOUNDARY = re.compile(r"^[0-9A-Za-z'()+_,\-./:=? ]{0,69}[0-9A-Za-z'()+_,\-./:=?]$")


def _bad(message: str) -> BadRequestError:
    return BadRequestError(f"malformed multipart/form-data body: {message}", param="body")


def header_params(value: str) -> tuple[str, dict[str, str]]:
    """``form-data; name="file"; filename="a.md"`` -> ``("form-data", {"name": "file", "filename": "a.md"})``
    (names lower-cased; a quoted value unescaped)."""
    kind, _, rest = value.partition(";")
    params: dict[str, str] = {}
    for m in _PARAM.finditer(";" + rest):
        quoted, bare = m.group(2), m.group(3)
        params[m.group(1).lower()] = re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else bare
    return kind.strip().lower(), params


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
    :meth:`chunks` or :meth:`read_field` (or neither: what is left of it is skipped)."""

    def __init__(self, content_type: str, stream: AsyncIterator[bytes]) -> None:
        self._delimiter = b"\r\n--" + boundary_of(content_type)
        self._stream = stream
        # The body's first delimiter has no CRLF before it: one is put there, so every delimiter
        # looks alike and a preamble (text before the first) is skipped like the rest of a part.
        self._buf = bytearray(b"\r\n")
        self._eof = False
        self._in_part = True  # the preamble, read as a part no one asked for
        self._parts = 0
        self._done = False

    async def _fill(self) -> bool:
        """Read more of the body into the buffer; False at its end."""
        if self._eof:
            return False
        async for chunk in self._stream:
            if chunk:
                self._buf += chunk
                return True
        self._eof = True
        return False

    async def chunks(self) -> AsyncIterator[bytes]:
        """The current part's bytes as they arrive, up to the delimiter that ends it."""
        keep = len(self._delimiter) - 1  # a delimiter may begin in what was read and end in what was not
        while self._in_part:
            end = self._buf.find(self._delimiter)
            if end >= 0:
                data = bytes(self._buf[:end])
                del self._buf[: end + len(self._delimiter)]
                self._in_part = False
                if data:
                    yield data
                return
            if len(self._buf) > keep:
                data = bytes(self._buf[: len(self._buf) - keep])
                del self._buf[: len(self._buf) - keep]
                yield data
            if not await self._fill():
                raise _bad("the body ends inside a part (no closing boundary)")

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
        while len(self._buf) < 2:  # after a delimiter: "--" ends the body, else CRLF and headers
            if not await self._fill():
                raise _bad("the body ends after a boundary")
        if self._buf[:2] == b"--":
            self._done = True
            return None
        while (end := self._buf.find(b"\r\n\r\n")) < 0:
            if len(self._buf) > MAX_HEADER_BYTES:
                raise _bad(f"a part's headers are longer than {MAX_HEADER_BYTES} bytes")
            if not await self._fill():
                raise _bad("the body ends inside a part's headers")
        if end > MAX_HEADER_BYTES:
            raise _bad(f"a part's headers are longer than {MAX_HEADER_BYTES} bytes")
        head = bytes(self._buf[:end])
        del self._buf[: end + 4]
        self._parts += 1
        if self._parts > MAX_PARTS:
            raise _bad(f"more than {MAX_PARTS} parts")
        self._in_part = True
        return _part(head)


def _part(head: bytes) -> Part:
    """A part from its header block: the transport padding and CRLF after the delimiter, then
    ``Name: value`` lines."""
    padding, _, block = head.partition(b"\r\n")
    if padding.strip(b" \t"):
        raise _bad("a boundary is followed by text on its line")
    try:
        text = block.decode("utf-8")
    except UnicodeDecodeError:
        raise _bad("a part's headers are not UTF-8") from None
    headers: dict[str, str] = {}
    for line in text.split("\r\n"):
        name, colon, value = line.partition(":")
        if not colon:
            raise _bad(f"a part's header line has no ':': {line[:80]!r}")
        headers[name.strip().lower()] = value.strip()
    kind, params = header_params(headers.get("content-disposition", ""))
    if kind != "form-data" or "name" not in params:
        raise _bad("a part has no 'Content-Disposition: form-data; name=...' header")
    return Part(name=params["name"], filename=params.get("filename"), content_type=headers.get("content-type"))
