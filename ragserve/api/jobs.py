"""Wire models of ingestion jobs (``/jobs``): documents indexed in the background, with status,
progress, per-document errors and cancellation (docs/architecture.md §8c). The same jobs index
the files of OpenAI vector stores (``ragserve.api.vector_stores``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ragserve.api.documents import IF_EXISTS_DESCRIPTION, Document, IfExists, validate_index_name
from ragserve.api.values import RequestModel

JobStatusName = Literal["queued", "in_progress", "completed", "failed", "cancelled"]


class IndexJobRequest(RequestModel):
    """``POST /jobs``: what ``POST /index`` takes, indexed in the background. ``webhook`` (default
    true) asks for the server's webhook (``job_webhook_url``) when the job ends."""

    model_config = ConfigDict(extra="forbid")
    index_name: str
    documents: list[Document] = Field(min_length=1)
    webhook: bool = True
    if_exists: IfExists = Field(default="replace", description=IF_EXISTS_DESCRIPTION)

    _check_name = field_validator("index_name")(lambda cls, v: validate_index_name(v))


class JobCountsOut(BaseModel):
    queued: int
    in_progress: int
    completed: int
    failed: int
    cancelled: int
    total: int


class DocumentError(BaseModel):
    """A document the job could not index: its position in the request, its id if it had one, why."""

    index: int
    doc_id: str | None = None
    code: str
    message: str


class DocumentProgress(BaseModel):
    total: int
    indexed: int = Field(description="Documents stored (new, replaced, or already there unchanged).")
    failed: int
    pending: int = Field(description="Documents not yet tried (queued or running).")
    cancelled: int


class JobInfo(BaseModel):
    """A job: ``counts`` are its items (batches of documents, or vector-store files), ``documents``
    the documents of an index job; ``errors`` the first ``error_limit`` documents that failed."""

    id: str
    object: Literal["ingestion.job"] = "ingestion.job"
    kind: str
    index_name: str
    status: JobStatusName
    created_at: int
    started_at: int | None
    finished_at: int | None
    counts: JobCountsOut
    documents: DocumentProgress | None = None
    errors: list[DocumentError] = Field(default_factory=list)
    error: str | None = None
    meta: dict[str, Any] = Field(default_factory=dict)


class JobList(BaseModel):
    object: Literal["list"] = "list"
    data: list[JobInfo]
    has_more: bool
    last_id: str | None
