"""OpenAI's Vector Stores API over ragserve's indexes, files and ingestion jobs (docs/architecture.md §8b).

- A vector store is an index named by its id (``vs_<hex>``): chat, ``/retrieve``, ``/query``, the
  document API and scoped keys take the id as ``index_name``.
- Attaching a file (alone, in a batch, or at creation) records it in the catalog
  (``ragserve.service.vector_store_catalog``) and queues an ingestion job (``ragserve.jobs``) whose
  items index the files; the request returns at once. A file's status is its job item's status,
  read when the file is shown: ``queued`` shows as ``in_progress`` (OpenAI has no queued state).
- A file is indexed under the metadata path ``vector_stores/<file id>/<filename>``: its document
  ids follow the path, so indexing it again (a retry after a crash, an attach with new attributes)
  replaces its documents, never doubles them. Its attributes are stored in each document's
  metadata, with ``file_id`` and ``filename``, so filters see them.
- Search embeds each query, retrieves from the store's index in the server's retrieval mode and
  returns its chunks with their file, score (cosine), attributes and text.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ragserve.api.documents import NodeWithScore, RetrievalMode
from ragserve.api.vector_stores import (
    BatchFile,
    ChunkingStrategy,
    ChunkingStrategyOut,
    CreateFileBatchRequest,
    CreateVectorStoreRequest,
    FileContentPage,
    FileCounts,
    LastError,
    SearchContent,
    SearchRequest,
    SearchResult,
    SearchResultsPage,
    StaticChunking,
    UpdateVectorStoreRequest,
    VectorStore,
    VectorStoreDeleted,
    VectorStoreFile,
    VectorStoreFileBatch,
    VectorStoreFileDeleted,
    VectorStoreFileList,
    VectorStoreList,
    openai_filter,
)
from ragserve.errors import BadRequestError, NotFoundError, ServiceError
from ragserve.ingest.chunker import DocumentChunker
from ragserve.jobs.store import Job, JobItem, JobStore, new_job_id, to_json
from ragserve.service.documents import DocumentService
from ragserve.service.file_store import FileStore
from ragserve.service.files import clean_name, convert_file, replace_path
from ragserve.service.limits import RequestLimits
from ragserve.service.vector_store_catalog import Order, Removal, StoreFileRecord, StoreRecord, VectorStoreCatalog

log = logging.getLogger(__name__)

#: The job kind whose items index a vector store's files.
FILE_JOB = "vector_store_file"
#: Purposes of a File that a vector store takes (OpenAI: files for file_search).
STORE_PURPOSES = frozenset({"assistants", "user_data"})
#: Metadata keys a file's documents carry of their own; an attribute may not take one of them.
RESERVED_KEYS = frozenset(
    {"path", "title", "file_type", "mtime", "page", "pages", "part", "parts", "split_type", "language"}
    | {"file_id", "filename"}
)
#: The metadata path prefix of a vector store file's documents.
PATH_PREFIX = "vector_stores"
#: OpenAI's ``last_error.code`` for the codes a failed item may carry.
_LAST_ERROR_CODES = {"unsupported_file": "unsupported_file", "invalid_file": "invalid_file"}
#: How often the SDK's ``*_and_poll`` helpers should ask again (header ``openai-poll-after-ms``).
POLL_AFTER_MS = 250


def new_store_id() -> str:
    return "vs_" + secrets.token_hex(12)


def _status(item: JobItem | None) -> str:
    if item is None:
        return "failed"
    return "in_progress" if item.status in ("queued", "in_progress") else item.status


@dataclass(frozen=True)
class _Chunking:
    """A file's chunk sizes: its own ``chunking_strategy``, else its store's, else the server's."""

    size: int
    overlap: int

    def as_dict(self) -> dict[str, int]:
        return {"max_chunk_size_tokens": self.size, "chunk_overlap_tokens": self.overlap}


class VectorStoreService:
    def __init__(
        self,
        catalog: VectorStoreCatalog,
        files: FileStore,
        jobs: JobStore,
        documents: DocumentService,
        limits: RequestLimits,
        *,
        retrieval_mode: RetrievalMode,
        wake: Any = None,
    ):
        self.catalog = catalog
        self.files = files
        self.jobs = jobs
        self.documents = documents
        self.limits = limits
        self.retrieval_mode = retrieval_mode
        self._wake = wake  # the job runner's wake(): a new job starts without waiting for a poll
        # one item of a file at a time (job_concurrency > 1 may run an older and a newer attach of
        # the same file at once): this process owns the runner (docs/architecture.md §8c)
        self._file_locks: weakref.WeakValueDictionary[tuple[str, str], asyncio.Lock] = weakref.WeakValueDictionary()
        self._removing: set[asyncio.Task[None]] = set()  # removals waiting for a file's running item

    # --- helpers --------------------------------------------------------------------------------
    def _default_chunking(self) -> _Chunking:
        c = self.documents.chunker
        return _Chunking(c.chunk_size, c.chunk_overlap)

    def _chunking(self, asked: ChunkingStrategy | None, store_default: dict[str, int] | None) -> dict[str, int] | None:
        if asked is not None and asked.static is not None:
            return {
                "max_chunk_size_tokens": asked.static.max_chunk_size_tokens,
                "chunk_overlap_tokens": asked.static.chunk_overlap_tokens,
            }
        if asked is not None:  # auto: the server's sizes
            return None
        return store_default

    def _chunking_out(self, chunking: dict[str, int] | None) -> ChunkingStrategyOut:
        return ChunkingStrategyOut(static=chunking or self._default_chunking().as_dict())

    async def _store(self, store_id: str) -> StoreRecord:
        rec = await asyncio.to_thread(self.catalog.get_store, store_id)
        if rec is None:
            raise NotFoundError(f"No vector store found with id '{store_id}'.", param="vector_store_id")
        return rec

    async def _checked_files(self, entries: Sequence[BatchFile]) -> None:
        """Every file exists and has a purpose a vector store takes; attributes keep clear of the
        documents' own metadata keys. Checked before anything is recorded."""
        seen: set[str] = set()
        for i, e in enumerate(entries):
            if e.file_id in seen:
                raise BadRequestError(f"file {e.file_id!r} is given twice; give each file once", param="file_ids")
            seen.add(e.file_id)
            obj = await self.files.get(e.file_id)
            if obj.purpose not in STORE_PURPOSES:
                raise BadRequestError(
                    f"file {e.file_id!r} has purpose {obj.purpose!r}; a vector store takes files uploaded with "
                    f"purpose {' or '.join(sorted(STORE_PURPOSES))}",
                    param="file_id",
                )
            clash = sorted(RESERVED_KEYS & set(e.attributes or {}))
            if clash:
                raise BadRequestError(
                    f"attributes of file {e.file_id!r} use {', '.join(clash)}, which the server sets on every "
                    "document of a file; rename them",
                    param="attributes",
                )
            del i

    async def _plan(
        self, store: StoreRecord, entries: Sequence[BatchFile]
    ) -> tuple[str, list[tuple[str, dict[str, Any], dict[str, int] | None]], list[tuple[str, dict[str, Any]]]]:
        """The job that will index ``entries``: its id, the catalog's rows and the job's items.

        The id is chosen before the job exists so the catalog names it first and the job is created
        after (``_start``): a runner that polls on its own could otherwise claim an item before the
        catalog's row is written, find its file not attached, write nothing, and the file would show
        ``completed`` with no text indexed. A crash between the two writes leaves a file whose job
        does not exist, shown ``failed`` (attach it again), never one reported done. The items are
        checked here as the job store will store them, so one it would refuse records nothing."""
        rows = [
            (e.file_id, dict(e.attributes or {}), self._chunking(e.chunking_strategy, store.chunking)) for e in entries
        ]
        items = [
            (fid, {"store_id": store.id, "file_id": fid, "attributes": attrs, "chunking": chunking})
            for fid, attrs, chunking in rows
        ]

        def check() -> None:
            for fid, payload in items:
                to_json(payload, f"payload of item {fid!r}")

        await asyncio.to_thread(check)
        return new_job_id(), rows, items

    async def _start(self, store_id: str, job_id: str, items: list[tuple[str, dict[str, Any]]], owner: str) -> None:
        """Create the job the catalog already names (``_plan``), and wake the runner for it.
        ``owner``: the name of the key that attached the files, in whose turn the runner takes it."""
        meta = {"vector_store_id": store_id}
        await asyncio.to_thread(self.jobs.create, FILE_JOB, store_id, items, meta, True, job_id=job_id, owner=owner)
        self._wake_runner()

    def _wake_runner(self) -> None:
        if self._wake is not None:
            self._wake()

    async def _items(self, records: Sequence[StoreFileRecord]) -> dict[tuple[str, str], JobItem]:
        pairs = [(r.job_id, r.file_id) for r in records]
        return await asyncio.to_thread(self.jobs.get_items, pairs)

    def _file_out(self, rec: StoreFileRecord, item: JobItem | None) -> VectorStoreFile:
        status = _status(item)
        last_error = None
        if status == "failed":
            err = (item.error if item is not None else None) or {}
            last_error = LastError(
                code=_LAST_ERROR_CODES.get(str(err.get("code")), "server_error"),  # type: ignore[arg-type]
                message=str(err.get("message") or "the file's ingestion job is gone"),
            )
        usage = int((item.result or {}).get("usage_bytes", 0)) if item is not None and status == "completed" else 0
        return VectorStoreFile(
            id=rec.file_id,
            created_at=rec.created_at,
            vector_store_id=rec.store_id,
            status=status,  # type: ignore[arg-type]
            last_error=last_error,
            usage_bytes=usage,
            attributes=rec.attributes,
            chunking_strategy=self._chunking_out(rec.chunking),
        )

    async def _store_out(self, rec: StoreRecord) -> VectorStore:
        files = await asyncio.to_thread(self.catalog.all_files, rec.id)
        items = await self._items(files)
        counts = FileCounts(total=len(files))
        usage = 0
        for f in files:
            out = self._file_out(f, items.get((f.job_id, f.file_id)))
            setattr(counts, out.status, getattr(counts, out.status) + 1)
            usage += out.usage_bytes
        return VectorStore(
            id=rec.id,
            created_at=rec.created_at,
            name=rec.name,
            description=rec.description,
            usage_bytes=usage,
            file_counts=counts,
            status="in_progress" if counts.in_progress else "completed",
            last_active_at=rec.last_active_at,
            metadata=rec.metadata,
        )

    # --- stores ---------------------------------------------------------------------------------
    async def create(self, req: CreateVectorStoreRequest, store_id: str | None = None, owner: str = "") -> VectorStore:
        entries = [BatchFile(file_id=f, chunking_strategy=req.chunking_strategy) for f in req.file_ids or []]
        await self._checked_files(entries)
        store_id = store_id or new_store_id()
        chunking = self._chunking(req.chunking_strategy, None)
        draft = StoreRecord(store_id, req.name or "", req.description, dict(req.metadata or {}), chunking, 0, 0)
        job_id, rows, items = await self._plan(draft, entries)
        rec = await asyncio.to_thread(
            self.catalog.create_store,
            store_id,
            draft.name,
            draft.description,
            draft.metadata,
            chunking,
            rows,
            job_id if entries else None,
        )
        if entries:
            await self._start(store_id, job_id, items, owner)
        return await self._store_out(rec)

    async def get(self, store_id: str) -> VectorStore:
        return await self._store_out(await self._store(store_id))

    async def list_stores(
        self,
        limit: int,
        order: Order,
        after: str | None,
        before: str | None,
        visible: Callable[[str], bool] = lambda _: True,
    ) -> VectorStoreList:
        """A page of the stores ``visible`` lets the caller see (a scoped key: its indexes). A
        cursor it may not see is taken as one that names no store (a page from the start), so the
        answer does not tell another tenant's store from none. ``before`` alone reads backwards:
        each further catalog page holds earlier stores, and the page shown is the ``limit`` just
        before the cursor."""
        nothing = ""  # names no store: the catalog ignores it, as a store deleted since
        after = after if after is None or visible(after) else nothing
        before = before if before is None or visible(before) else nothing
        backwards = before is not None and after is None
        recs: list[StoreRecord] = []
        more = True
        while more and len(recs) <= limit:
            page, more = await asyncio.to_thread(self.catalog.list_stores, limit + 1, order, after, before)
            kept = [r for r in page if visible(r.id)]
            recs = kept + recs if backwards else recs + kept
            if not page:
                break
            if backwards:
                before = page[0].id
            else:
                after = page[-1].id
        more = more or len(recs) > limit
        data = [await self._store_out(r) for r in (recs[-limit:] if backwards else recs[:limit])]
        return VectorStoreList(
            data=data, first_id=data[0].id if data else None, last_id=data[-1].id if data else None, has_more=more
        )

    async def update(self, store_id: str, req: UpdateVectorStoreRequest) -> VectorStore:
        await self._store(store_id)
        rec = await asyncio.to_thread(self.catalog.update_store, store_id, req.name, req.metadata)
        if rec is None:
            raise NotFoundError(f"No vector store found with id '{store_id}'.", param="vector_store_id")
        return await self._store_out(rec)

    async def delete(self, store_id: str) -> VectorStoreDeleted:
        """Forget the store first, with the removal of its index recorded in the same transaction (a
        file job that runs on finds no store and writes nothing), then cancel its jobs and drop its
        index; a crash between leaves the removal to the next start (``resume_removals``)."""
        forgotten = await asyncio.to_thread(self.catalog.delete_store, store_id)
        if forgotten is None:
            raise NotFoundError(f"No vector store found with id '{store_id}'.", param="vector_store_id")
        files, removal = forgotten
        for job_id in sorted({f.job_id for f in files if f.job_id}):
            await asyncio.to_thread(self.jobs.cancel, job_id)
        await self._remove_soon(removal)
        return VectorStoreDeleted(id=store_id)

    async def _remove_soon(self, removal: Removal) -> None:
        """``_remove`` now, or, while an item of the file runs (it may take minutes; it removes what it
        wrote itself once it finds the file detached), on a task of its own once that item is done:
        the request that detached the file does not wait for it. Until it is done the removal stays
        recorded, so a stop before it leaves it to the next start."""
        if removal.file_id is None or not self._file_lock(removal.store_id, removal.file_id).locked():
            await self._remove(removal)
            return
        task = asyncio.create_task(self._remove(removal), name=f"remove-{removal.store_id}-{removal.file_id}")
        self._removing.add(task)
        task.add_done_callback(self._removed)

    async def stop(self, timeout_s: float = 10.0) -> None:
        """Let the removals that waited for a file's item finish (stop the runner first: its items
        end, and their locks free); one still waiting after ``timeout_s`` stays recorded for the
        next start."""
        if self._removing:
            _, late = await asyncio.wait(set(self._removing), timeout=timeout_s)
            for task in late:
                task.cancel()

    def _removed(self, task: asyncio.Task[None]) -> None:
        self._removing.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("a vector store removal failed; it is tried again at the next start", exc_info=task.exception())

    async def _remove(self, removal: Removal) -> None:
        """Do a recorded removal, then forget it. A file's documents are removed under its lock (an
        item of it that runs finishes first), and not when the file was attached again meanwhile:
        the newer attach's item replaces them (removing them after it ran left the file
        ``completed`` with nothing indexed)."""
        if removal.file_id is None:
            await self._drop_index(removal.store_id)
        else:
            async with self._file_lock(removal.store_id, removal.file_id):
                again = await asyncio.to_thread(self.catalog.get_file, removal.store_id, removal.file_id)
                if again is None:
                    with contextlib.suppress(NotFoundError):  # the store's index is gone too
                        await self._delete_documents(removal.store_id, removal.file_id)
        await asyncio.to_thread(self.catalog.removal_done, removal.seq)

    async def _drop_index(self, store_id: str) -> None:
        """Drop a deleted store's index, if any file of it was ever indexed."""
        with contextlib.suppress(NotFoundError):
            await self.documents.drop_index(store_id)

    async def resume_removals(self) -> int:
        """Do the removals a stopped process left owed (a crash between forgetting a file or a store
        and removing its documents); how many were done. One that fails stays for the next start."""
        done = 0
        for removal in await asyncio.to_thread(self.catalog.pending_removals):
            try:
                await self._remove(removal)
                done += 1
            except Exception:
                log.exception(
                    "vector store %s: removing %s failed; it is tried again at the next start",
                    removal.store_id,
                    removal.file_id or "its index",
                )
        return done

    # --- files ----------------------------------------------------------------------------------
    async def attach(
        self,
        store_id: str,
        file_id: str,
        attributes: dict[str, Any] | None,
        chunking: ChunkingStrategy | None,
        owner: str = "",
    ) -> VectorStoreFile:
        store = await self._store(store_id)
        entry = BatchFile(file_id=file_id, attributes=attributes, chunking_strategy=chunking)
        await self._checked_files([entry])
        job_id, rows, items = await self._plan(store, [entry])
        if not await asyncio.to_thread(self.catalog.attach, store_id, rows, job_id):
            raise NotFoundError(f"No vector store found with id '{store_id}'.", param="vector_store_id")
        await self._start(store_id, job_id, items, owner)
        return await self.get_file(store_id, file_id)

    async def get_file(self, store_id: str, file_id: str) -> VectorStoreFile:
        await self._store(store_id)
        rec = await asyncio.to_thread(self.catalog.get_file, store_id, file_id)
        if rec is None:
            raise NotFoundError(f"No file '{file_id}' in vector store '{store_id}'.", param="file_id")
        items = await self._items([rec])
        return self._file_out(rec, items.get((rec.job_id, rec.file_id)))

    async def list_files(
        self,
        store_id: str,
        limit: int,
        order: Order,
        after: str | None,
        before: str | None,
        status: str | None,
        batch_id: str | None = None,
    ) -> VectorStoreFileList:
        await self._store(store_id)
        if status is None:
            recs, more = await asyncio.to_thread(
                self.catalog.list_files, store_id, limit, order, after, before, batch_id
            )
            items = await self._items(recs)
            data = [self._file_out(r, items.get((r.job_id, r.file_id))) for r in recs]
        else:  # the status lives in the jobs: filter the whole list, then page it
            every = await asyncio.to_thread(self.catalog.all_files, store_id, batch_id)
            if order == "desc":
                every.reverse()
            items = await self._items(every)
            shown = [self._file_out(r, items.get((r.job_id, r.file_id))) for r in every]
            shown = [f for f in shown if f.status == status]
            ids = [f.id for f in shown]
            start = ids.index(after) + 1 if after in ids else 0
            end = ids.index(before) if before in ids else len(shown)
            if before in ids and after not in ids:
                start = max(0, end - limit)
            data, more = shown[start:end][:limit], len(shown[start:end]) > limit
        return VectorStoreFileList(
            data=data, first_id=data[0].id if data else None, last_id=data[-1].id if data else None, has_more=more
        )

    async def update_file(
        self, store_id: str, file_id: str, attributes: dict[str, Any] | None, owner: str = ""
    ) -> VectorStoreFile:
        """New attributes: recorded, and the file indexed again so its documents carry them."""
        rec = await asyncio.to_thread(self.catalog.get_file, store_id, file_id)
        if rec is None:
            await self._store(store_id)
            raise NotFoundError(f"No file '{file_id}' in vector store '{store_id}'.", param="file_id")
        chunking = (
            ChunkingStrategy(type="static", static=StaticChunking(**rec.chunking))
            if rec.chunking
            else ChunkingStrategy(type="auto")
        )
        return await self.attach(store_id, file_id, attributes or {}, chunking, owner)

    async def detach(self, store_id: str, file_id: str) -> VectorStoreFileDeleted:
        """Forget the file first (its job item, if it still runs, then writes nothing), then delete
        its documents from the store's index. The File itself stays (DELETE /v1/files/{id})."""
        await self._store(store_id)
        forgotten = await asyncio.to_thread(self.catalog.detach, store_id, file_id)
        if forgotten is None:
            raise NotFoundError(f"No file '{file_id}' in vector store '{store_id}'.", param="file_id")
        await self._remove_soon(forgotten[1])
        return VectorStoreFileDeleted(id=file_id)

    async def file_content(self, store_id: str, file_id: str) -> FileContentPage:
        """The text the file was indexed as, a part per document in path order (pages, parts)."""
        rec = await asyncio.to_thread(self.catalog.get_file, store_id, file_id)
        if rec is None:
            await self._store(store_id)
            raise NotFoundError(f"No file '{file_id}' in vector store '{store_id}'.", param="file_id")
        parts = [
            (int((d.metadata or {}).get("page") or 0), int((d.metadata or {}).get("part") or 0), d.text)
            for d in await self.documents.matching_documents(store_id, {"file_id": file_id}, max_text_length=None)
        ]
        return FileContentPage(data=[SearchContent(text=t) for _, _, t in sorted(parts, key=lambda p: p[:2])])

    async def _file_exists(self, file_id: str) -> bool:
        try:
            await self.files.get(file_id)
        except NotFoundError:
            return False
        return True

    async def _delete_documents(self, index: str, file_id: str) -> None:
        gone = [d.doc_id for d in await self.documents.matching_documents(index, {"file_id": file_id})]
        if gone:
            await self.documents.delete_documents(index, gone)

    async def file_deleted(self, file_id: str) -> None:
        """A File was deleted (DELETE /v1/files/{id}): detach it from every store that has it, as
        OpenAI does, so no store serves text of a file that is gone."""
        for store_id in await asyncio.to_thread(self.catalog.stores_of_file, file_id):
            forgotten = await asyncio.to_thread(self.catalog.detach, store_id, file_id)
            if forgotten is not None:
                await self._remove_soon(forgotten[1])

    # --- batches --------------------------------------------------------------------------------
    async def create_batch(self, store_id: str, req: CreateFileBatchRequest, owner: str = "") -> VectorStoreFileBatch:
        store = await self._store(store_id)
        entries = req.entries()
        await self._checked_files(entries)
        job_id, rows, items = await self._plan(store, entries)
        if not await asyncio.to_thread(self.catalog.attach, store_id, rows, job_id):
            raise NotFoundError(f"No vector store found with id '{store_id}'.", param="vector_store_id")
        await self._start(store_id, job_id, items, owner)
        return await self.get_batch(store_id, job_id)

    async def _batch_job(self, store_id: str, batch_id: str) -> Job:
        await self._store(store_id)
        try:
            job = await asyncio.to_thread(self.jobs.get, batch_id)
        except NotFoundError:
            job = None
        if job is None or job.kind != FILE_JOB or job.index != store_id:
            raise NotFoundError(f"No file batch '{batch_id}' in vector store '{store_id}'.", param="batch_id")
        return job

    async def get_batch(self, store_id: str, batch_id: str) -> VectorStoreFileBatch:
        job = await self._batch_job(store_id, batch_id)
        c = job.counts
        counts = FileCounts(
            in_progress=c.queued + c.in_progress,
            completed=c.completed,
            failed=c.failed,
            cancelled=c.cancelled,
            total=c.total,
        )
        status = "in_progress" if job.status in ("queued", "in_progress") else job.status
        return VectorStoreFileBatch(
            id=job.id,
            created_at=job.created_at,
            vector_store_id=store_id,
            status=status,  # type: ignore[arg-type]
            file_counts=counts,
        )

    async def cancel_batch(self, store_id: str, batch_id: str) -> VectorStoreFileBatch:
        await self._batch_job(store_id, batch_id)
        await asyncio.to_thread(self.jobs.cancel, batch_id)
        return await self.get_batch(store_id, batch_id)

    # --- search ---------------------------------------------------------------------------------
    async def search(self, store_id: str, req: SearchRequest) -> SearchResultsPage:
        await self._store(store_id)
        flt = openai_filter(req.filters)
        queries = req.queries()
        if not await self.documents.index_exists(store_id):
            return SearchResultsPage(search_query=queries, data=[])
        k = req.max_num_results
        # the server's ranking (hybrid: fused) decides the order; several queries interleave by rank,
        # a chunk found by more than one keeping its best rank
        rank: dict[str, tuple[int, float, NodeWithScore]] = {}
        for q in queries:
            nodes, _ = await self.documents.retrieve(store_id, q, k, flt, self.retrieval_mode)
            for i, n in enumerate(nodes):
                key = (i, -n.score, n)
                if n.node_id not in rank or key[:2] < rank[n.node_id][:2]:
                    rank[n.node_id] = key
        threshold = req.ranking_options.score_threshold if req.ranking_options else None
        ranked = [n for _, _, n in sorted(rank.values(), key=lambda r: r[:2])]
        ranked = [n for n in ranked if threshold is None or n.score >= threshold][:k]
        attrs = await asyncio.to_thread(
            self.catalog.files_by_id, store_id, sorted({str(n.metadata.get("file_id")) for n in ranked})
        )
        data = []
        for n in ranked:
            fid = str(n.metadata.get("file_id") or "")
            rec = attrs.get(fid)
            data.append(
                SearchResult(
                    file_id=fid,
                    filename=str(n.metadata.get("filename") or n.metadata.get("path") or ""),
                    score=max(0.0, min(1.0, float(n.score))),
                    attributes=rec.attributes if rec is not None else {},
                    content=[SearchContent(text=n.text)],
                )
            )
        await asyncio.to_thread(self.catalog.touch, store_id)
        return SearchResultsPage(search_query=queries, data=data)

    # --- the job handler ------------------------------------------------------------------------
    async def index_file_item(self, job: Job, item: JobItem) -> dict[str, Any]:
        """Index one attached file (a job item). Does nothing when the file was detached or its
        store deleted since it was queued, or attached again by a newer job; checked again after
        writing, and what was written then is removed, so a deleted store or file never keeps text.
        Items of the same file run one at a time, so an older attach never writes after a newer one
        or removes what the newer one wrote."""
        async with self._file_lock(str(item.payload["store_id"]), str(item.payload["file_id"])):
            return await self._index_file(job, item)

    def _file_lock(self, store_id: str, file_id: str) -> asyncio.Lock:
        lock = self._file_locks.get((store_id, file_id))
        if lock is None:
            lock = self._file_locks[(store_id, file_id)] = asyncio.Lock()
        return lock

    async def _index_file(self, job: Job, item: JobItem) -> dict[str, Any]:
        p = item.payload
        store_id, file_id = str(p["store_id"]), str(p["file_id"])

        async def current() -> bool:
            rec = await asyncio.to_thread(self.catalog.get_file, store_id, file_id)
            return rec is not None and rec.job_id == job.id

        async def leave_nothing() -> None:  # detached, or its store deleted: nothing of it stays
            if await asyncio.to_thread(self.catalog.get_store, store_id) is None:
                await self._drop_index(store_id)
            else:
                await self._delete_documents(store_id, file_id)

        if not await current():
            return {"skipped": "detached"}
        try:
            obj = await self.files.get(file_id)
            data = await self.files.read(file_id)
        except NotFoundError as e:
            raise ServiceError(f"file {file_id!r} was deleted before it was indexed", code="invalid_file") from e
        name = clean_name(obj.filename, "filename").name
        rel = f"{PATH_PREFIX}/{file_id}/{name}"
        try:
            _, new = await convert_file(self.limits, name, data, rel, float(obj.created_at))
        except ServiceError as e:
            code = (
                "unsupported_file" if e.status == 415 else "invalid_file" if 400 <= e.status < 500 else "server_error"
            )
            raise ServiceError(e.message, status=e.status, code=code) from e
        extra = {**p.get("attributes", {}), "file_id": file_id, "filename": name}
        for d in new:
            d["metadata"] = {**d["metadata"], **extra}
        sizes = p.get("chunking")
        chunker: DocumentChunker | None = None
        if sizes:
            chunker = self.documents.chunker.resized(sizes["max_chunk_size_tokens"], sizes["chunk_overlap_tokens"])
        try:
            doc_ids, _ = await replace_path(self.documents, store_id, rel, new, name, chunker)
        except BaseException:
            # stopped mid-write (its job cancelled: the store deleted, say, whose index the write made
            # again): what it wrote goes too, and the clean-up itself is not cancelled
            if not await asyncio.shield(current()):
                await asyncio.shield(leave_nothing())
            raise
        if not await current():  # detached or deleted while it was indexed: leave nothing behind
            await asyncio.shield(leave_nothing())
            return {"skipped": "detached"}
        if not await self._file_exists(file_id):  # the File was deleted while it was indexed
            await asyncio.shield(self._delete_documents(store_id, file_id))
            raise ServiceError(f"file {file_id!r} was deleted while it was indexed", code="invalid_file")
        return {"doc_ids": doc_ids, "usage_bytes": sum(len(d["text"].encode("utf-8")) for d in new)}
