"""``JobService.info`` (what ``GET /jobs/{id}`` and ``GET /jobs`` show) on a large job: progress and
errors from the items' outcomes, without reading the documents the job holds on every poll."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import ragserve.jobs.store as job_store
from ragserve.api.documents import Document
from ragserve.api.jobs import IndexJobRequest
from ragserve.jobs.store import JobStore
from ragserve.service.ingest_jobs import DOCUMENTS_JOB, ERROR_LIMIT, JobService

BATCH = 64


@pytest.fixture
def jobs(tmp_path: Path) -> Any:
    with JobStore(tmp_path / "jobs.sqlite3") as store:
        yield JobService(store, None, batch_documents=BATCH, max_documents=20_000, max_document_chars=10_000)  # type: ignore[arg-type]


def payload_chars_read(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    read: list[int] = []
    original = job_store._item_of

    def counting(job_id: str, row: tuple[Any, ...]) -> Any:
        read.append(len(row[2]))
        return original(job_id, row)

    monkeypatch.setattr(job_store, "_item_of", counting)
    return read


async def test_a_poll_of_a_large_job_does_not_read_its_documents(
    jobs: JobService, monkeypatch: pytest.MonkeyPatch
) -> None:
    n = 5_000
    req = IndexJobRequest(index_name="kb", documents=[Document(text="x" * 1500, doc_id=f"d{i}") for i in range(n)])
    job = await jobs.submit(req)
    store = jobs.store
    # the first batch fails whole, the second completes with one document refused, the rest wait
    claimed = store.claim("t", 60)
    assert claimed is not None
    store.fail_item(job.id, claimed[1].key, {"code": "bad_batch", "message": "refused"})
    claimed = store.claim("t", 60)
    assert claimed is not None
    ids = [f"d{i}" for i in range(BATCH, 2 * BATCH)]
    error = {"index": BATCH + 3, "doc_id": f"d{BATCH + 3}", "code": "invalid_document", "message": "empty"}
    store.complete_item(job.id, claimed[1].key, {"doc_ids": ids[:3] + ids[4:], "errors": [error]})

    read = payload_chars_read(monkeypatch)
    info = await jobs.get(job.id)
    assert info.documents is not None
    p = info.documents
    assert (p.total, p.failed, p.indexed, p.pending) == (n, BATCH + 1, BATCH - 1, n - 2 * BATCH)
    assert [e.index for e in info.errors] == [*range(BATCH), BATCH + 3][:ERROR_LIMIT]
    assert info.errors[0].doc_id == "d0" and info.errors[0].code == "bad_batch"
    # one failed batch's documents at most (its doc_ids for the errors), never the whole job's
    assert sum(read) < 2 * BATCH * 1600, sum(read)
    read.clear()
    listed = await jobs.list_jobs(None, None, 20, None, lambda _: True)
    assert listed.data[0].documents == p and sum(read) < 1000, sum(read)
    assert listed.data[0].kind == DOCUMENTS_JOB
