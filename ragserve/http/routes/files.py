"""The OpenAI Files API (``/v1/files``): upload, list, retrieve, delete, download, so the official
SDKs' ``client.files`` work unchanged against ``<server>/v1``. Files are stored by
``ragserve.service.file_store`` and used later by id (a vector store ingests them).

**Access**: a file belongs to no index; the files of the server are one namespace. So every route
here needs a key that reaches every index (a bare key, or a scoped one whose ``indexes`` include
``"*"``) with the ``write`` role or above: a key scoped to some indexes is refused (403,
``unscoped_key_required``), else it could read or delete what a key for other indexes uploaded; and
reading is ``write`` too, since a file's content is what an index would be built from. Without
``api_keys`` (the loopback) everything is allowed, as everywhere.

**Upload**: ``multipart/form-data`` with the fields ``file`` (a file part; its ``filename`` is the
file's name, cleaned as an upload's is) and ``purpose`` (one of OpenAI's), in either order. The file
streams to disk as it arrives (``ragserve.http.multipart``), bounded by ``max_file_bytes`` (413);
the request body may be that much larger than ``max_request_bytes`` on this route only. A missing
field, an empty file, an unknown purpose or field is a 400 naming it. ``expires_after`` is not
supported (a 400 that says so): files are kept until deleted.
"""

from __future__ import annotations

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from ragserve.api.openai_files import FILE_PURPOSES, MAX_FILE_PAGE, FileDeleted, FileList, FileObject
from ragserve.errors import BadRequestError
from ragserve.http.errors import OPENAI_ERRORS
from ragserve.http.multipart import MultipartReader
from ragserve.http.routes.common import allow_files
from ragserve.service.file_store import FileStore, Staged, check_purpose, clean_filename
from ragserve.service.wiring import Services

#: The path of the upload route: its body limit is its own (``files_body_limit``).
FILES_PATH = "/v1/files"
#: What a multipart form may add to its file: part headers, the purpose, boundaries.
FORM_OVERHEAD_BYTES = 64 * 1024
#: The bytes of a text field (``purpose``).
MAX_FIELD_BYTES = 1024


def files_body_limit(max_request_bytes: int, max_file_bytes: int) -> int:
    """The request body ``POST /v1/files`` may send: a file of ``max_file_bytes`` in its form."""
    return max(max_request_bytes, max_file_bytes + FORM_OVERHEAD_BYTES)


async def _upload(store: FileStore, request: Request) -> FileObject:
    """Read the form part by part; the file is staged as it streams and committed once its name
    and purpose are known good. Whatever fails, nothing is left behind."""
    form = MultipartReader(request.headers.get("content-type", ""), request.stream())
    purpose: str | None = None
    filename: str | None = None
    staged: Staged | None = None
    try:
        while (part := await form.next_part()) is not None:
            if part.name == "file":
                if part.filename is None:
                    raise BadRequestError(
                        "file must be a file part (one with a filename), not a text field", param="file"
                    )
                if staged is not None:
                    raise BadRequestError("send one file per request", param="file")
                filename = part.filename
                clean_filename(filename)  # a bad name or purpose is refused before a byte is stored
                if purpose is not None:
                    check_purpose(purpose)
                staged = await store.stage(form.chunks())
            elif part.name == "purpose":
                if purpose is not None:
                    raise BadRequestError("purpose is sent twice", param="purpose")
                purpose = await form.read_field("purpose", MAX_FIELD_BYTES)
            elif part.name == "expires_after" or part.name.startswith("expires_after["):
                raise BadRequestError(
                    "expires_after is not supported: files are kept until deleted (DELETE /v1/files/{file_id})",
                    param="expires_after",
                    code="unsupported_parameter",
                )
            else:
                raise BadRequestError(
                    f"unknown field {part.name!r}: send 'file' and 'purpose'", param=part.name[:64] or "body"
                )
        if staged is None or filename is None:
            raise BadRequestError("file is required: a multipart file part named 'file'", param="file")
        if purpose is None:
            raise BadRequestError(f"purpose is required: one of {', '.join(FILE_PURPOSES)}", param="purpose")
        record = await store.commit(staged, filename, purpose)
        staged = None
        return record
    finally:
        if staged is not None:
            await store.discard(staged)


def files_router(services: Services) -> APIRouter:
    router = APIRouter(tags=["files"], responses=OPENAI_ERRORS)
    store = services.files

    @router.post(
        FILES_PATH,
        responses={415: {"model": OPENAI_ERRORS[400]["model"], "description": "The body is not multipart/form-data."}},
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {
                    "multipart/form-data": {
                        "schema": {
                            "type": "object",
                            "required": ["file", "purpose"],
                            "properties": {
                                "file": {"type": "string", "format": "binary"},
                                "purpose": {"type": "string", "enum": list(FILE_PURPOSES)},
                            },
                        }
                    }
                },
            }
        },
    )
    async def create_file(request: Request) -> FileObject:
        """Upload a file (multipart: `file`, `purpose`); stored whole, durably, before its id is returned."""
        allow_files(request)
        return await _upload(store, request)

    @router.get(FILES_PATH)
    async def list_files(
        request: Request,
        purpose: str | None = Query(None, description=f"Only files of this purpose: {', '.join(FILE_PURPOSES)}."),
        limit: int = Query(MAX_FILE_PAGE, ge=1, le=MAX_FILE_PAGE, description="Files per page."),
        order: str = Query("desc", pattern="^(asc|desc)$", description="By creation: desc (newest first) or asc."),
        after: str | None = Query(None, max_length=64, description="The last id of the previous page."),
    ) -> FileList:
        """A page of the uploaded files; the next one is `?after=<last_id>` while `has_more`."""
        allow_files(request)
        return await store.list(purpose=purpose, limit=limit, order=order, after=after)

    @router.get(FILES_PATH + "/{file_id}")
    async def retrieve_file(file_id: str, request: Request) -> FileObject:
        allow_files(request)
        return await store.get(file_id)

    @router.delete(FILES_PATH + "/{file_id}")
    async def delete_file(file_id: str, request: Request) -> FileDeleted:
        """Delete the file, first from every vector store that has it (as OpenAI does): no store
        keeps serving text of a file that is gone. Once more after the delete: an attach that
        checked the file before it went may have landed meanwhile (its item, if it read the file
        in time, finds it gone after writing and removes what it wrote)."""
        allow_files(request)
        await store.get(file_id)  # a 404 before anything changes
        await services.vector_stores.file_deleted(file_id)
        deleted = await store.delete(file_id)
        await services.vector_stores.file_deleted(file_id)
        return deleted

    @router.get(
        FILES_PATH + "/{file_id}/content",
        response_class=StreamingResponse,
        responses={200: {"content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}},
    )
    async def file_content(file_id: str, request: Request) -> StreamingResponse:
        """The file's bytes as uploaded, streamed from disk."""
        allow_files(request)
        record, chunks = await store.stream(file_id)
        return StreamingResponse(
            chunks, media_type="application/octet-stream", headers={"Content-Length": str(record.bytes)}
        )

    return router
