"""Response headers built from what a client sent are bounded: a proxy in front of the server keeps
response headers in a fixed buffer (nginx 4-8 KB, HAProxy 16 KB) and answers 502 to one that does
not fit, and some servers refuse to send them at all. Today that is ``X-RAG-Query`` (the retrieval
query, URL-encoded); ``X-RAG-Mode``, ``X-RAG-Reason`` and ``Server-Timing`` are built from the
server's own names only."""

from __future__ import annotations

from urllib.parse import quote

#: The most bytes of URL-encoded query ``X-RAG-Query`` carries (a CJK character takes 9).
MAX_QUERY_HEADER_BYTES = 1024


def query_headers(query: str, limit: int = MAX_QUERY_HEADER_BYTES) -> dict[str, str]:
    """``X-RAG-Query``: ``query`` URL-encoded (UTF-8, every reserved character escaped, so no CR or
    LF can reach the header), cut at a character boundary to at most ``limit`` bytes; when cut,
    ``X-RAG-Query-Truncated: true`` says so (the whole query is in the body's ``rag`` field)."""
    encoded = quote(query[: limit + 1], safe="")  # a character takes at least one byte
    if len(encoded) <= limit and len(query) <= limit:
        return {"X-RAG-Query": encoded}
    kept, size = [], 0
    for char in query[:limit]:
        piece = quote(char, safe="")
        if size + len(piece) > limit:
            break
        kept.append(piece)
        size += len(piece)
    return {"X-RAG-Query": "".join(kept), "X-RAG-Query-Truncated": "true"}
