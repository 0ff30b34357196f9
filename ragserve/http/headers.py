"""Response headers built from what a client sent are bounded and readable: a proxy in front of the
server keeps response headers in a fixed buffer (nginx 4-8 KB, HAProxy 16 KB) and answers 502 to one
that does not fit, and some servers refuse to send them at all. Today that is ``X-RAG-Query`` (the
retrieval query); ``X-RAG-Mode``, ``X-RAG-Reason`` and ``Server-Timing`` are built from the
server's own names only.

``X-RAG-Query`` is the query in its JSON-safe form: what ``json.dumps(query, ensure_ascii=True)``
writes between its quotes. ASCII text reads as it is ("How do I set it up? (Flask)"); a quote and a
backslash are ``\\"`` and ``\\\\``, a control character ``\\n``, ``\\r``, ``\\t`` or ``\\u0000``, any
other non-ASCII character ``\\uXXXX`` (a surrogate pair above U+FFFF, as JSON writes it), and a space
that starts or ends the query ``\\u0020`` (HTTP drops a value's surrounding spaces). So the value is
printable ASCII only: no CR or LF can reach the header, and a client gets the query back with a JSON
parser, ``json.loads('"' + value + '"')``, the same text as the body's ``rag.query``."""

from __future__ import annotations

import json

#: The most bytes of ``X-RAG-Query``: a follow-up's query is the question and a few terms, well
#: under it; a longer query is cut (the body's ``rag.query`` has it whole).
MAX_QUERY_HEADER_BYTES = 256
_SPACE = "\\u0020"


def _escaped(text: str) -> str:
    """``text`` as JSON writes it between quotes, ASCII only."""
    return json.dumps(text, ensure_ascii=True)[1:-1]


def header_text(text: str) -> str:
    """``text`` in its JSON-safe form (this module's docstring): printable ASCII, surrounding
    spaces escaped, so a header carries it exactly."""
    value = _escaped(text)
    if value.startswith(" "):
        value = _SPACE + value[1:]
    if value.endswith(" "):
        value = value[:-1] + _SPACE
    return value


def query_headers(query: str, limit: int = MAX_QUERY_HEADER_BYTES) -> dict[str, str]:
    """``X-RAG-Query``: ``query`` in its JSON-safe form (``header_text``), at most ``limit`` bytes;
    a longer one is cut between characters (never inside an escape, nor between the two halves of
    a surrogate pair) and ``X-RAG-Query-Truncated: true`` says so. Reads at most ``limit + 1``
    characters of ``query``: every character takes at least one byte."""
    head = query[: limit + 1]
    if len(query) <= limit:
        value = header_text(head)
        if len(value) <= limit:
            return {"X-RAG-Query": value}
    kept: list[str] = []
    size = 0
    for i, char in enumerate(head):
        piece = _SPACE if char == " " and i == 0 else _escaped(char)
        if size + len(piece) > limit:
            break
        kept.append(piece)
        size += len(piece)
    while kept and kept[-1] == " ":  # a value's trailing spaces do not survive HTTP: cut before them
        kept.pop()
    return {"X-RAG-Query": "".join(kept), "X-RAG-Query-Truncated": "true"}
