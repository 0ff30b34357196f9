"""The document API, shaped after KAITO RAGEngine's (docs/architecture.md §8):
index, list, update, delete, drop, persist, load, query, retrieve. Errors are ``{"detail": ...}``."""

from __future__ import annotations

from fastapi import APIRouter, Query, Request, Response

from ragserve.api.documents import (
    MAX_LIST_PAGE,
    DeleteDocumentsRequest,
    DeleteDocumentsResponse,
    DocumentRecord,
    IndexRequest,
    ListDocumentsResponse,
    MessageResponse,
    QueryRequest,
    QueryResponse,
    RetrieveRequest,
    RetrieveResponse,
    UpdateDocumentsRequest,
    UpdateDocumentsResponse,
    validate_metadata_filter,
)
from ragserve.api.stats import IndexStats
from ragserve.api.values import parse_json
from ragserve.errors import BadRequestError
from ragserve.http.errors import DOCUMENT_ERRORS
from ragserve.http.json_body import CheckedJSONRoute, counted_first
from ragserve.http.routes.common import allow, checked_index, metered_documents, metered_query, scoped_knowledge
from ragserve.http.server_timing import server_timing
from ragserve.http.usage import usage_of
from ragserve.service.access import Role
from ragserve.service.knowledge import ScopedKnowledge
from ragserve.service.wiring import Services


def documents_router(services: Services) -> APIRouter:
    router = APIRouter(tags=["documents"], responses=DOCUMENT_ERRORS, route_class=CheckedJSONRoute)
    docs, chat, limits, tel = services.documents, services.chat, services.limits, services.telemetry

    @router.post("/index", dependencies=[counted_first(documents=limits.raw_documents("documents"))])
    async def index_documents(body: IndexRequest, request: Request) -> list[DocumentRecord]:
        """Create an index or extend it; the stored documents come back with their ids and hashes."""
        allow(request, Role.WRITE, body.index_name)
        limits.documents([d.text for d in body.documents])
        records = await docs.add_documents(body.index_name, body.documents, keep_existing=body.if_exists == "keep")
        tel.indexed(len(records))
        metered_documents(request, [d.text for d in body.documents])
        return records

    def knowledge(request: Request) -> ScopedKnowledge:
        return scoped_knowledge(request, chat, limits, tel)

    @router.get("/indexes")
    async def list_indexes(request: Request) -> list[str]:
        """The index names this key may see."""
        return await knowledge(request).list_indexes()

    @router.get("/indexes/{index_name}/documents")
    async def list_documents(
        request: Request,
        index_name: str,
        limit: int = Query(10, ge=1, le=MAX_LIST_PAGE),
        offset: int = Query(0, ge=0),
        max_text_length: int | None = Query(1000, ge=1),
        metadata_filter: str | None = Query(None, description="JSON object of key: value pairs"),
    ) -> ListDocumentsResponse:
        """A page of documents in a stable order, optionally filtered by metadata equality."""
        name = checked_index(index_name)
        allow(request, Role.READ, name)
        limits.list_limit(limit)
        flt = None
        if metadata_filter:
            try:
                flt = validate_metadata_filter(parse_json(metadata_filter, "metadata_filter"))
            except ValueError as e:
                raise BadRequestError(str(e), param="metadata_filter") from e
        return await docs.list_documents(
            name, limit=limit, offset=offset, max_text_length=max_text_length, metadata_filter=flt
        )

    @router.get("/indexes/{index_name}/documents/{doc_id:path}")
    async def get_document(
        index_name: str,
        doc_id: str,
        request: Request,
        max_text_length: int | None = Query(None, ge=1, description="Cut the text to this many characters."),
    ) -> DocumentRecord:
        """One document by id: its whole text (or its first `max_text_length` characters) and metadata."""
        return await knowledge(request).get_document(checked_index(index_name), doc_id, max_text_length)

    @router.post(
        "/indexes/{index_name}/documents", dependencies=[counted_first(documents=limits.raw_documents("documents"))]
    )
    async def update_documents(
        index_name: str, body: UpdateDocumentsRequest, request: Request
    ) -> UpdateDocumentsResponse:
        """Re-chunk and re-embed the documents whose text or metadata changed."""
        allow(request, Role.WRITE, index_name)
        limits.documents([d.text for d in body.documents])
        result = await docs.update_documents(checked_index(index_name), body.documents)
        metered_documents(request, [d.text for d in body.documents])
        return result

    @router.post(
        "/indexes/{index_name}/documents/delete", dependencies=[counted_first(doc_ids=limits.raw_documents("doc_ids"))]
    )
    async def delete_documents(
        index_name: str, body: DeleteDocumentsRequest, request: Request
    ) -> DeleteDocumentsResponse:
        allow(request, Role.WRITE, index_name)
        limits.document_count(len(body.doc_ids), "doc_ids")
        return await docs.delete_documents(checked_index(index_name), body.doc_ids, body.if_hash_values)

    @router.delete("/indexes/{index_name}")
    async def delete_index(index_name: str, request: Request) -> MessageResponse:
        allow(request, Role.ADMIN, index_name)
        return MessageResponse(message=await docs.drop_index(checked_index(index_name)))

    @router.post("/persist/{index_name}")
    async def persist(index_name: str, request: Request, path: str | None = None) -> MessageResponse:
        """A portable snapshot under `<storage_dir>/snapshots` (a key scoped to some indexes: under
        its scope's own folder there)."""
        principal = allow(request, Role.ADMIN, index_name)
        return MessageResponse(message=await docs.persist(checked_index(index_name), path, principal))

    @router.post("/load/{index_name}")
    async def load(
        index_name: str, request: Request, path: str | None = None, overwrite: bool = False
    ) -> MessageResponse:
        """Restore a snapshot; 409 if the index exists and `overwrite` is false. The key must reach
        both the target index and the index the snapshot was persisted from (403 otherwise)."""
        principal = allow(request, Role.ADMIN, index_name)
        return MessageResponse(message=await docs.load(checked_index(index_name), path, overwrite, principal))

    @router.get("/indexes/{index_name}/stats")
    async def index_stats(index_name: str, request: Request) -> IndexStats:
        """Documents, chunks, bytes, index kind and per-shard counts of an index."""
        name = checked_index(index_name)
        allow(request, Role.READ, name)
        return await docs.stats(name)

    @router.post("/query")
    async def query(body: QueryRequest, request: Request) -> QueryResponse:
        """Retrieve and answer (KAITO's shape): the answer and the nodes it was given."""
        allow(request, Role.READ, body.index_name)
        limits.top_k(body.top_k)
        record = usage_of(request)
        answer = await chat.query(body, record.chat if record is not None else None)
        metered_query(request, body.query)
        return answer

    @router.post("/retrieve")
    async def retrieve(body: RetrieveRequest, request: Request, response: Response) -> RetrieveResponse:
        """Scored nodes only, no generation: of one index, or of several as one ranking (`index_name`
        a list; each node names its index)."""
        result, timings = await knowledge(request).retrieve_timed(body)  # reported to the latency metrics there
        response.headers["Server-Timing"] = server_timing(timings)
        return result

    return router
