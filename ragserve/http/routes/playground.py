"""Routes for people rather than programs: file upload, the settings in force, and the web
playground at ``/ui`` (static files shipped in the package, no build step, nothing fetched from
outside). The page, its assets and ``/favicon.ico`` are open (``ragserve.http.security.OPEN_PATHS``/
``OPEN_PREFIXES``) so a browser can load the page that asks for the API key; every call the page
makes sends the key."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.responses import FileResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.types import Scope

from ragserve.api.documents import DOCUMENT_FEATURES
from ragserve.api.files import UiConfig, UploadResponse
from ragserve.errors import UnsupportedMediaTypeError
from ragserve.http.errors import DOCUMENT_ERRORS
from ragserve.http.routes.common import allow, checked_index
from ragserve.ingest.convert import MAX_MTIME
from ragserve.service.access import Role
from ragserve.service.files import index_file, public_settings
from ragserve.service.wiring import Services

UI_DIR = Path(__file__).resolve().parents[1] / "static" / "ui"

# Sent with the page and every asset. The page runs only its own files (no inline script or style,
# nothing from elsewhere), talks only to this origin, and cannot be framed (clickjacking a page that
# holds an API key) or have a file sniffed as another type.
UI_SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


# The playground's file types, whatever the host's mimetypes database says: with ``nosniff`` a
# browser refuses a script or an icon sent with another type.
UI_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".ico": "image/vnd.microsoft.icon",
}


class _UiAssets(StaticFiles):
    """The playground's static files, with their types and :data:`UI_SECURITY_HEADERS`."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers.update(UI_SECURITY_HEADERS)
        kind = UI_TYPES.get(Path(path).suffix.lower())
        if kind and response.status_code == 200:
            response.headers["content-type"] = kind
        return response


def playground_router(services: Services) -> APIRouter:
    router = APIRouter(responses=DOCUMENT_ERRORS)
    docs, limits = services.documents, services.limits

    @router.get("/ui/config", tags=["playground"])
    async def ui_config(request: Request) -> UiConfig:
        """The settings in force (never keys), the request limits, the served models; also the context
        a chat without ``top_k`` gets (``chat_context_in_force``, ``chat_top_k_in_force``). The
        upstream addresses only to a key that administers every index (or with no keys configured)."""
        principal = allow(request, Role.READ)
        operator = principal.sees_all and principal.role >= Role.ADMIN
        llm = services.chat.llm
        return UiConfig(
            model=llm.model_id,
            context_window=await llm.context_window(),
            embedding_model=services.embeddings.model,
            auth_required=bool(services.credentials()),
            limits={f.name: getattr(limits, f.name) for f in fields(limits)},
            settings=public_settings(services.settings, await services.chat.context_size(), addresses=operator),
            features=list(DOCUMENT_FEATURES),
        )

    @router.post(
        "/indexes/{index_name}/files",
        tags=["documents"],
        responses={
            415: {"model": DOCUMENT_ERRORS[400]["model"], "description": "Unsupported file type."},
            503: {
                "model": DOCUMENT_ERRORS[400]["model"],
                "description": "Busy converting other uploads (max_concurrent_conversions): retry after Retry-After.",
            },
        },
    )
    async def upload_file(
        index_name: str,
        request: Request,
        filename: str = Query(
            min_length=1,
            max_length=512,
            description="The file's name; its extension picks "
            "the converter (markdown, text, code, HTML, PDF, DOCX, PPTX).",
        ),
        path: str | None = Query(
            None, max_length=1024, description="Metadata path (and id prefix); default uploads/<filename>."
        ),
        mtime: float | None = Query(
            None,
            ge=0,
            le=MAX_MTIME,
            allow_inf_nan=False,
            description="The file's modification time (Unix seconds, up to 9999-12-31).",
        ),
    ) -> UploadResponse:
        """Index one file sent as the raw request body; a new version of a file replaces the old one."""
        name = checked_index(index_name)
        allow(request, Role.WRITE, name)
        if request.headers.get("content-type", "").lstrip().lower().startswith("multipart/"):
            raise UnsupportedMediaTypeError(
                "send the file's bytes as the request body, not a multipart form: "
                "curl --data-binary @doc.pdf -H 'Content-Type: application/octet-stream' "
                "'.../indexes/NAME/files?filename=doc.pdf'",
                param="body",
            )
        result = await index_file(docs, limits, name, filename, await request.body(), path, mtime)
        services.telemetry.indexed(len(result.doc_ids))
        return result

    @router.get("/ui", include_in_schema=False)
    async def ui_redirect() -> RedirectResponse:
        # relative: works under a Serve route prefix
        return RedirectResponse("ui/", status_code=308, headers=UI_SECURITY_HEADERS)

    @router.get("/ui/", include_in_schema=False)
    async def ui_page() -> FileResponse:
        return FileResponse(UI_DIR / "index.html", headers={"Cache-Control": "no-cache", **UI_SECURITY_HEADERS})

    @router.get("/favicon.ico", include_in_schema=False)
    async def favicon() -> FileResponse:
        # the page links static/favicon.svg; this is for what asks the root (a browser on /docs, on JSON)
        return FileResponse(
            UI_DIR / "favicon.ico",
            media_type=UI_TYPES[".ico"],
            headers={"Cache-Control": "public, max-age=86400", **UI_SECURITY_HEADERS},
        )

    return router


def mount_playground_assets(app: FastAPI) -> None:
    app.mount("/ui/static", _UiAssets(directory=UI_DIR), name="ui-static")
