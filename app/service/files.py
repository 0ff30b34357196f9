"""Indexing one uploaded file (``POST /indexes/{name}/files``), converted on the server exactly as
``ragserve ingest`` converts it (``app.ingest.convert``); a new version of a file replaces the old
one, pages that are gone included. Also the settings the playground may show."""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pydantic import ValidationError

from app.api.documents import Document
from app.api.files import UploadResponse
from app.config import Settings
from app.errors import BadRequestError, PayloadTooLargeError, UnsupportedMediaTypeError
from app.ingest.convert import (
    MAX_MTIME,
    ConversionError,
    ConversionTooLarge,
    Converted,
    convert_isolated,
    file_documents,
    is_supported,
)
from app.service.documents import DocumentService
from app.service.limits import RequestLimits

UPLOAD_PREFIX = "uploads"

# Settings the playground shows. An allow-list, so a new secret setting is never shown by default.
PUBLIC_SETTINGS = (
    "llm_engine",
    "llm_model",
    "context_window",
    "default_max_tokens",
    "min_completion_tokens",
    "embedding_model",
    "num_shards",
    "faiss_device",
    "faiss_index_kind",
    "faiss_index_params",
    "similarity_threshold",
    "top_k",
    "chunk_size",
    "chunk_overlap",
    "context_token_ratio",
    "history_min_messages",
    "history_max_messages",
    "budget_safety_ratio",
    "embedding_cache_size",
    "llm_timeout_s",
)


def public_settings(settings: Settings) -> dict[str, Any]:
    """The settings in force that are safe to show: no key, no credential, no server path."""
    out: dict[str, Any] = {k: getattr(settings, k) for k in PUBLIC_SETTINGS}
    out["llm_url"] = _safe_url(settings.llm_url)
    out["embedding_url"] = _safe_url(settings.embedding_url)
    return out


def _upload_path(filename: str, path: str | None) -> str:
    """The metadata path of an uploaded file: ``path`` if given, else ``uploads/<file name>``.
    Relative, POSIX, without ``..``: it becomes a document id and is shown to people."""
    name = (path or "").strip() or f"{UPLOAD_PREFIX}/{PurePosixPath(filename.replace(chr(92), '/')).name}"
    pure = PurePosixPath(name)
    if pure.is_absolute() or ".." in pure.parts or any(ord(c) < 32 for c in name) or not pure.name:
        raise BadRequestError(f"path must be a relative file path without '..': {name!r}", param="path")
    return pure.as_posix()


def check_mtime(mtime: float | None) -> None:
    """An upload's ``mtime``: a finite number of Unix seconds that a date can hold (else a 400)."""
    if mtime is not None and not (math.isfinite(mtime) and 0 <= mtime <= MAX_MTIME):
        raise BadRequestError(
            f"mtime must be a finite number of Unix seconds from 0 to {MAX_MTIME:.0f} (9999-12-31), got {mtime!r}",
            param="mtime",
        )


def _convert(
    data: bytes, filename: str, rel: str, mtime: float | None, limits: RequestLimits
) -> tuple[Converted, list[dict[str, Any]]]:
    converted = convert_isolated(
        data,
        filename,
        max_unpacked_bytes=limits.max_unpacked_bytes,
        timeout_s=limits.max_convert_seconds,
        memory_bytes=limits.max_convert_memory_bytes,
    )
    stamp = mtime if mtime is not None else time.time()
    return converted, file_documents(rel, stamp, converted, limits.max_document_chars)


def _first_error(e: ValidationError) -> str:
    err = e.errors()[0]
    where = ".".join(str(x) for x in err.get("loc", ()))
    return f"{where}: {err.get('msg', 'invalid')}" if where else str(err.get("msg", "invalid"))


def _safe_url(url: str | None) -> str | None:
    """A URL without its user:password part (credentials are sometimes written into one)."""
    if not url:
        return url
    parts = urlsplit(url)
    if parts.username or parts.password:
        parts = parts._replace(netloc=(parts.hostname or "") + (f":{parts.port}" if parts.port else ""))
    return urlunsplit(parts)


async def index_file(
    docs: DocumentService,
    limits: RequestLimits,
    index: str,
    filename: str,
    data: bytes,
    path: str | None,
    mtime: float | None,
) -> UploadResponse:
    """Convert ``data`` by ``filename``'s extension and index it under ``path`` (default
    ``uploads/<filename>``), deleting what an earlier version of the same path left behind."""
    rel = _upload_path(filename, path)
    if not is_supported(filename):
        raise UnsupportedMediaTypeError(
            f"unsupported file type {PurePosixPath(filename).suffix or filename!r}: send markdown, text, code, "
            "HTML, PDF, DOCX or PPTX",
            param="filename",
        )
    check_mtime(mtime)
    if not data:
        raise BadRequestError("the request body is empty: send the file's bytes", param="body")
    try:  # CPU work off the event loop
        converted, new = await asyncio.to_thread(_convert, data, filename, rel, mtime, limits)
    except ConversionTooLarge as e:
        raise PayloadTooLargeError(f"{filename}: {e}", param="body") from e
    except ConversionError as e:
        raise BadRequestError(f"{filename}: {e}", param="body") from e
    if not new:
        raise BadRequestError(f"{filename}: the file has no text to index", param="body")
    limits.documents([d["text"] for d in new])
    old: list[str] = []
    if await docs.index_exists(index):
        offset = 0
        while True:  # every document an earlier upload of this path made (PDF pages)
            page = await docs.list_documents(
                index, limit=100, offset=offset, max_text_length=0, metadata_filter={"path": rel}
            )
            old += [d.doc_id for d in page.documents]
            offset += page.count
            if not page.count or offset >= page.total_items:
                break
    try:
        documents = [Document(**d) for d in new]
    except ValidationError as e:  # what the file holds breaks a document rule (metadata, text)
        raise BadRequestError(f"{filename}: {_first_error(e)}", param="body") from e
    records = await docs.add_documents(index, documents)
    keep = {d["doc_id"] for d in new}
    stale = [i for i in old if i not in keep]
    if stale:
        await docs.delete_documents(index, stale)
    return UploadResponse(
        index_name=index,
        path=rel,
        title=converted.title,
        file_type=converted.file_type,
        doc_ids=[r.doc_id for r in records],
        deleted_doc_ids=stale,
        warnings=converted.warnings,
    )
