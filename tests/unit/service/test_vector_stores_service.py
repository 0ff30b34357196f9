"""``VectorStoreService`` against its real stores (files, jobs, catalog, shards, MiniLM), with the
interleavings a runner polling on its own can produce: what a file's status says must be what its
index holds."""

from __future__ import annotations

import asyncio
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ragserve.config import Settings
from ragserve.service.limits import RequestLimits
from ragserve.service.pool import LocalShardPool
from ragserve.service.shard_service import ShardService, check_layout
from ragserve.service.wiring import Ingestion, build_documents, build_ingestion

TEXT = b"# Refunds\n\nA refund is paid back to the original card within 14 days of the return.\n"


@pytest.fixture
def ingestion(tmp_path: Path, embedding_model: Any) -> Iterator[Ingestion]:
    from ragserve.testing.embedder import InProcessEmbedder

    s = Settings(storage_dir=str(tmp_path), llm_engine="openai", llm_url="http://127.0.0.1:9/v1", num_shards=1)
    check_layout(s.storage_dir, s.num_shards)
    pool = LocalShardPool([ShardService(s.storage_dir, 0, 1)])
    docs = build_documents(
        s,
        pool=pool,
        embedder=InProcessEmbedder(embedding_model),
        embedding_model="all-MiniLM-L6-v2",
        embedding_tokenizer=embedding_model.tokenizer,
    )
    ing = build_ingestion(s, docs, RequestLimits.from_settings(s))
    try:
        yield ing
    finally:
        ing.close()
        pool.close()


def claims_in_the_window(ing: Ingestion, loop: asyncio.AbstractEventLoop) -> None:
    """Make the catalog's ``attach``/``create_store`` first do what a runner polling meanwhile does:
    claim every queued item and run it (a runner polls every second, and claims the next item as
    soon as another ends, so nothing orders its claim after the request's catalog write)."""
    catalog, jobs, handler = ing.vector_stores.catalog, ing.jobs.store, ing.vector_stores.index_file_item

    def claim_all() -> None:
        while (claimed := jobs.claim("racer", 60.0)) is not None:
            job, item = claimed
            result = asyncio.run_coroutine_threadsafe(handler(job, item), loop).result()
            jobs.complete_item(job.id, item.key, result, attempt=item.attempts)

    for name in ("attach", "create_store"):
        original = getattr(catalog, name)

        def racing(*args: Any, _original: Any = original) -> Any:
            claim_all()
            return _original(*args)

        setattr(catalog, name, racing)


async def test_a_file_the_runner_reaches_before_its_catalog_row_is_still_indexed(ingestion: Ingestion) -> None:
    from ragserve.api.vector_stores import CreateVectorStoreRequest

    vs = ingestion.vector_stores
    f = await ingestion.files.put("refunds.md", "assistants", io.BytesIO(TEXT))
    store = await vs.create(CreateVectorStoreRequest(name="race"))
    claims_in_the_window(ingestion, asyncio.get_running_loop())
    await vs.attach(store.id, f.id, None, None)
    created = await vs.create(CreateVectorStoreRequest(name="race-at-creation", file_ids=[f.id]))
    await ingestion.runner.start()  # type: ignore[union-attr]
    try:
        for store_id in (store.id, created.id):
            for _ in range(200):
                shown = await vs.get_file(store_id, f.id)
                if shown.status != "in_progress":
                    break
                await asyncio.sleep(0.05)
            indexed = 0
            if await vs.documents.index_exists(store_id):
                page = await vs.documents.list_documents(
                    store_id, limit=10, offset=0, max_text_length=0, metadata_filter={"file_id": f.id}
                )
                indexed = page.total_items
            # "completed" must mean indexed: the item may not run before the catalog names its job
            assert shown.status == "completed" and indexed > 0, (store_id, shown, indexed)
    finally:
        await ingestion.runner.stop()  # type: ignore[union-attr]


async def test_a_crash_between_the_catalog_and_the_job_shows_the_file_failed_not_in_progress(
    ingestion: Ingestion, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ragserve.api.vector_stores import CreateVectorStoreRequest

    vs = ingestion.vector_stores
    f = await ingestion.files.put("refunds.md", "assistants", io.BytesIO(TEXT))
    store = await vs.create(CreateVectorStoreRequest(name="crash"))

    def killed(*_: Any, **__: Any) -> Any:
        raise SystemExit("killed between the two writes")

    monkeypatch.setattr(ingestion.jobs.store, "create", killed)
    with pytest.raises(SystemExit):
        await vs.attach(store.id, f.id, None, None)
    shown = await vs.get_file(store.id, f.id)
    assert shown.status == "failed" and shown.last_error is not None  # the SDK's poll ends; attach it again


async def test_two_attaches_of_one_file_at_once_leave_the_newer_attributes(ingestion: Ingestion) -> None:
    """With two items running at once (``job_concurrency`` 2): an older attach of a file already
    reading it when a newer one, with other attributes, is made and claimed. The items of one file
    take turns, so the older never writes after the newer, nor deletes what the newer wrote: the
    index ends with the file's documents and the newer attributes."""
    from ragserve.api.vector_stores import CreateVectorStoreRequest

    vs = ingestion.vector_stores
    f = await ingestion.files.put("refunds.md", "assistants", io.BytesIO(TEXT))
    store = await vs.create(CreateVectorStoreRequest(name="twice"))
    entered, release = asyncio.Event(), asyncio.Event()
    read = ingestion.files.read

    async def paused_read(file_id: str) -> bytes:  # the older item is held inside its work
        if not entered.is_set():
            entered.set()
            await release.wait()
        return await read(file_id)

    vs.files.read = paused_read  # type: ignore[method-assign]
    jobs = ingestion.jobs.store
    await vs.attach(store.id, f.id, {"v": "old"}, None)
    older = jobs.claim("a", 60.0)
    assert older is not None
    first = asyncio.create_task(vs.index_file_item(*older))
    await entered.wait()
    await vs.attach(store.id, f.id, {"v": "new"}, None)
    newer = jobs.claim("b", 60.0)
    assert newer is not None
    second = asyncio.create_task(vs.index_file_item(*newer))
    await asyncio.wait([second], timeout=2)  # free to run to its end, unless it waits its turn
    release.set()
    for (job, item), result in zip((older, newer), await asyncio.gather(first, second), strict=True):
        jobs.complete_item(job.id, item.key, result, attempt=item.attempts)
    page = await vs.documents.list_documents(store.id, limit=10, offset=0, metadata_filter={"file_id": f.id})
    assert page.documents and {d.metadata["v"] for d in page.documents} == {"new"}
    shown = await vs.get_file(store.id, f.id)
    assert shown.status == "completed" and shown.attributes == {"v": "new"}


@pytest.mark.parametrize("order", ["asc", "desc"])
async def test_a_key_that_sees_some_stores_pages_them_alike_both_ways(ingestion: Ingestion, order: str) -> None:
    """``before`` over a list a key sees only part of (the hostile probe: pages out of order, items
    twice): walking back from the end gives the forward pages in reverse, each in list order; a
    cursor the key may not see is answered as one that names no store."""
    from ragserve.api.vector_stores import CreateVectorStoreRequest

    service = ingestion.vector_stores
    ids = [(await service.create(CreateVectorStoreRequest(name=f"s{i}"))).id for i in range(24)]
    hidden = {s for i, s in enumerate(ids) if i % 5 in (1, 2, 3)}  # most: a page needs several reads
    visible = lambda store_id: store_id not in hidden  # noqa: E731
    limit = 3

    forward: list[list[str]] = []
    after = None
    while True:
        page = await service.list_stores(limit, order, after, None, visible)
        forward.append([s.id for s in page.data])
        if not page.has_more:
            break
        after = page.last_id
    seen = [i for p in forward for i in p]
    listed = [i for i in (ids if order == "asc" else ids[::-1]) if i not in hidden]
    assert seen == listed

    backward: list[list[str]] = []
    before = None
    while True:  # start from the last page, as a client does after reading forwards to the end
        page = await service.list_stores(limit, order, None, before or seen[-1], visible)
        got = [s.id for s in page.data]
        backward.append(got)
        if not page.has_more:
            break
        before = page.first_id
    walked = [i for p in reversed(backward) for i in p]
    assert walked == seen[:-1], (walked, seen)
    assert all(len(p) == limit for p in backward[:-1])

    async def answers(cursor: str) -> list[Any]:
        return [
            (await service.list_stores(limit, order, cursor, None, visible)).model_dump(),
            (await service.list_stores(limit, order, None, cursor, visible)).model_dump(),
        ]

    for foreign in sorted(hidden)[:3]:
        assert await answers(foreign) == await answers("vs_" + "f" * 24)


async def test_a_store_s_file_jobs_run_in_the_turn_of_the_key_that_attached_them(ingestion: Ingestion) -> None:
    from ragserve.api.vector_stores import CreateFileBatchRequest, CreateVectorStoreRequest

    vs, jobs = ingestion.vector_stores, ingestion.jobs.store
    f = await ingestion.files.put("refunds.md", "assistants", io.BytesIO(TEXT))
    created = await vs.create(CreateVectorStoreRequest(name="a", file_ids=[f.id]), owner="team-a")
    other = await vs.create(CreateVectorStoreRequest(name="b"), owner="team-b")
    await vs.attach(other.id, f.id, None, None, owner="team-b")
    await vs.update_file(other.id, f.id, {"v": 2}, owner="team-c")
    await vs.create_batch(created.id, CreateFileBatchRequest(file_ids=[f.id]), owner="team-d")
    owners = [j.owner for j in reversed(jobs.list_jobs(limit=10).data)]
    assert owners == ["team-a", "team-b", "team-c", "team-d"]


# --- removals (a hostile consistency review, 2026-11-29) -----------------------------------------
async def indexed(vs: Any, store_id: str, file_id: str | None = None) -> int:
    if not await vs.documents.index_exists(store_id):
        return 0
    where = {"file_id": file_id} if file_id else None
    page = await vs.documents.list_documents(store_id, limit=10, offset=0, max_text_length=0, metadata_filter=where)
    return int(page.total_items)


async def run_queued(ing: Ingestion) -> None:
    """Claim and run every queued item here, as the runner would."""
    jobs = ing.jobs.store
    while (claimed := jobs.claim("here", 60.0)) is not None:
        job, item = claimed
        try:
            result = await ing.vector_stores.index_file_item(job, item)
        except Exception as e:
            jobs.fail_item(job.id, item.key, {"code": "failed", "message": str(e)}, attempt=item.attempts)
        else:
            jobs.complete_item(job.id, item.key, result, attempt=item.attempts)


@pytest.mark.parametrize("what", ["detach", "file deleted", "store deleted"])
async def test_a_crash_between_forgetting_and_removing_is_finished_at_the_next_start(
    ingestion: Ingestion, monkeypatch: pytest.MonkeyPatch, what: str
) -> None:
    """The catalog forgets the file (or the store) and records the removal in one transaction; a
    crash before the documents go leaves the removal recorded, and the next start does it (before,
    the text stayed searchable for good and no retry could reach it)."""
    from ragserve.api.vector_stores import CreateVectorStoreRequest

    vs = ingestion.vector_stores
    f = await ingestion.files.put("refunds.md", "assistants", io.BytesIO(TEXT))
    store = await vs.create(CreateVectorStoreRequest(name="crash", file_ids=[f.id]))
    await run_queued(ingestion)
    assert await indexed(vs, store.id, f.id) > 0

    async def killed(*_: Any, **__: Any) -> Any:
        raise SystemExit("killed between the two writes")

    monkeypatch.setattr(vs.documents, "delete_documents", killed)
    monkeypatch.setattr(vs.documents, "drop_index", killed)
    with pytest.raises(SystemExit):
        if what == "detach":
            await vs.detach(store.id, f.id)
        elif what == "file deleted":
            await vs.file_deleted(f.id)
        else:
            await vs.delete(store.id)
    monkeypatch.undo()
    assert await indexed(vs, store.id) > 0 and len(vs.catalog.pending_removals()) == 1
    assert await vs.resume_removals() == 1  # what the next start does first
    assert await indexed(vs, store.id) == 0 and vs.catalog.pending_removals() == []
    if what == "store deleted":
        assert not await vs.documents.index_exists(store.id)


async def test_a_detach_does_not_remove_what_a_newer_attach_indexed_meanwhile(ingestion: Ingestion) -> None:
    """Detach, then attach again at once, the new item running before the detach's removal: the
    file stays indexed (the removal had deleted the new documents: ``completed`` with nothing)."""
    from ragserve.api.vector_stores import CreateVectorStoreRequest

    vs = ingestion.vector_stores
    f = await ingestion.files.put("refunds.md", "assistants", io.BytesIO(TEXT))
    store = await vs.create(CreateVectorStoreRequest(name="again", file_ids=[f.id]))
    await run_queued(ingestion)
    remove = vs._remove

    async def late_removal(removal: Any) -> None:  # the attach and its item land first
        await vs.attach(store.id, f.id, {"v": "new"}, None)
        await run_queued(ingestion)
        await remove(removal)

    vs._remove = late_removal  # type: ignore[method-assign]
    await vs.detach(store.id, f.id)
    shown = await vs.get_file(store.id, f.id)
    assert shown.status == "completed" and await indexed(vs, store.id, f.id) > 0


async def test_a_detach_while_the_file_is_indexed_does_not_wait_and_leaves_nothing(ingestion: Ingestion) -> None:
    from ragserve.api.vector_stores import CreateVectorStoreRequest

    vs = ingestion.vector_stores
    f = await ingestion.files.put("refunds.md", "assistants", io.BytesIO(TEXT))
    store = await vs.create(CreateVectorStoreRequest(name="busy", file_ids=[f.id]))
    entered, release = asyncio.Event(), asyncio.Event()
    read = vs.files.read

    async def paused_read(file_id: str) -> bytes:
        entered.set()
        await release.wait()
        return await read(file_id)

    vs.files.read = paused_read  # type: ignore[method-assign]
    running = asyncio.create_task(run_queued(ingestion))
    await asyncio.wait_for(entered.wait(), timeout=30)
    await asyncio.wait_for(vs.detach(store.id, f.id), timeout=5)  # answered while the item runs
    assert len(vs.catalog.pending_removals()) == 1
    release.set()
    await running
    for _ in range(100):
        if not vs.catalog.pending_removals():
            break
        await asyncio.sleep(0.02)
    assert vs.catalog.pending_removals() == [] and await indexed(vs, store.id, f.id) == 0


async def test_a_file_deleted_while_an_attach_reads_it_leaves_no_text(ingestion: Ingestion) -> None:
    """DELETE /v1/files lands between an attach's check of the file and its item's write: the item
    finds the File gone after writing, removes what it wrote and fails (the text of a deleted file
    stayed searchable, the store file ``completed``)."""
    from ragserve.api.vector_stores import CreateVectorStoreRequest

    vs = ingestion.vector_stores
    f = await ingestion.files.put("refunds.md", "assistants", io.BytesIO(TEXT))
    store = await vs.create(CreateVectorStoreRequest(name="gone"))
    read = vs.files.read

    async def read_then_deleted(file_id: str) -> bytes:  # the delete runs right after the read
        data = await read(file_id)
        await ingestion.files.delete(file_id)
        return data

    stores_of_file = vs.catalog.stores_of_file
    vs.catalog.stores_of_file = lambda file_id: []  # type: ignore[method-assign]  # the attach's row lands after the sweep
    vs.files.read = read_then_deleted  # type: ignore[method-assign]
    await vs.attach(store.id, f.id, None, None)
    await run_queued(ingestion)
    vs.catalog.stores_of_file = stores_of_file  # type: ignore[method-assign]
    shown = await vs.get_file(store.id, f.id)
    assert shown.status == "failed" and "deleted" in (shown.last_error.message if shown.last_error else "")
    assert await indexed(vs, store.id, f.id) == 0


async def test_a_store_deleted_while_its_item_writes_keeps_no_index(
    ingestion: Ingestion, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store is deleted while its item embeds; the item's write makes the index again, and the
    item is cancelled before its own check: the clean-up still runs (an index of a deleted store was
    left for good)."""
    from ragserve.api.vector_stores import CreateVectorStoreRequest

    vs = ingestion.vector_stores
    f = await ingestion.files.put("refunds.md", "assistants", io.BytesIO(TEXT))
    store = await vs.create(CreateVectorStoreRequest(name="dropped", file_ids=[f.id]))
    add = vs.documents.add_documents
    written = asyncio.Event()

    async def add_then_hang(*args: Any, **kwargs: Any) -> Any:
        if not written.is_set():
            await vs.delete(store.id)  # the store goes while the item is writing
            out = await add(*args, **kwargs)  # ... and the write makes its index again
            written.set()
            await asyncio.sleep(3600)  # cancelled here, as the runner's watcher cancels it
            return out
        return await add(*args, **kwargs)

    monkeypatch.setattr(vs.documents, "add_documents", add_then_hang)
    claimed = ingestion.jobs.store.claim("here", 60.0)
    assert claimed is not None
    item = asyncio.create_task(vs.index_file_item(*claimed))
    await asyncio.wait_for(written.wait(), timeout=30)
    assert await vs.documents.index_exists(store.id)
    item.cancel()
    with pytest.raises(asyncio.CancelledError):
        await item
    for _ in range(100):
        if not await vs.documents.index_exists(store.id):
            break
        await asyncio.sleep(0.02)
    assert not await vs.documents.index_exists(store.id)
