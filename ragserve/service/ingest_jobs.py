"""Ingestion jobs of documents (``POST /jobs``) and the one handler the job runner calls for every
kind of job (docs/architecture.md §8c).

A job of documents is stored whole when it is accepted (``ragserve.jobs.store``: the documents are
in its items, batches of ``job_batch_documents``), so it survives a restart; the runner indexes one
batch at a time per slot (``job_concurrency``), which keeps the embedder and the shards free for
queries. A batch that a 4xx refuses is retried document by document, so one bad document fails
alone, with its position and reason in the job's ``errors``, and the others are stored. A batch
run again after a crash stores nothing twice: documents with an id replace themselves, and those
without get an id derived from their content, which finds the copy already stored.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from ragserve.api.documents import Document, DocumentRecord
from ragserve.api.jobs import DocumentError, DocumentProgress, IndexJobRequest, JobCountsOut, JobInfo, JobList
from ragserve.errors import BadRequestError, NotFoundError, PayloadTooLargeError, ServiceError
from ragserve.ingest import content_hash
from ragserve.jobs.store import Job, JobItem, JobStore
from ragserve.service.documents import DocumentService
from ragserve.service.limits import job_document_count
from ragserve.service.usage import Usage, UsageBackend

log = logging.getLogger(__name__)

#: The job kind of ``POST /jobs``.
DOCUMENTS_JOB = "index_documents"
#: How many per-document errors a job shows (``GET /jobs/{id}/errors`` pages through all).
ERROR_LIMIT = 100

Handler = Callable[[Job, JobItem], Awaitable[dict[str, Any]]]


def dispatch(handlers: Mapping[str, Handler]) -> Handler:
    """One handler for the runner, choosing by the job's kind."""

    async def handle(job: Job, item: JobItem) -> dict[str, Any]:
        handler = handlers.get(job.kind)
        if handler is None:
            raise ServiceError(f"no handler for jobs of kind {job.kind!r}", code="unknown_kind")
        return await handler(job, item)

    return handle


#: The job's ``meta`` entry naming the key that submitted it (``_``: not shown in the job's info).
USAGE_KEY = "_usage_key"


class JobService:
    def __init__(
        self,
        store: JobStore,
        documents: DocumentService,
        *,
        batch_documents: int,
        max_documents: int,
        max_document_chars: int,
        wake: Callable[[], None] | None = None,
        webhook_configured: bool = False,
        usage: UsageBackend | None = None,
    ):
        self.store = store
        self.usage = usage  # where the embedding tokens of each batch go, under the key that submitted the job
        self.documents = documents
        self.batch_documents = batch_documents
        self.max_documents = max_documents
        self.max_document_chars = max_document_chars
        self._wake = wake
        self.webhook_configured = webhook_configured

    # --- the API --------------------------------------------------------------------------------
    async def submit(self, req: IndexJobRequest, usage_key: str | None = None, owner: str = "") -> JobInfo:
        """Store the job whole (one transaction) and return it, queued; the runner starts it.
        ``usage_key``: the name of the key that submits it, whose usage its batches' embedding is;
        ``owner``: the key's ``Principal.owner``, in whose turn the runner takes it
        (``ragserve.jobs.store``, "Order")."""
        docs = req.documents
        job_document_count(len(docs), self.max_documents)
        for i, d in enumerate(docs):
            if len(d.text) > self.max_document_chars:
                raise PayloadTooLargeError(
                    f"documents[{i}].text has {len(d.text)} characters; at most {self.max_document_chars} "
                    "are accepted, split the document",
                    param=f"documents[{i}].text",
                )
        DocumentService._reject_repeated_ids([d.doc_id for d in docs])
        n = self.batch_documents

        def create() -> Job:
            # on a thread, the documents' dump too: 20,000 of them with their metadata are ~0.1-0.2 s
            items = [
                (
                    f"batch-{i // n:06d}",
                    {"first": i, "documents": [d.model_dump(exclude_none=True) for d in docs[i : i + n]]},
                )
                for i in range(0, len(docs), n)
            ]
            return self.store.create(
                DOCUMENTS_JOB,
                req.index_name,
                items,
                {
                    "documents": len(docs),
                    "batch_documents": n,
                    **({"if_exists": req.if_exists} if req.if_exists != "replace" else {}),
                    **({USAGE_KEY: usage_key} if usage_key else {}),
                },
                req.webhook and self.webhook_configured,
                owner=owner,
            )

        job = await asyncio.to_thread(create)
        if self._wake is not None:
            self._wake()
        return await self.info(job)

    async def get(self, job_id: str) -> JobInfo:
        return await self.info(await self.job(job_id))

    async def job(self, job_id: str) -> Job:
        try:
            return await asyncio.to_thread(self.store.get, job_id)
        except NotFoundError:
            raise _no_job(job_id) from None

    async def visible_job(self, job_id: str, visible: Callable[[str], bool]) -> Job:
        """The job, when its index is one ``visible`` passes; else the same 404 as for an id that
        names no job, so a key scoped to some indexes can tell neither another tenant's job from
        none nor the name of its index."""
        job = await self.job(job_id)
        if not visible(job.index):
            raise _no_job(job_id)
        return job

    async def list_jobs(
        self, index: str | None, status: str | None, limit: int, after: str | None, visible: Callable[[str], bool]
    ) -> JobList:
        if after is not None:  # a cursor the key may not see is no entry of its list, as one that names none
            try:
                await self.visible_job(after, visible)
            except NotFoundError:
                raise BadRequestError("after names no entry of this list", param="after") from None
        out: list[JobInfo] = []
        more = True
        while more and len(out) <= limit:
            page = await asyncio.to_thread(self.store.list_jobs, index, status, limit + 1, after)
            more = page.has_more
            if not page.data:
                break
            for job in page.data:
                if visible(job.index):
                    out.append(await self.info(job, with_errors=False))
            after = page.data[-1].id
        shown = out[:limit]
        return JobList(data=shown, has_more=more or len(out) > limit, last_id=shown[-1].id if shown else None)

    async def cancel(self, job_id: str) -> JobInfo:
        await self.job(job_id)
        return await self.info(await asyncio.to_thread(self.store.cancel, job_id))

    async def info(self, job: Job, with_errors: bool = True) -> JobInfo:
        """The job as shown. Its documents' progress comes from its items' outcomes, read without
        their payloads (a poll of a job of 20,000 documents would read them all): item ``seq`` holds
        the documents from ``seq * batch_documents`` on (the job's ``meta``). Only a failed item's
        documents are read, for their ids, and only until ``ERROR_LIMIT`` errors are shown."""
        c = job.counts
        progress: DocumentProgress | None = None
        errors: list[DocumentError] = []
        if job.kind == DOCUMENTS_JOB:
            items = await asyncio.to_thread(self._all_items, job.id)
            size = int(job.meta.get("batch_documents") or self.batch_documents)  # a job from before it was recorded
            count = int(job.meta.get("documents", 0))
            total = indexed = failed = pending = cancelled = 0
            for it in items:
                first = it.seq * size
                n = max(0, min(size, count - first))
                total += n
                if it.status == "completed":
                    errs = (it.result or {}).get("errors", [])
                    failed += len(errs)
                    indexed += n - len(errs)
                    if with_errors:
                        errors += [DocumentError(**e) for e in errs]
                elif it.status == "failed":
                    failed += n
                    if with_errors and len(errors) < ERROR_LIMIT:
                        batch = await asyncio.to_thread(self.store.get_item, job.id, it.key)
                        err = it.error or {}
                        errors += [
                            DocumentError(
                                index=first + j,
                                doc_id=d.get("doc_id"),
                                code=str(err.get("code") or "failed"),
                                message=str(err.get("message") or ""),
                            )
                            for j, d in enumerate(batch.payload.get("documents", []))
                        ]
                elif it.status == "cancelled":
                    cancelled += n
                else:
                    pending += n
            progress = DocumentProgress(
                total=total, indexed=indexed, failed=failed, pending=pending, cancelled=cancelled
            )
        return JobInfo(
            id=job.id,
            kind=job.kind,
            index_name=job.index,
            status=job.status,
            created_at=job.created_at,
            started_at=job.started_at,
            finished_at=job.finished_at,
            counts=JobCountsOut(
                queued=c.queued,
                in_progress=c.in_progress,
                completed=c.completed,
                failed=c.failed,
                cancelled=c.cancelled,
                total=c.total,
            ),
            documents=progress,
            errors=sorted(errors, key=lambda e: e.index)[:ERROR_LIMIT],
            error=job.error,
            meta={k: v for k, v in job.meta.items() if not k.startswith("_")},  # "_": the server's own
        )

    def _all_items(self, job_id: str) -> list[JobItem]:
        out: list[JobItem] = []
        after: str | None = None
        while True:
            page = self.store.list_items(job_id, limit=1000, after=after, payload=False)
            out += page.data
            if not page.has_more or not page.data:
                return out
            after = page.data[-1].key

    # --- the handler ----------------------------------------------------------------------------
    async def index_batch(self, job: Job, item: JobItem) -> dict[str, Any]:
        """Index one batch of a documents job; a batch a 4xx refuses, document by document. A
        document refused is recorded in the result's ``errors`` (the item still completes: it was
        processed); a 5xx fails the item, which says so."""
        first = int(item.payload.get("first", 0))
        docs = [Document(**d) for d in item.payload.get("documents", [])]
        keep = job.meta.get("if_exists") == "keep"
        try:
            records = await self.documents.add_documents(job.index, docs, keep_existing=keep)
            await self._metered(job, docs)
            return _batch_result(first, docs, records)
        except ServiceError as e:
            if not 400 <= e.status < 500:
                raise
            if len(docs) == 1:
                return {"doc_ids": [], "errors": [_doc_error(first, docs[0], e)]}
        doc_ids: list[str] = []
        errors: list[dict[str, Any]] = []
        for j, d in enumerate(docs):
            try:
                got = _batch_result(
                    first + j, [d], await self.documents.add_documents(job.index, [d], keep_existing=keep)
                )
                doc_ids += got["doc_ids"]
                errors += got["errors"]
                await self._metered(job, [d])
            except ServiceError as e:
                if not 400 <= e.status < 500:
                    raise  # the server's trouble, not the document's
                errors.append(_doc_error(first + j, d, e))
        return {"doc_ids": doc_ids, "errors": errors}

    async def _metered(self, job: Job, docs: list[Document]) -> None:
        """Record the embedding tokens of ``docs``, indexed for ``job``, as its submitter's usage
        (in the embedding model's tokens, as ``/index`` counts them); a failure is logged, not the item's."""
        key = job.meta.get(USAGE_KEY)
        if self.usage is None or not isinstance(key, str):
            return
        count = self.documents.chunker.count_tokens
        try:
            tokens = await asyncio.to_thread(lambda: sum(count(d.text) for d in docs))
            await self.usage.record([Usage(key, (job.index,), embedding_tokens=tokens)])
        except Exception:
            log.exception("could not record the usage of job %s", job.id)


def _batch_result(first: int, docs: list[Document], records: list[DocumentRecord]) -> dict[str, Any]:
    """A batch's doc ids and errors: a document the index kept another one in place of (``if_exists:
    keep``: its record is the stored document, another hash) is an error, ``document_exists``."""
    doc_ids: list[str] = []
    errors: list[dict[str, Any]] = []
    for j, (d, rec) in enumerate(zip(docs, records, strict=True)):
        if d.doc_id is not None and rec.hash_value != content_hash(d.text, d.metadata):
            errors.append(
                {
                    "index": first + j,
                    "doc_id": d.doc_id,
                    "code": "document_exists",
                    "message": f"the index already holds another document under doc_id {d.doc_id!r}; it was kept "
                    "(if_exists: keep)",
                }
            )
        else:
            doc_ids.append(rec.doc_id)
    return {"doc_ids": doc_ids, "errors": errors}


def _doc_error(index: int, doc: Document, e: ServiceError) -> dict[str, Any]:
    message = e.message.removeprefix("documents[0]: ").removeprefix("documents[0].")
    return {"index": index, "doc_id": doc.doc_id, "code": str(e.code or "invalid_document"), "message": message}


def _no_job(job_id: str) -> NotFoundError:
    """What a missing job is answered with, and a job a key may not see (``visible_job``)."""
    return NotFoundError(f"No job found with id '{job_id}'.", param="job_id")
