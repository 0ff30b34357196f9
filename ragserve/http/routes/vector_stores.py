"""OpenAI's Vector Stores API (``/v1/vector_stores``): stores, their files, file batches and
search (``ragserve.service.vector_stores``). Errors are the OpenAI error object.

Access follows the index a store is: reading (get, list, search, files) needs the read role on
the store's id, changing it (update, attach, batches) the write role, deleting it the admin role,
as dropping an index does. A key scoped to ``vs_*`` may create stores; a key scoped to named
indexes may not (it could not reach the new store). Attaching Files (at creation, alone or in a
batch) also needs what ``/v1/files`` needs, a write key for every index: Files belong to no index,
and a scoped key that attached one by id could read it back through its own store."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Query, Request, Response

from ragserve.api.vector_stores import (
    CreateFileBatchRequest,
    CreateVectorStoreFileRequest,
    CreateVectorStoreRequest,
    FileContentPage,
    SearchRequest,
    SearchResultsPage,
    UpdateVectorStoreFileRequest,
    UpdateVectorStoreRequest,
    VectorStore,
    VectorStoreDeleted,
    VectorStoreFile,
    VectorStoreFileBatch,
    VectorStoreFileDeleted,
    VectorStoreFileList,
    VectorStoreList,
)
from ragserve.http.errors import OPENAI_ERRORS
from ragserve.http.json_body import CheckedJSONRoute
from ragserve.http.routes.common import allow, allow_files
from ragserve.service.access import Role
from ragserve.service.vector_stores import POLL_AFTER_MS, VectorStoreService, new_store_id

Order = Literal["asc", "desc"]
FileStatus = Literal["in_progress", "completed", "failed", "cancelled"]


def vector_stores_router(stores: VectorStoreService) -> APIRouter:
    router = APIRouter(prefix="/v1", tags=["vector stores"], responses=OPENAI_ERRORS, route_class=CheckedJSONRoute)

    def poll_after(response: Response, status: str) -> None:
        if status == "in_progress":  # the SDK's *_and_poll helpers wait this long, not a second
            response.headers["openai-poll-after-ms"] = str(POLL_AFTER_MS)

    @router.post("/vector_stores")
    async def create_vector_store(body: CreateVectorStoreRequest, request: Request) -> VectorStore:
        """Create a vector store (an index named by its id), attaching ``file_ids`` if given."""
        store_id = new_store_id()
        principal = allow(request, Role.WRITE, store_id)
        if body.file_ids:
            allow_files(request)
        return await stores.create(body, store_id, owner=principal.owner)

    @router.get("/vector_stores")
    async def list_vector_stores(
        request: Request,
        limit: int = Query(20, ge=1, le=100),
        order: Order = "desc",
        after: str | None = Query(None, min_length=1, max_length=256),
        before: str | None = Query(None, min_length=1, max_length=256),
    ) -> VectorStoreList:
        """The vector stores this key may read, newest first by default."""
        principal = allow(request, Role.READ)
        return await stores.list_stores(limit, order, after, before, principal.sees)

    @router.get("/vector_stores/{vector_store_id}")
    async def get_vector_store(vector_store_id: str, request: Request) -> VectorStore:
        allow(request, Role.READ, vector_store_id)
        return await stores.get(vector_store_id)

    @router.post("/vector_stores/{vector_store_id}")
    async def update_vector_store(
        vector_store_id: str, body: UpdateVectorStoreRequest, request: Request
    ) -> VectorStore:
        allow(request, Role.WRITE, vector_store_id)
        return await stores.update(vector_store_id, body)

    @router.delete("/vector_stores/{vector_store_id}")
    async def delete_vector_store(vector_store_id: str, request: Request) -> VectorStoreDeleted:
        """Delete the store and its index; its Files stay (``DELETE /v1/files/{id}``)."""
        allow(request, Role.ADMIN, vector_store_id)
        return await stores.delete(vector_store_id)

    @router.post("/vector_stores/{vector_store_id}/search")
    async def search_vector_store(vector_store_id: str, body: SearchRequest, request: Request) -> SearchResultsPage:
        """The chunks that best match the query (or queries), with their file, score and attributes."""
        allow(request, Role.READ, vector_store_id)
        return await stores.search(vector_store_id, body)

    @router.post("/vector_stores/{vector_store_id}/files")
    async def attach_file(
        vector_store_id: str, body: CreateVectorStoreFileRequest, request: Request, response: Response
    ) -> VectorStoreFile:
        """Attach a File: it is indexed by an ingestion job; poll the file until it is not ``in_progress``."""
        principal = allow(request, Role.WRITE, vector_store_id)
        allow_files(request)
        out = await stores.attach(
            vector_store_id, body.file_id, body.attributes, body.chunking_strategy, owner=principal.owner
        )
        poll_after(response, out.status)
        return out

    @router.get("/vector_stores/{vector_store_id}/files")
    async def list_files(
        vector_store_id: str,
        request: Request,
        limit: int = Query(20, ge=1, le=100),
        order: Order = "desc",
        after: str | None = Query(None, min_length=1, max_length=256),
        before: str | None = Query(None, min_length=1, max_length=256),
        filter: FileStatus | None = None,  # OpenAI's parameter name
    ) -> VectorStoreFileList:
        allow(request, Role.READ, vector_store_id)
        return await stores.list_files(vector_store_id, limit, order, after, before, filter)

    @router.get("/vector_stores/{vector_store_id}/files/{file_id}")
    async def get_file(vector_store_id: str, file_id: str, request: Request, response: Response) -> VectorStoreFile:
        allow(request, Role.READ, vector_store_id)
        out = await stores.get_file(vector_store_id, file_id)
        poll_after(response, out.status)
        return out

    @router.get("/vector_stores/{vector_store_id}/files/{file_id}/content")
    async def file_content(vector_store_id: str, file_id: str, request: Request) -> FileContentPage:
        """The text the file was indexed as (a part per page or part of a long file)."""
        allow(request, Role.READ, vector_store_id)
        return await stores.file_content(vector_store_id, file_id)

    @router.post("/vector_stores/{vector_store_id}/files/{file_id}")
    async def update_file(
        vector_store_id: str, file_id: str, body: UpdateVectorStoreFileRequest, request: Request, response: Response
    ) -> VectorStoreFile:
        """New attributes for an attached file: it is indexed again so its chunks carry them."""
        principal = allow(request, Role.WRITE, vector_store_id)
        out = await stores.update_file(vector_store_id, file_id, body.attributes, owner=principal.owner)
        poll_after(response, out.status)
        return out

    @router.delete("/vector_stores/{vector_store_id}/files/{file_id}")
    async def detach_file(vector_store_id: str, file_id: str, request: Request) -> VectorStoreFileDeleted:
        """Remove the file's chunks from the store; the File itself stays."""
        allow(request, Role.WRITE, vector_store_id)
        return await stores.detach(vector_store_id, file_id)

    @router.post("/vector_stores/{vector_store_id}/file_batches")
    async def create_batch(
        vector_store_id: str, body: CreateFileBatchRequest, request: Request, response: Response
    ) -> VectorStoreFileBatch:
        """Attach many Files at once: one ingestion job; poll the batch until it is not ``in_progress``."""
        principal = allow(request, Role.WRITE, vector_store_id)
        allow_files(request)
        out = await stores.create_batch(vector_store_id, body, owner=principal.owner)
        poll_after(response, out.status)
        return out

    @router.get("/vector_stores/{vector_store_id}/file_batches/{batch_id}")
    async def get_batch(
        vector_store_id: str, batch_id: str, request: Request, response: Response
    ) -> VectorStoreFileBatch:
        allow(request, Role.READ, vector_store_id)
        out = await stores.get_batch(vector_store_id, batch_id)
        poll_after(response, out.status)
        return out

    @router.post("/vector_stores/{vector_store_id}/file_batches/{batch_id}/cancel")
    async def cancel_batch(vector_store_id: str, batch_id: str, request: Request) -> VectorStoreFileBatch:
        """Files not yet started are cancelled; one being indexed finishes."""
        allow(request, Role.WRITE, vector_store_id)
        return await stores.cancel_batch(vector_store_id, batch_id)

    @router.get("/vector_stores/{vector_store_id}/file_batches/{batch_id}/files")
    async def list_batch_files(
        vector_store_id: str,
        batch_id: str,
        request: Request,
        limit: int = Query(20, ge=1, le=100),
        order: Order = "desc",
        after: str | None = Query(None, min_length=1, max_length=256),
        before: str | None = Query(None, min_length=1, max_length=256),
        filter: FileStatus | None = None,
    ) -> VectorStoreFileList:
        allow(request, Role.READ, vector_store_id)
        await stores.get_batch(vector_store_id, batch_id)
        return await stores.list_files(vector_store_id, limit, order, after, before, filter, batch_id)

    return router
