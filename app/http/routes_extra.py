"""Routes for people rather than programs: index statistics, the settings in force, file upload,
and the web playground at ``/ui`` (static files shipped in the package, no build step, no CDN).

``create_app`` adds them with :func:`add_extra_routes`. The playground's page and assets are open
(``app.http.security.OPEN_PATHS``/``OPEN_PREFIXES``) so a browser can load the page that asks for
the API key; every call the page makes (including ``/ui/config``) sends the key.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from fastapi import FastAPI, Query, Request
from fastapi.responses import FileResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, Field

from app.api.documents import Document, validate_index_name
from app.api.stats import IndexStats
from app.ingest.convert import ConversionError, convert, file_documents, is_supported
from app.service.errors import BadRequestError, ServiceError

if TYPE_CHECKING:
    from app.http.app import Services

UI_DIR = Path(__file__).parent / "static" / "ui"
UPLOAD_PREFIX = "uploads"

# Settings the playground shows. An allow-list, so a new secret setting is never shown by default.
PUBLIC_SETTINGS = (
    "llm_engine", "llm_model", "context_window", "default_max_tokens", "min_completion_tokens", "embedding_model",
    "num_shards", "faiss_device", "faiss_index_kind", "faiss_index_params", "similarity_threshold", "top_k",
    "chunk_size", "chunk_overlap", "context_token_ratio", "history_min_messages", "history_max_messages",
    "budget_safety_ratio", "embedding_cache_size", "llm_timeout_s",
)


class UnsupportedMediaTypeError(ServiceError):
    status = 415


class UploadResponse(BaseModel):
    """What ``POST /indexes/{name}/files`` made of a file."""

    index_name: str
    path: str = Field(description="The metadata path; every document id starts with it.")
    title: str
    file_type: str
    doc_ids: list[str]
    deleted_doc_ids: list[str] = Field(description="Documents of an earlier version of the file that are gone.")
    warnings: list[str]


def _index(name: str) -> str:
    try:
        return validate_index_name(name)
    except ValueError as e:
        raise BadRequestError(str(e), param="index_name") from e


def _safe_url(url: str | None) -> str | None:
    """A URL without its user:password part (credentials are sometimes written into one)."""
    if not url:
        return url
    parts = urlsplit(url)
    if parts.username or parts.password:
        parts = parts._replace(netloc=parts.hostname + (f":{parts.port}" if parts.port else ""))
    return urlunsplit(parts)


def _upload_path(filename: str, path: str | None) -> str:
    """The metadata path of an uploaded file: ``path`` if given, else ``uploads/<file name>``.
    Relative, POSIX, without ``..``: it becomes a document id and is shown to people."""
    name = (path or "").strip() or f"{UPLOAD_PREFIX}/{PurePosixPath(filename.replace(chr(92), '/')).name}"
    pure = PurePosixPath(name)
    if pure.is_absolute() or ".." in pure.parts or any(ord(c) < 32 for c in name) or not pure.name:
        raise BadRequestError(f"path must be a relative file path without '..': {name!r}", param="path")
    return pure.as_posix()


def public_settings(services: Services) -> dict[str, Any]:
    """The settings in force that are safe to show: no key, no credential, no server path."""
    settings = getattr(services.chat, "settings", None)
    out: dict[str, Any] = {k: getattr(settings, k) for k in PUBLIC_SETTINGS if hasattr(settings, k)}
    if settings is not None:
        out["llm_url"] = _safe_url(getattr(settings, "llm_url", None))
        out["embedding_url"] = _safe_url(getattr(settings, "embedding_url", None))
    return out


def add_extra_routes(app: FastAPI, services: Services) -> None:
    """Add the stats, config, upload and playground routes to ``app`` (called by ``create_app``)."""
    # Registered on the app itself: FastAPI 0.165 keeps an included APIRouter as one opaque entry
    # of app.routes, which tools that walk the routes (the security test) cannot see into.
    router = app.router
    docs = services.documents
    limits = services.limits

    @router.get("/indexes/{index_name}/stats", tags=["documents"])
    async def index_stats(index_name: str) -> IndexStats:
        """Documents, chunks, bytes, index kind and per-shard counts of an index."""
        return await docs.stats(_index(index_name))

    @router.get("/ui/config", tags=["playground"])
    async def ui_config() -> dict[str, Any]:
        """The settings in force (never keys), the request limits, the served models."""
        gen = services.chat.generator
        return {
            "model": gen.model_id,
            "context_window": await gen.context_window(),
            "embedding_model": services.embedding_model,
            "auth_required": bool(services.api_keys),
            "limits": {k: getattr(limits, k) for k in limits.__dataclass_fields__},
            "settings": public_settings(services),
        }

    @router.post("/indexes/{index_name}/files", tags=["documents"])
    async def upload_file(
        index_name: str,
        request: Request,
        filename: str = Query(min_length=1, max_length=512, description="The file's name; its extension picks "
                              "the converter (markdown, text, code, HTML, PDF, DOCX, PPTX)."),
        path: str | None = Query(None, max_length=1024, description="Metadata path (and id prefix); default "
                                 "uploads/<filename>."),
        mtime: float | None = Query(None, ge=0, description="The file's modification time (Unix seconds)."),
    ) -> UploadResponse:
        """Index one file sent as the raw request body, converted on the server exactly as
        ``ragserve ingest`` converts it; sending a new version replaces the old one."""
        name = _index(index_name)
        rel = _upload_path(filename, path)
        if not is_supported(filename):
            raise UnsupportedMediaTypeError(
                f"unsupported file type {PurePosixPath(filename).suffix or filename!r}: send markdown, text, code, "
                "HTML, PDF, DOCX or PPTX", param="filename")
        data = await request.body()
        if not data:
            raise BadRequestError("the request body is empty: send the file's bytes", param="body")
        try:
            converted = await asyncio.to_thread(convert, data, filename)
        except ConversionError as e:
            raise BadRequestError(f"{filename}: {e}", param="body") from e
        new = file_documents(rel, mtime if mtime is not None else time.time(), converted, limits.max_document_chars)
        if not new:
            raise BadRequestError(f"{filename}: the file has no text to index", param="body")
        limits.documents([d["text"] for d in new])
        old: list[str] = []
        if await docs.index_exists(name):
            offset = 0
            while True:  # every document an earlier upload of this path made (PDF pages)
                page = await docs.list_documents(name, limit=100, offset=offset, max_text_length=0,
                                                 metadata_filter={"path": rel})
                old += [d.doc_id for d in page.documents]
                offset += page.count
                if not page.count or offset >= page.total_items:
                    break
        records = await docs.add_documents(name, [Document(**d) for d in new])
        services.telemetry.indexed(len(records))
        keep = {d["doc_id"] for d in new}
        stale = [i for i in old if i not in keep]
        if stale:
            await docs.delete_documents(name, stale)
        return UploadResponse(index_name=name, path=rel, title=converted.title, file_type=converted.file_type,
                              doc_ids=[r.doc_id for r in records], deleted_doc_ids=stale,
                              warnings=converted.warnings)

    @router.get("/ui", include_in_schema=False)
    async def ui_redirect() -> RedirectResponse:
        return RedirectResponse("ui/", status_code=308)  # relative: works under a Serve route prefix

    @router.get("/ui/", include_in_schema=False)
    async def ui_page() -> FileResponse:
        return FileResponse(UI_DIR / "index.html", headers={"Cache-Control": "no-cache"})

    app.mount("/ui/static", StaticFiles(directory=UI_DIR), name="ui-static")
