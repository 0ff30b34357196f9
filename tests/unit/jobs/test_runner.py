"""JobRunner: the concurrency bound, outcomes per item, cancellation between items, lease renewal,
a graceful stop that leaves cut-off items to run again, and job-end webhooks off the ingestion path."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from ragserve import tracing
from ragserve.errors import BadRequestError, ServiceError
from ragserve.jobs.runner import INTERNAL_MESSAGE, JobRunner
from ragserve.jobs.store import Job, JobCounts, JobItem, JobStore
from ragserve.jobs.webhook import WebhookNotifier
from tests.unit.jobs.polling import eventually

SECRET = "whsec_" + base64.b64encode(b"runner test key").decode()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[JobStore]:
    with JobStore(tmp_path / "jobs.sqlite") as s:
        yield s


def keys(n: int, prefix: str = "f") -> list[tuple[str, dict[str, Any]]]:
    return [(f"{prefix}{i}", {"i": i}) for i in range(n)]


async def echo(job: Job, item: JobItem) -> Mapping[str, Any]:
    return {"key": item.key, "kind": job.kind}


async def test_items_run_at_most_concurrency_at_a_time_and_counts_are_exact(store: JobStore) -> None:
    in_flight = peak = 0
    done: list[str] = []

    async def handler(job: Job, item: JobItem) -> Mapping[str, Any]:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.02)
        in_flight -= 1
        done.append(item.key)
        return {"i": item.payload["i"]}

    job = store.create("index_documents", "docs", keys(12))
    runner = JobRunner(store, handler, concurrency=3, poll_s=0.05)
    await runner.start()
    try:
        ended = await runner.wait(job.id, timeout_s=5)
    finally:
        await runner.stop()
    assert peak == 3
    assert sorted(done) == sorted(k for k, _ in keys(12))
    assert ended.status == "completed" and ended.counts == JobCounts(0, 0, 12, 0, 0, 12)
    assert [i.result for i in store.list_items(job.id).data] == [{"i": i} for i in range(12)]
    assert store.check_counts() == []


class NoSuchFile(ServiceError):
    status = 404


async def test_each_failure_is_recorded_on_its_item_and_the_job_still_completes(store: JobStore) -> None:
    async def handler(job: Job, item: JobItem) -> Any:
        if item.key == "coded":
            raise BadRequestError("the file is not UTF-8", code="unreadable_file")
        if item.key == "uncoded":
            raise NoSuchFile("file-9 does not exist \udcff")
        if item.key == "crash":
            raise RuntimeError("secret internal detail /srv/keys")
        if item.key == "nan":
            return {"score": float("nan")}
        if item.key == "list":
            return ["not", "a", "dict"]
        return {"ok": True}

    job = store.create("index_documents", "docs", [(k, {}) for k in ("coded", "uncoded", "crash", "nan", "list", "ok")])
    runner = JobRunner(store, handler, concurrency=2, poll_s=0.05)
    await runner.start()
    try:
        ended = await runner.wait(job.id, timeout_s=5)
    finally:
        await runner.stop()
    errors = {i.key: i.error for i in store.list_items(job.id).data}
    assert errors["coded"] == {"code": "unreadable_file", "message": "the file is not UTF-8"}
    assert errors["uncoded"] == {"code": "NoSuchFile", "message": "file-9 does not exist ?"}
    assert errors["crash"] == {"code": "internal_error", "message": INTERNAL_MESSAGE}
    assert errors["nan"] is not None and errors["nan"]["code"] == "invalid_result"
    assert errors["list"] is not None and errors["list"]["code"] == "invalid_result"
    assert errors["ok"] is None
    assert ended.status == "completed" and ended.counts == JobCounts(0, 0, 1, 5, 0, 6)
    assert all(i.attempts == 1 for i in store.list_items(job.id).data)  # a handler's error is not retried


async def test_a_job_whose_every_item_fails_is_failed(store: JobStore) -> None:
    async def handler(job: Job, item: JobItem) -> Mapping[str, Any]:
        raise BadRequestError(f"{item.key} is empty")

    job = store.create("index_documents", "docs", keys(2))
    runner = JobRunner(store, handler, poll_s=0.05)
    await runner.start()
    try:
        ended = await runner.wait(job.id, timeout_s=5)
    finally:
        await runner.stop()
    assert ended.status == "failed" and ended.error == "every item failed; the first: f0 is empty"


async def test_cancelling_stops_the_running_item_and_starts_nothing_else(store: JobStore) -> None:
    """An item can be hours of work (a file of hundreds of megabytes): a cancelled job stops it
    within ``CHECK_S``, not when it would have finished, and frees the runner for other jobs."""
    started = asyncio.Event()
    stopped = asyncio.Event()
    ran: list[str] = []

    async def handler(job: Job, item: JobItem) -> Mapping[str, Any]:
        ran.append(item.key)
        if job.index == "other":
            return {"indexed": item.key}
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            stopped.set()
            raise
        return {"indexed": item.key}

    job = store.create("index_documents", "docs", keys(5), webhook=True)
    other = store.create("index_documents", "other", keys(1, "o"))
    runner = JobRunner(store, handler, poll_s=0.05)  # one item at a time
    await runner.start()
    try:
        await asyncio.wait_for(started.wait(), 5)
        t0 = time.monotonic()
        assert (await asyncio.to_thread(store.cancel, job.id)).status == "cancelled"
        runner.wake()
        ended = await runner.wait(job.id, timeout_s=5)
        assert stopped.is_set() and time.monotonic() - t0 < 3
        assert (await runner.wait(other.id, timeout_s=5)).status == "completed"  # the runner is free again
        await asyncio.sleep(0.1)  # time to (wrongly) start another item of the cancelled job
    finally:
        await runner.stop()
    assert ran == ["f0", "o0"]
    assert ended.status == "cancelled" and ended.counts == JobCounts(0, 0, 0, 0, 5, 5)
    assert store.get_item(job.id, "f0").status == "cancelled" and store.get_item(job.id, "f0").result is None
    assert [d.type for d in store.list_deliveries(job.id)] == ["job.cancelled"]


async def test_a_job_failed_while_its_item_runs_stops_the_item(store: JobStore) -> None:
    started: list[str] = []

    async def handler(job: Job, item: JobItem) -> Mapping[str, Any]:
        started.append(job.id)
        await asyncio.sleep(3600)
        return {}

    failed = store.create("index_documents", "docs", keys(2))
    runner = JobRunner(store, handler, poll_s=0.05)
    await runner.start()
    try:
        await eventually(lambda: started == [failed.id])
        await asyncio.to_thread(store.fail_job, failed.id, "its index was deleted")
        ended = await runner.wait(failed.id, timeout_s=5)
        assert ended.status == "failed" and ended.counts.cancelled == 2
        # the store hears of the cancelled item before its task has ended: the slot frees just after
        await eventually(lambda: runner.in_flight == 0, timeout_s=1.0)
    finally:
        await runner.stop()


async def test_a_slow_item_keeps_its_lease(store: JobStore) -> None:
    async def handler(job: Job, item: JobItem) -> Mapping[str, Any]:
        await asyncio.sleep(0.6)
        return {}

    job = store.create("index_documents", "docs", keys(1))
    runner = JobRunner(store, handler, lease_s=0.3, poll_s=0.05)
    await runner.start()
    try:
        taken_back = 0
        while not (await asyncio.to_thread(store.get, job.id)).done:
            taken_back += await asyncio.to_thread(store.recover)  # what a peer would do with an expired lease
            await asyncio.sleep(0.05)
    finally:
        await runner.stop()
    assert taken_back == 0
    assert store.get_item(job.id, "f0").attempts == 1 and store.get(job.id).status == "completed"


async def test_stop_cuts_off_a_stuck_item_and_the_next_start_runs_it_again(store: JobStore) -> None:
    attempts: list[int] = []

    async def stuck(job: Job, item: JobItem) -> Mapping[str, Any]:
        attempts.append(item.attempts)
        await asyncio.sleep(60)
        return {}

    job = store.create("index_documents", "docs", keys(1))
    first = JobRunner(store, stuck, poll_s=0.05)
    await first.start()
    while not attempts:
        await asyncio.sleep(0.01)
    began = time.monotonic()
    await first.stop(timeout_s=0.1)
    assert time.monotonic() - began < 1
    assert store.get_item(job.id, "f0").status == "in_progress"

    second = JobRunner(store, echo, poll_s=0.05)
    await second.start()
    try:
        ended = await second.wait(job.id, timeout_s=5)
    finally:
        await second.stop()
    assert ended.status == "completed" and store.get_item(job.id, "f0").attempts == 2


async def test_wake_starts_a_new_job_without_waiting_for_the_poll(store: JobStore) -> None:
    runner = JobRunner(store, echo, poll_s=30)
    await runner.start()
    try:
        await asyncio.sleep(0.05)  # the loop is now waiting out its poll
        job = await asyncio.to_thread(store.create, "index_documents", "docs", keys(2))
        runner.wake()
        ended = await runner.wait(job.id, timeout_s=2, poll_s=0.01)
    finally:
        await runner.stop()
    assert ended.status == "completed"


async def test_a_hung_webhook_endpoint_does_not_hold_up_jobs_and_is_notified_later(store: JobStore) -> None:
    release = asyncio.Event()
    received: list[httpx.Request] = []

    async def endpoint(request: httpx.Request) -> httpx.Response:
        received.append(request)
        await release.wait()  # hung until the test lets it answer
        return httpx.Response(200)

    async with httpx.AsyncClient(transport=httpx.MockTransport(endpoint)) as client:
        notifier = WebhookNotifier(store, "https://hooks.test/x", SECRET, client=client, timeout_s=30, poll_s=0.05)
        runner = JobRunner(store, echo, poll_s=0.05, notifier=notifier)
        await runner.start()
        try:
            first = await asyncio.to_thread(store.create, "index_documents", "docs", keys(3), None, True)
            runner.wake()
            assert (await runner.wait(first.id, timeout_s=5)).status == "completed"
            await eventually(lambda: len(received) == 1)  # its webhook is now stuck in the endpoint
            second = await asyncio.to_thread(store.create, "index_documents", "docs", keys(2), None, True)
            runner.wake()
            assert (await runner.wait(second.id, timeout_s=5)).status == "completed"  # not held up
            assert [d.status for d in store.list_deliveries()] == ["pending", "pending"]
            release.set()
            await eventually(lambda: {d.status for d in store.list_deliveries()} == {"delivered"})
        finally:
            await runner.stop()
    deliveries = store.list_deliveries()
    assert [d.job_id for d in deliveries] == [first.id, second.id]
    assert [d.attempts for d in deliveries] == [1, 1]
    hooks = openai.OpenAI(api_key="unused", webhook_secret=SECRET).webhooks
    assert [hooks.unwrap(r.content, r.headers).id for r in received] == [d.id for d in deliveries]


async def test_a_webhook_attempt_is_cut_off_after_timeout_s_and_retried(store: JobStore) -> None:
    calls = 0

    async def endpoint(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        if calls == 1:
            await asyncio.sleep(30)  # trickles past the deadline
        return httpx.Response(200)

    async with httpx.AsyncClient(transport=httpx.MockTransport(endpoint)) as client:
        notifier = WebhookNotifier(
            store, "https://hooks.test/x", SECRET, client=client, timeout_s=0.1, base_delay_s=0.01, poll_s=0.05
        )
        runner = JobRunner(store, echo, poll_s=0.05, notifier=notifier)
        await runner.start()
        try:
            job = await asyncio.to_thread(store.create, "index_documents", "docs", keys(1), None, True)
            runner.wake()
            await eventually(lambda: [d.status for d in store.list_deliveries(job.id)] == ["delivered"])
        finally:
            await runner.stop()
    [delivery] = store.list_deliveries(job.id)
    assert delivery.attempts == 2 and calls == 2


async def test_start_takes_back_an_item_a_dead_process_left_running(store: JobStore) -> None:
    job = store.create("index_documents", "docs", keys(2))
    assert store.claim("dead-process", lease_s=3600) is not None  # a live-looking lease, but its owner is gone
    runner = JobRunner(store, echo, poll_s=0.05)
    await runner.start()
    try:
        ended = await runner.wait(job.id, timeout_s=5)
    finally:
        await runner.stop()
    assert ended.counts == JobCounts(0, 0, 2, 0, 0, 2)
    assert store.get_item(job.id, "f0").attempts == 2 and store.get_item(job.id, "f1").attempts == 1


def test_a_runner_refuses_nonsense_settings(store: JobStore) -> None:
    for kwargs in ({"concurrency": 0}, {"lease_s": 0}, {"poll_s": -1}, {"max_attempts": 0}):
        with pytest.raises(ValueError):
            JobRunner(store, echo, **kwargs)  # type: ignore[arg-type]


async def test_each_item_run_is_a_trace_of_its_own(store: JobStore) -> None:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    async def handler(job: Job, item: JobItem) -> Mapping[str, Any]:
        with tracing.span("inner"):
            if item.key == "f1":
                raise NoSuchFile("no such file")
        return {}

    exporter = InMemorySpanExporter()
    tracing.configure("ingestion", exporter)
    try:
        job = store.create("index_documents", "docs", keys(2))
        runner = JobRunner(store, handler, poll_s=0.05)
        await runner.start()
        try:
            await runner.wait(job.id, timeout_s=5)
        finally:
            await runner.stop()
    finally:
        tracing.shutdown()
    spans = exporter.get_finished_spans()
    items = [s for s in spans if s.name == "job.item"]
    assert len(items) == 2 and all(s.parent is None for s in items)
    assert len({s.context.trace_id for s in items}) == 2
    assert {s.attributes["ragserve.job_id"] for s in items} == {job.id}
    assert {s.attributes["ragserve.index"] for s in items} == {("docs",)}
    failed = next(s for s in items if s.attributes["ragserve.job_item"] == 1)
    assert not failed.status.is_ok
    inner = [s for s in spans if s.name == "inner"]
    assert {s.parent.span_id for s in inner} == {s.context.span_id for s in items}
