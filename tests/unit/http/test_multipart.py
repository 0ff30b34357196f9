"""The streaming multipart/form-data reader: what httpx (the openai SDK's encoder) sends, split at
every possible place, parses to the same parts; every malformed body is a 400 naming ``body``."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from ragserve.errors import BadRequestError, UnsupportedMediaTypeError
from ragserve.http.multipart import MAX_PARTS, MultipartReader, header_params

FILE = bytes(range(256)) * 4 + b"\r\n--boundary-lookalike\r\n\r\n--"


def encoded(files: dict, data: dict | None = None) -> tuple[str, bytes]:
    request = httpx.Request("POST", "http://x/", files=files, data=data)
    return request.headers["content-type"], request.read()


async def split(body: bytes, size: int) -> AsyncIterator[bytes]:
    for i in range(0, len(body), size):
        yield body[i : i + size]


async def parse(content_type: str, body: bytes, size: int = 65536) -> list[tuple[str, str | None, bytes]]:
    reader = MultipartReader(content_type, split(body, size))
    out = []
    while (part := await reader.next_part()) is not None:
        out.append((part.name, part.filename, b"".join([c async for c in reader.chunks()])))
    return out


@pytest.mark.parametrize("size", [1, 2, 7, 40, 1000, 65536])
async def test_httpx_forms_parse_alike_however_they_are_split(size: int) -> None:
    content_type, body = encoded({"file": ("notes.md", FILE)}, {"purpose": "assistants"})
    assert await parse(content_type, body, size) == [
        ("purpose", None, b"assistants"),
        ("file", "notes.md", FILE),
    ]


async def test_an_epilogue_and_a_quoted_boundary() -> None:
    body = (
        b"--xyz\r\n"
        b'Content-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        b'--xyz\r\ncontent-disposition: form-data; filename="a \\"q\\".md"; name=file\r\n'
        b"Content-Type: text/markdown\r\n\r\n# x\r\n--xyz--\r\nignored epilogue"
    )
    assert await parse('multipart/form-data; boundary="xyz"', body, 3) == [
        ("purpose", None, b"batch"),
        ("file", 'a "q".md', b"# x"),
    ]


async def test_a_part_left_unread_is_skipped() -> None:
    content_type, body = encoded({"a": ("a.bin", b"x" * 5000), "b": ("b.bin", b"y")})
    reader = MultipartReader(content_type, split(body, 100))
    assert (await reader.next_part()).name == "a"  # type: ignore[union-attr]
    part = await reader.next_part()
    assert part is not None and part.name == "b"
    assert await reader.read_field("b", 10) == "y"
    assert await reader.next_part() is None


async def test_a_file_name_outside_latin_1_is_read_as_utf8() -> None:
    content_type, body = encoded({"file": ("отчёт 日本.md", b"x")})
    assert await parse(content_type, body, 7) == [("file", "отчёт 日本.md", b"x")]


def test_header_params() -> None:
    assert header_params('form-data; name="f"; filename="x;y.md"') == ("form-data", {"name": "f", "filename": "x;y.md"})
    assert header_params("Multipart/Form-Data; Boundary=abc") == ("multipart/form-data", {"boundary": "abc"})


async def test_not_multipart_is_a_415() -> None:
    with pytest.raises(UnsupportedMediaTypeError):
        MultipartReader("application/json", split(b"{}", 10))


@pytest.mark.parametrize(
    ("content_type", "body", "says"),
    [
        ("multipart/form-data", b"", "boundary"),
        ("multipart/form-data; boundary=" + "x" * 71, b"", "boundary"),
        ("multipart/form-data; boundary=b", b"--b\r\nContent-Disposition: form-data; name=a\r\n\r\nabc", "ends inside"),
        ("multipart/form-data; boundary=b", b"--b\r\nContent-Disposition: form-data; name=a", "ends inside"),
        ("multipart/form-data; boundary=b", b"--b\r\nX-Other: 1\r\n\r\nabc\r\n--b--", "Content-Disposition"),
        ("multipart/form-data; boundary=b", b"--b\r\nno colon here\r\n\r\nabc\r\n--b--", "invalid character"),
        (
            "multipart/form-data; boundary=b",
            b"--b junk\r\nContent-Disposition: form-data; name=a\r\n\r\nx\r\n--b--",
            "end of boundary",
        ),
        # a preamble and transport padding (RFC 2046 allows them; no client of this API sends them)
        (
            "multipart/form-data; boundary=b",
            b"preamble\r\n--b\r\nContent-Disposition: form-data; name=a\r\n\r\n",
            "boundary",
        ),
        (
            "multipart/form-data; boundary=b",
            b"--b  \r\nContent-Disposition: form-data; name=a\r\n\r\nx\r\n--b--",
            "boundary",
        ),
        ("multipart/form-data; boundary=b", b"--b\r\n" + b"X: " + b"y" * 20_000 + b"\r\n\r\n", "header"),
        ("multipart/form-data; boundary=b", b"no boundary at all", "boundary character"),
    ],
)
async def test_malformed_bodies_are_400s(content_type: str, body: bytes, says: str) -> None:
    with pytest.raises(BadRequestError) as err:
        await parse(content_type, body, 5)
    assert says.lower() in err.value.message.lower() and err.value.param == "body"


async def test_parts_and_fields_are_bounded() -> None:
    content_type, body = encoded({f"f{i}": (None, "v") for i in range(MAX_PARTS + 1)})
    with pytest.raises(BadRequestError, match="parts"):
        await parse(content_type, body)
    content_type, body = encoded({"purpose": (None, "p" * 100)})
    reader = MultipartReader(content_type, split(body, 10))
    assert await reader.next_part() is not None
    with pytest.raises(BadRequestError) as err:
        await reader.read_field("purpose", 50)
    assert err.value.param == "purpose"
