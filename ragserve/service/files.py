"""Indexing one uploaded file (``POST /indexes/{name}/files``), converted on the server exactly as
``ragserve ingest`` converts it (``ragserve.ingest.convert``); a new version of a file replaces the old
one, pages that are gone included. Also the settings the playground may show."""

from __future__ import annotations

import asyncio
import math
import time
import unicodedata
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import PurePosixPath
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

from pydantic import ValidationError

from ragserve.api.documents import Document
from ragserve.api.files import UploadResponse
from ragserve.config import Settings
from ragserve.errors import (
    BadRequestError,
    PayloadTooLargeError,
    ServiceError,
    ServiceUnavailableError,
    UnsupportedMediaTypeError,
)
from ragserve.ingest.chunker import DocumentChunker
from ragserve.ingest.convert import (
    MAX_MTIME,
    ConversionError,
    ConversionTimeout,
    ConversionTooLarge,
    Converted,
    ConverterCrashed,
    ConverterUnavailable,
    convert_isolated,
    file_documents,
    is_supported,
)
from ragserve.rag.context_size import ContextSize
from ragserve.service.documents import DocumentService
from ragserve.service.limits import RequestLimits

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
    "chat_context_tokens",
    "chat_context_prefill_s",
    "chunk_size",
    "chunk_overlap",
    "context_token_ratio",
    "history_min_messages",
    "history_max_messages",
    "budget_safety_ratio",
    "embedding_cache_size",
    "llm_timeout_s",
    "job_concurrency",
    "job_batch_documents",
    "max_documents_per_job",
)


def public_settings(
    settings: Settings, chat_context: ContextSize | None = None, *, addresses: bool = True
) -> dict[str, Any]:
    """The settings in force that are safe to show: no key, no credential, no server path; the
    upstream addresses (``llm_url``, ``embedding_url``, credentials removed) only with ``addresses``
    (an operator's view: they name hosts inside the deployment). With
    ``chat_context`` (``ChatService.context_size()``), also what a chat request without ``top_k``
    gets, after ``chat_context_prefill_s``: ``chat_context_in_force`` (its sources' tokens, about how
    many sources that is, and why) and ``chat_top_k_in_force`` (the candidates it retrieves); ``top_k``
    is only the default of ``/retrieve`` and ``/query``."""
    out: dict[str, Any] = {}
    for k in PUBLIC_SETTINGS:
        out[k] = getattr(settings, k)
        if k == "chat_context_prefill_s" and chat_context is not None:
            out["chat_context_in_force"] = chat_context.describe(settings.chunk_size)
            out["chat_top_k_in_force"] = chat_context.top_k
    if addresses:
        out["llm_url"] = _safe_url(settings.llm_url)
        out["embedding_url"] = _safe_url(settings.embedding_url)
    return out


#: Unicode categories a name may not hold: control characters (C0, DEL, C1), format characters
#: (bidi overrides such as U+202E, zero-width ones), lone surrogates, line and paragraph separators.
_REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def clean_name(value: str, param: str) -> PurePosixPath:
    """``value`` as a relative POSIX path (backslashes are separators, NFC), or a 400 naming
    ``param`` and the rule it breaks: no control or format characters, not absolute, no ``..``,
    ending in a file name."""
    for i, c in enumerate(value):
        if unicodedata.category(c) in _REFUSED_CATEGORIES:
            raise BadRequestError(
                f"{param} must not contain control or format characters: U+{ord(c):04X} at position {i}",
                param=param,
            )
    name = unicodedata.normalize("NFC", value.strip().replace("\\", "/"))
    pure = PurePosixPath(name)
    if pure.is_absolute():
        raise BadRequestError(f"{param} must be a relative path, not start with '/': {name!r}", param=param)
    if ".." in pure.parts:
        raise BadRequestError(f"{param} must not contain '..' (a parent directory): {name!r}", param=param)
    if not pure.name or name.endswith("/"):
        raise BadRequestError(f"{param} must end with a file name: {name!r}", param=param)
    return pure


def _upload_path(filename: str, path: str | None) -> str:
    """The metadata path of an uploaded file: ``path`` if given, else ``uploads/<file name>``.
    Both are checked and normalised alike (:func:`clean_name`): the path becomes a document id and
    is shown to people."""
    name = clean_name(filename, "filename").name
    if path is not None and path.strip():
        return clean_name(path, "path").as_posix()
    return f"{UPLOAD_PREFIX}/{name}"


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
        max_sections=limits.max_documents_per_request,  # a PDF's pages of text past it: refused as it reads
    )
    stamp = mtime if mtime is not None else time.time()
    return converted, file_documents(rel, stamp, converted, limits.max_document_chars)


#: How long an upload waits for a conversion slot (max_concurrent_conversions) before it is a 503.
CONVERT_QUEUE_WAIT_S = 5.0
_T = TypeVar("_T")


class _Conversions:
    """At most ``bound`` conversions at once, each waited for on a thread of this pool's own (not
    the default executor's, which chunking, query parsing and token counting share): a conversion
    holds its thread while its process runs, up to max_convert_seconds. The slot is freed when the
    conversion ends, even when the request that asked for it is gone."""

    def __init__(self, bound: int) -> None:
        self.bound = bound
        self.executor = ThreadPoolExecutor(bound, thread_name_prefix="ragserve-convert")
        self._gates: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary()
        )

    async def run(self, fn: Callable[[], _T], wait_s: float) -> _T:
        loop = asyncio.get_running_loop()
        gate = self._gates.setdefault(loop, asyncio.Semaphore(self.bound))
        try:
            # wait_for, not ragserve.aio.within: a cancel that lands as the slot is taken is lost here
            # (the conversion runs and frees it), where within would raise with the slot held.
            await asyncio.wait_for(gate.acquire(), wait_s)
        except asyncio.TimeoutError:
            raise ServiceUnavailableError(
                f"the server is busy converting other uploads ({self.bound} at once, max_concurrent_conversions): "
                "send the file again in a few seconds",
                retry_after=max(1, math.ceil(wait_s)),
                code="busy_converting",
            ) from None
        future = loop.run_in_executor(self.executor, fn)
        future.add_done_callback(lambda _: gate.release())
        return await asyncio.shield(future)  # the thread cannot be stopped: its slot is held until it ends


_conversions: dict[int, _Conversions] = {}


def conversions(bound: int) -> _Conversions:
    """The conversion slots of this process for ``bound`` (one pool, made on first use)."""
    if bound not in _conversions:
        _conversions[bound] = _Conversions(bound)
    return _conversions[bound]


def _conversion_error(filename: str, e: ConversionError) -> ServiceError:
    """The 4xx a file that could not be converted gets."""
    if isinstance(e, ConversionTooLarge):
        return PayloadTooLargeError(f"{filename}: {e}", param="body")
    unprocessable = _UNPROCESSABLE.get(type(e))
    if unprocessable is not None:
        return ServiceError(
            f"{filename}: {e}", status=422, param="body", code=unprocessable, type_="invalid_request_error"
        )
    return BadRequestError(f"{filename}: {e}", param="body")


#: Files that are well formed but could not be converted here: a 422 with these codes.
_UNPROCESSABLE: dict[type[ConversionError], str] = {
    ConversionTimeout: "conversion_timeout",
    ConverterCrashed: "converter_crashed",
}


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


async def convert_file(
    limits: RequestLimits, filename: str, data: bytes, rel: str, mtime: float | None
) -> tuple[Converted, list[dict[str, Any]]]:
    """Convert ``data`` by ``filename``'s extension into the documents of metadata path ``rel``
    (``ragserve.ingest.convert.file_documents``), in a process of its own, within the request
    limits; every way it can fail is a 4xx (415 unsupported, 413 too large, 422 unconvertible) or a
    503 to retry."""
    if not is_supported(filename):
        raise UnsupportedMediaTypeError(
            f"unsupported file type {PurePosixPath(filename).suffix or filename!r}: send markdown, text, code, "
            "HTML, PDF, DOCX or PPTX",
            param="filename",
        )
    check_mtime(mtime)
    if not data:
        raise BadRequestError("the request body is empty: send the file's bytes", param="body")
    try:  # in a process of its own, waited for off the event loop and off the default executor
        converted, new = await conversions(limits.max_concurrent_conversions).run(
            lambda: _convert(data, filename, rel, mtime, limits), CONVERT_QUEUE_WAIT_S
        )
    except ConversionError as e:
        raise _conversion_error(filename, e) from e
    except ConverterUnavailable as e:
        raise ServiceUnavailableError(f"{filename}: {e}; send the file again", retry_after=5, param="body") from e
    if not new:
        raise BadRequestError(f"{filename}: the file has no text to index", param="body")
    limits.documents([d["text"] for d in new])
    chars = sum(len(d["text"]) for d in new)
    if chars > limits.max_file_text_chars:
        raise PayloadTooLargeError(
            f"{filename}: the file converts to {chars} characters of text; at most {limits.max_file_text_chars} "
            "are indexed from one file, split it into several files",
            param="file",
            code="file_too_large",
        )
    return converted, new


async def replace_path(
    docs: DocumentService,
    index: str,
    rel: str,
    new: list[dict[str, Any]],
    filename: str,
    chunker: DocumentChunker | None = None,
) -> tuple[list[str], list[str]]:
    """Index ``new`` (the documents of metadata path ``rel``) and delete what an earlier version of
    the same path left that ``new`` does not replace (pages that are gone). Document ids follow the
    path, so indexing the same file again replaces it: never two copies. Returns the doc ids
    written and those deleted."""
    # every document an earlier upload of this path made (PDF pages)
    old = [d.doc_id for d in await docs.matching_documents(index, {"path": rel})]
    try:
        documents = [Document(**d) for d in new]
    except ValidationError as e:  # what the file holds breaks a document rule (metadata, text)
        raise BadRequestError(f"{filename}: {_first_error(e)}", param="body") from e
    records = await docs.add_documents(index, documents, chunker=chunker)
    keep = {d["doc_id"] for d in new}
    stale = [i for i in old if i not in keep]
    if stale:
        await docs.delete_documents(index, stale)
    return [r.doc_id for r in records], stale


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
    converted, new = await convert_file(limits, filename, data, rel, mtime)
    doc_ids, stale = await replace_path(docs, index, rel, new, filename)
    return UploadResponse(
        index_name=index,
        path=rel,
        title=converted.title,
        file_type=converted.file_type,
        doc_ids=doc_ids,
        deleted_doc_ids=stale,
        warnings=converted.warnings,
    )
