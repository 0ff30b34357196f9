"""Ingestion jobs (``/jobs``): ``POST /index`` in the background, with status, progress,
per-document errors and cancellation (``ragserve.service.ingest_jobs``). A job's index decides who
may see it: reading a job needs the read role on its index, starting or cancelling one the write
role. Errors are ``{"detail": ...}``, as on the rest of the document API."""

from __future__ import annotations

from fastapi import APIRouter, Query, Request, Response

from ragserve.api.jobs import IndexJobRequest, JobInfo, JobList, JobStatusName
from ragserve.http.errors import DOCUMENT_ERRORS
from ragserve.http.json_body import CheckedJSONRoute, counted_first
from ragserve.http.routes.common import allow, checked_index, metered_documents
from ragserve.service.access import Role
from ragserve.service.ingest_jobs import JobService
from ragserve.service.limits import RequestLimits

#: How soon a client polling a running job should ask again (``Retry-After``-like hint).
POLL_AFTER_S = 1


def jobs_router(jobs: JobService, limits: RequestLimits) -> APIRouter:
    router = APIRouter(tags=["jobs"], responses=DOCUMENT_ERRORS, route_class=CheckedJSONRoute)

    @router.post("/jobs", status_code=202, dependencies=[counted_first(documents=limits.raw_job_documents)])
    async def submit_job(body: IndexJobRequest, request: Request, response: Response) -> JobInfo:
        """Index documents in the background: accepted at once (202) with the job's id; the job
        survives a restart of the server. Poll ``GET /jobs/{id}`` (the ``Location`` header)."""
        principal = allow(request, Role.WRITE, body.index_name)
        job = await jobs.submit(body, usage_key=principal.name, owner=principal.owner)
        # documents and bytes accepted; their tokens are recorded by the runner as it embeds them
        metered_documents(request, [d.text for d in body.documents], embedded=False)
        response.headers["Location"] = f"jobs/{job.id}"
        return job

    @router.get("/jobs")
    async def list_jobs(
        request: Request,
        index_name: str | None = Query(None, max_length=128),
        status: JobStatusName | None = None,
        limit: int = Query(20, ge=1, le=100),
        after: str | None = Query(None, min_length=1, max_length=64),
    ) -> JobList:
        """Jobs newest first (those of the indexes this key may read)."""
        principal = allow(request, Role.READ, checked_index(index_name) if index_name else None)
        return await jobs.list_jobs(index_name, status, limit, after, principal.sees)

    @router.get("/jobs/{job_id}")
    async def get_job(job_id: str, request: Request, response: Response) -> JobInfo:
        """The job's status, item and document counts, and the first documents that failed. A job
        of an index this key does not reach is a 404, as one that does not exist."""
        principal = allow(request, Role.READ)
        job = await jobs.visible_job(job_id, principal.sees)
        allow(request, Role.READ, job.index)
        info = await jobs.info(job)
        if info.finished_at is None:
            response.headers["Retry-After"] = str(POLL_AFTER_S)
        return info

    @router.post("/jobs/{job_id}/cancel")
    async def cancel_job(job_id: str, request: Request) -> JobInfo:
        """Documents not yet started are not indexed; a batch being indexed is stopped. A job of an
        index this key does not reach is a 404, as one that does not exist."""
        principal = allow(request, Role.WRITE)
        job = await jobs.visible_job(job_id, principal.sees)
        allow(request, Role.WRITE, job.index)
        return await jobs.cancel(job_id)

    return router
