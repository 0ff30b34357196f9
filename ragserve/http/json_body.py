"""JSON request bodies, checked before FastAPI parses them (docs/architecture.md §8).

Parsing JSON, validating it and forwarding it upstream all recurse, so a body nesting arrays or
objects thousands deep would end in a ``RecursionError`` somewhere (a 500, or FastAPI's bare
"There was an error parsing the body" in the wrong error shape). :class:`CheckedJSONRoute` reads
the body first and refuses, with a 400 that says what to fix, one that nests deeper than
``MAX_JSON_DEPTH`` (a linear scan, :func:`ragserve.api.values.json_depth`) or is not text JSON can
hold; FastAPI then parses and validates it as before.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Depends, Request, Response
from fastapi.routing import APIRoute

from ragserve.api.values import check_json_depth, number_error_message
from ragserve.errors import BadRequestError, PayloadTooLargeError

#: JSON values (array items and object members, at any depth) one body may hold: validating one
#: costs ~2-10 µs of the event loop, and a free-form field (an extra field, a tool call's
#: arguments) could hold millions within ``max_request_bytes`` (3 M empty objects, 12 MB: 9.5 s).
#: A job of 20,000 documents with their metadata holds a few hundred thousand.
MAX_JSON_VALUES = 1_000_000
#: ... and a chat completion request: 1,000 messages of content parts, tool calls and tools' JSON
#: schemas come to tens of thousands.
MAX_CHAT_JSON_VALUES = 100_000


def check_json_body(body: bytes, max_values: int = MAX_JSON_VALUES) -> None:
    """:class:`BadRequestError` when ``body`` cannot be JSON text or nests too deep, a 413 when it holds
    more than ``max_values`` values."""
    encoding = json.detect_encoding(body)  # what json.loads decodes with (UTF-8 unless a BOM says)
    try:
        text = body.decode(encoding, "surrogatepass")
    except UnicodeDecodeError as e:
        raise BadRequestError(
            f"the body is not valid {encoding.upper()} (byte {e.start}): send JSON as UTF-8 text", code="invalid_json"
        ) from e
    try:  # UTF-8 is scanned as the bytes it came as (no second encoding of the whole body)
        values = check_json_depth(body if encoding == "utf-8" else text, "the body")
    except ValueError as e:
        raise BadRequestError(str(e), code="json_too_deep") from e
    if values > max_values:
        raise PayloadTooLargeError(
            f"the body holds about {values} JSON values (array items and object members); at most {max_values} "
            "are accepted in one request: send less in each",
            code="json_too_many_values",
        )


#: A body larger than this is checked and parsed on a worker thread: 10 MB of JSON is ~0.3 s of
#: scanning and parsing, which the event loop then shares (the thread yields the GIL every few
#: milliseconds) instead of stopping for it.
OFF_LOOP_BYTES = 1 << 20


async def _parse_once(request: Request, body: bytes) -> None:
    """Parse the body here, where a number Python refuses (an integer of thousands of digits: a
    ``ValueError`` that is not a ``JSONDecodeError``, which FastAPI turns into a bare "error parsing
    the body") becomes a 400 saying where it is. Starlette keeps the parsed value on the request
    (``Request.json`` reads it from ``_json``), so FastAPI does not parse it again; malformed JSON is
    left to FastAPI's own report (line, column)."""
    try:
        if len(body) > OFF_LOOP_BYTES:
            request._json = await asyncio.to_thread(json.loads, body)
        else:
            await request.json()
    except json.JSONDecodeError:
        return
    except ValueError as e:
        text = (await request.body()).decode("utf-8", "replace")
        raise BadRequestError(number_error_message(text), code="invalid_json") from e


class CheckedJSONRoute(APIRoute):
    """A route whose JSON body is checked by :func:`check_json_body` before it is parsed, against
    ``max_values``."""

    max_values = MAX_JSON_VALUES

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        if self.body_field is None:
            return handler

        async def checked(request: Request) -> Response:
            body = await request.body()  # kept on the request: the handler reads it from there
            if body:
                if len(body) > OFF_LOOP_BYTES:
                    await asyncio.to_thread(check_json_body, body, self.max_values)
                else:
                    check_json_body(body, self.max_values)
                await _parse_once(request, body)
            return await handler(request)

        return checked


def counted_first(**checks: Callable[[Any], None]) -> Any:
    """A route dependency (``dependencies=[counted_first(messages=...)]``) that hands each check the
    value of its top-level field in the JSON body as it came, before FastAPI validates the body
    (FastAPI runs a route's dependencies first): a list too long to accept is refused before its
    items are validated one by one on the event loop. A body that is not a JSON object, or lacks
    the field, is left to validation."""

    async def check(request: Request) -> None:
        try:
            body = await request.json()  # parsed once already (``_parse_once``): kept on the request
        except ValueError:
            return  # not JSON: FastAPI's own report
        if isinstance(body, dict):
            for field, fn in checks.items():
                if field in body:
                    fn(body[field])

    return Depends(check)


class ChatJSONRoute(CheckedJSONRoute):
    """:class:`CheckedJSONRoute` bounded as a chat completion request is (``MAX_CHAT_JSON_VALUES``)."""

    max_values = MAX_CHAT_JSON_VALUES
