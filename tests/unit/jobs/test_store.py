"""JobStore: acceptance is all-or-nothing, counts are exact, the status rules hold, recovery takes back
what a dead worker left running, and a webhook delivery is enqueued exactly when a job ends."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from ragserve.errors import BadRequestError, ConflictError, NotFoundError
from ragserve.jobs.store import INTERRUPTED, MAX_PAGE, JobCounts, JobStore


@pytest.fixture
def store(tmp_path: Path) -> Iterator[JobStore]:
    with JobStore(tmp_path / "jobs.sqlite") as s:
        yield s


def items(*keys: str) -> list[tuple[str, dict[str, object]]]:
    return [(k, {"file": f"{k}.txt"}) for k in keys]


def run_all(store: JobStore, fail: set[str] = frozenset()) -> None:
    """Claim and finish every queued item, failing those whose key is in ``fail``."""
    while (claimed := store.claim("t", 60)) is not None:
        job, item = claimed
        if item.key in fail:
            store.fail_item(job.id, item.key, {"code": "bad_file", "message": f"{item.key} is unreadable"})
        else:
            store.complete_item(job.id, item.key, {"chunks": len(item.key)})


def test_create_stores_the_job_and_its_items_in_order(store: JobStore) -> None:
    job = store.create("index_documents", "docs", items("b", "a", "c"), meta={"source": "cli"}, webhook=True)
    assert job.id.startswith("job_") and job.status == "queued" and not job.done
    assert (job.kind, job.index, job.meta, job.webhook) == ("index_documents", "docs", {"source": "cli"}, True)
    assert job.error is None
    assert job.counts == JobCounts(queued=3, in_progress=0, completed=0, failed=0, cancelled=0, total=3)
    assert job.started_at is None and job.finished_at is None and job.created_at > 0
    page = store.list_items(job.id)
    assert [(i.seq, i.key, i.payload, i.status, i.attempts) for i in page.data] == [
        (0, "b", {"file": "b.txt"}, "queued", 0),
        (1, "a", {"file": "a.txt"}, "queued", 0),
        (2, "c", {"file": "c.txt"}, "queued", 0),
    ]
    assert store.get(job.id) == job
    assert store.get_item(job.id, "a").seq == 1


def test_a_job_survives_reopening_the_file(tmp_path: Path) -> None:
    with JobStore(tmp_path / "j.sqlite") as first:
        job = first.create("index_documents", "docs", items("a"))
    with JobStore(tmp_path / "j.sqlite") as second:
        assert second.get(job.id) == job


@pytest.mark.parametrize(
    ("bad_items", "meta", "says"),
    [
        (items("a", "b", "a"), None, "repeated: 'a'"),
        ([("a", {"x": math.nan})], None, "NaN"),
        ([("a", {"x": [1.0, -math.inf]})], None, "Infinity"),
        ([("a", {"x": "bad \ud800 text"})], None, "lone surrogate"),
        ([("a\udfff", {})], None, "lone surrogate"),
        ([("", {})], None, "non-empty"),
        ([("a", {"x": b"bytes"})], None, "not JSON serializable"),
        ([("a", ["not", "an", "object"])], None, "must be an object"),
        ([("a",)], None, "(key, payload) pair"),
        (items("a"), {"score": math.nan}, "meta cannot be stored"),
        (items("a"), ["x"], "meta must be an object"),
    ],
)
def test_create_refuses_what_cannot_be_stored_and_stores_nothing(
    store: JobStore, bad_items: list, meta: object, says: str
) -> None:
    good_then_bad = [("first", {"ok": True}), *bad_items]
    with pytest.raises(BadRequestError) as e:
        store.create("index_documents", "docs", good_then_bad, meta=meta)  # type: ignore[arg-type]
    assert says in e.value.message and e.value.status == 400
    assert store.list_jobs().data == ()


def test_a_job_without_items_is_completed_at_once(store: JobStore) -> None:
    job = store.create("index_documents", "docs", [], webhook=True)
    assert job.status == "completed" and job.done and job.counts.total == 0
    assert [d.type for d in store.list_deliveries(job.id)] == ["job.completed"]


def test_list_jobs_pages_newest_first_and_filters(store: JobStore) -> None:
    ids = [store.create("index_documents", "a" if n % 2 else "b", items("k")).id for n in range(5)]
    newest_first = ids[::-1]
    first = store.list_jobs(limit=2)
    assert [j.id for j in first.data] == newest_first[:2] and first.has_more
    second = store.list_jobs(limit=2, after=first.data[-1].id)
    assert [j.id for j in second.data] == newest_first[2:4] and second.has_more
    last = store.list_jobs(limit=2, after=second.data[-1].id)
    assert [j.id for j in last.data] == newest_first[4:] and not last.has_more
    assert [j.id for j in store.list_jobs(index="a").data] == [i for n, i in enumerate(ids) if n % 2][::-1]
    store.cancel(ids[0])
    assert [j.id for j in store.list_jobs(status="cancelled").data] == [ids[0]]
    assert [j.id for j in store.list_jobs(index="b", status="queued").data] == [ids[4], ids[2]]
    with pytest.raises(BadRequestError, match="after"):
        store.list_jobs(after="job_unknown")
    with pytest.raises(BadRequestError, match="limit"):
        store.list_jobs(limit=MAX_PAGE + 1)
    with pytest.raises(BadRequestError, match="status"):
        store.list_jobs(status="done")


def test_list_items_pages_in_order_and_filters_by_status(store: JobStore) -> None:
    job = store.create("index_documents", "docs", items(*"abcde"))
    page = store.list_items(job.id, limit=2, after="b")
    assert [i.key for i in page.data] == ["c", "d"] and page.has_more
    run_all(store, fail={"b", "d"})
    assert [i.key for i in store.list_items(job.id, status="failed").data] == ["b", "d"]
    assert store.list_items(job.id, status="failed").data[0].error == {"code": "bad_file", "message": "b is unreadable"}
    assert store.list_items(job.id, status="completed").data[0].result == {"chunks": 1}
    with pytest.raises(NotFoundError):
        store.list_items("job_missing")
    with pytest.raises(BadRequestError, match="after"):
        store.list_items(job.id, after="zz")


def test_claims_go_oldest_job_first_and_in_item_order(store: JobStore) -> None:
    first = store.create("index_documents", "docs", items("a2", "a1"))
    second = store.create("index_documents", "docs", items("b1"))
    claimed = [store.claim("w", 60) for _ in range(4)]
    assert [(j.id, i.key, i.attempts, i.status) for j, i in claimed[:3]] == [  # type: ignore[misc]
        (first.id, "a2", 1, "in_progress"),
        (first.id, "a1", 1, "in_progress"),
        (second.id, "b1", 1, "in_progress"),
    ]
    assert claimed[3] is None
    job = store.get(first.id)
    assert job.status == "in_progress" and job.started_at is not None
    assert job.counts == JobCounts(queued=0, in_progress=2, completed=0, failed=0, cancelled=0, total=2)


def test_owners_take_the_runner_in_turns_and_each_owner_is_first_in_first_out(store: JobStore) -> None:
    """One key's large job delays another key's job by one item a turn, not by the whole queue."""
    bulk1 = store.create("index_documents", "docs", items("x1", "x2", "x3", "x4"), owner="bulk")
    bulk2 = store.create("index_documents", "docs", items("y1"), owner="bulk")
    small = store.create("index_documents", "docs", items("s1", "s2"), owner="small")
    late = store.create("index_documents", "docs", items("l1"), owner="late")
    order = []
    while (claimed := store.claim("w", 60)) is not None:
        job, item = claimed
        order.append((job.owner, item.key))
        store.complete_item(job.id, item.key, {})
    assert order == [
        ("bulk", "x1"),
        ("late", "l1"),  # never served: before "small" by name, both before "bulk" again
        ("small", "s1"),
        ("bulk", "x2"),
        ("small", "s2"),
        ("bulk", "x3"),
        ("bulk", "x4"),
        ("bulk", "y1"),  # within an owner, the older job first
    ]
    assert [store.get(j.id).owner for j in (bulk1, bulk2, small, late)] == ["bulk", "bulk", "small", "late"]
    # an owner that comes back after the others were served goes first again
    store.create("index_documents", "docs", items("b9"), owner="bulk")
    store.create("index_documents", "docs", items("s9"), owner="small")
    first = store.claim("w", 60)
    assert first is not None and first[0].owner == "small"  # "bulk" was served last


def test_finding_whose_turn_it_is_seeks_the_owner_index_not_every_job(store: JobStore) -> None:
    """One seek an owner with runnable jobs, whatever their number (a DISTINCT read every queued job:
    ~80 ms a claim with 100,000 queued)."""
    from ragserve.jobs.store import _NEXT_OWNER

    plan = " | ".join(row[3] for row in store._db.execute("EXPLAIN QUERY PLAN " + _NEXT_OWNER))
    assert "USING INDEX jobs_runnable_by_owner" in plan and "DISTINCT" not in plan and "SCAN jobs" not in plan, plan


def test_jobs_of_one_owner_or_none_run_first_in_first_out(store: JobStore) -> None:
    jobs = [store.create("index_documents", "docs", items(f"k{i}")) for i in range(3)]
    claimed = [store.claim("w", 60) for _ in jobs]
    assert [c[0].id for c in claimed if c] == [j.id for j in jobs] and jobs[0].owner == ""


def test_an_owner_must_be_text(store: JobStore) -> None:
    with pytest.raises(BadRequestError, match="owner"):
        store.create("index_documents", "docs", items("a"), owner="\ud800")
    assert store.list_jobs().data == ()


def test_a_file_made_before_owners_is_given_the_column_and_its_jobs_run(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "old.sqlite"
    with JobStore(path) as s:
        old = s.create("index_documents", "docs", items("a", "b"))
    db = sqlite3.connect(path)  # as a store of the last release left it: no owner, no turns
    db.execute("DROP INDEX jobs_runnable_by_owner")
    db.execute("DROP TABLE job_owners")
    db.execute("ALTER TABLE jobs DROP COLUMN owner")
    db.commit()
    db.close()
    with JobStore(path) as s:
        assert s.get(old.id).owner == ""
        s.create("index_documents", "docs", items("c"), owner="team")
        run_all(s)
        assert s.get(old.id).status == "completed" and s.check_counts() == []


@pytest.mark.parametrize(
    ("fail", "status", "error"),
    [
        (set(), "completed", None),
        ({"b"}, "completed", None),  # like an OpenAI file batch: some failed files, the batch completed
        ({"a", "b", "c"}, "failed", "every item failed; the first: a is unreadable"),
    ],
)
def test_a_job_ends_completed_unless_every_item_failed(
    store: JobStore, fail: set[str], status: str, error: str | None
) -> None:
    job = store.create("index_documents", "docs", items("a", "b", "c"))
    run_all(store, fail=fail)
    ended = store.get(job.id)
    assert (ended.status, ended.error, ended.done) == (status, error, True)
    assert ended.counts == JobCounts(0, 0, 3 - len(fail), len(fail), 0, 3)
    assert store.list_deliveries() == []  # webhook=False: nothing to deliver


def test_an_outcome_is_recorded_once_and_only_under_its_claim(store: JobStore) -> None:
    job = store.create("index_documents", "docs", items("a", "b"))
    _, item = store.claim("w", 60)  # type: ignore[misc]
    store.complete_item(job.id, "a", {"n": 1}, attempt=item.attempts)
    with pytest.raises(ConflictError):
        store.complete_item(job.id, "a", {"n": 2})
    with pytest.raises(ConflictError):
        store.fail_item(job.id, "b", {"code": "x", "message": "not claimed yet"})
    store.claim("w", 60)
    store.recover(expired_only=False)  # the worker died; b is queued again
    _, again = store.claim("w2", 60)  # type: ignore[misc]
    assert again.key == "b" and again.attempts == 2
    with pytest.raises(ConflictError):  # the first worker's late outcome is refused
        store.complete_item(job.id, "b", {"n": 1}, attempt=1)
    store.complete_item(job.id, "b", {"n": 2}, attempt=2)
    assert store.get_item(job.id, "a").result == {"n": 1} and store.get_item(job.id, "b").result == {"n": 2}
    with pytest.raises(NotFoundError):
        store.complete_item(job.id, "zz", {})
    other = store.create("index_documents", "docs", items("c"))
    store.claim("w", 60)
    with pytest.raises(BadRequestError, match="NaN"):
        store.complete_item(other.id, "c", {"x": math.nan})
    assert store.get_item(other.id, "c").status == "in_progress"  # nothing recorded


def test_fail_item_takes_only_a_code_and_a_message(store: JobStore) -> None:
    job = store.create("index_documents", "docs", items("a"))
    store.claim("w", 60)
    for bad in ({"code": "x"}, {"code": "", "message": "m"}, {"code": "x", "message": "m", "extra": 1}):
        with pytest.raises(BadRequestError):
            store.fail_item(job.id, "a", bad)
    assert store.get_item(job.id, "a").status == "in_progress"


def test_cancel_stops_queued_items_and_ends_when_the_running_one_does(store: JobStore) -> None:
    job = store.create("index_documents", "docs", items("a", "b", "c"), webhook=True)
    _, running = store.claim("w", 60)  # type: ignore[misc]
    cancelled = store.cancel(job.id)
    assert cancelled.status == "cancelled" and not cancelled.done
    assert cancelled.counts == JobCounts(queued=0, in_progress=1, completed=0, failed=0, cancelled=2, total=3)
    assert store.claim("w", 60) is None  # nothing else starts
    assert store.list_deliveries(job.id) == []  # not ended yet
    ended = store.complete_item(job.id, running.key, {"indexed": True}, attempt=running.attempts)
    assert ended.status == "cancelled" and ended.done
    assert ended.counts == JobCounts(queued=0, in_progress=0, completed=1, failed=0, cancelled=2, total=3)
    assert store.get_item(job.id, "a").result == {"indexed": True}  # a finished item's result is kept
    [delivery] = store.list_deliveries(job.id)
    assert delivery.type == "job.cancelled" and delivery.data["counts"]["cancelled"] == 2
    assert store.cancel(job.id) == ended  # a no-op on an ended job
    assert len(store.list_deliveries(job.id)) == 1


def test_cancelling_an_ended_job_changes_nothing(store: JobStore) -> None:
    job = store.create("index_documents", "docs", items("a"))
    run_all(store)
    assert store.cancel(job.id) == store.get(job.id)
    assert store.get(job.id).status == "completed"
    with pytest.raises(NotFoundError):
        store.cancel("job_missing")


def test_fail_job_is_a_job_level_error(store: JobStore) -> None:
    job = store.create("index_documents", "docs", items("a", "b"), webhook=True)
    failed = store.fail_job(job.id, "index docs was deleted")
    assert (failed.status, failed.error, failed.done) == ("failed", "index docs was deleted", True)
    assert failed.counts.cancelled == 2
    assert [d.type for d in store.list_deliveries(job.id)] == ["job.failed"]


def test_recover_requeues_until_max_attempts_then_fails_as_interrupted(store: JobStore) -> None:
    job = store.create("index_documents", "docs", items("a"))
    for attempt in (1, 2):
        _, item = store.claim("w", 60)  # type: ignore[misc]
        assert item.attempts == attempt
        assert store.recover(expired_only=True) == 0  # the lease is live
        assert store.recover(expired_only=False, max_attempts=3) == 1
        assert store.get_item(job.id, "a").status == "queued"
    store.claim("w", 60)
    store.recover(expired_only=False, max_attempts=3)
    item = store.get_item(job.id, "a")
    assert item.status == "failed" and item.error is not None and item.error["code"] == INTERRUPTED
    ended = store.get(job.id)
    assert ended.status == "failed" and ended.done and ended.counts.failed == 1


def test_recover_takes_back_expired_leases_only_by_default(store: JobStore) -> None:
    job = store.create("index_documents", "docs", items("dead", "alive"))
    store.claim("gone", -1)  # a lease that has already expired
    _, alive = store.claim("here", 60)  # type: ignore[misc]
    assert store.recover() == 1
    assert store.get_item(job.id, "dead").status == "queued"
    assert store.get_item(job.id, "alive").status == "in_progress"
    assert store.renew(job.id, "alive", alive.attempts, 60)
    assert not store.renew(job.id, "alive", alive.attempts + 1, 60)


def test_recovering_an_item_of_a_cancelled_job_cancels_it(store: JobStore) -> None:
    job = store.create("index_documents", "docs", items("a", "b"), webhook=True)
    store.claim("w", 60)
    store.cancel(job.id)
    store.recover(expired_only=False)
    ended = store.get(job.id)
    assert ended.done and ended.counts == JobCounts(0, 0, 0, 0, 2, 2)
    assert [d.type for d in store.list_deliveries(job.id)] == ["job.cancelled"]


def test_delete_job_refuses_a_running_job(store: JobStore) -> None:
    job = store.create("index_documents", "docs", items("a"), webhook=True)
    with pytest.raises(ConflictError):
        store.delete_job(job.id)
    run_all(store)
    store.delete_job(job.id)
    with pytest.raises(NotFoundError):
        store.get(job.id)
    assert store.claim("w", 60) is None
    assert len(store.list_deliveries(job.id)) == 1  # the notification outlives the job


def test_counts_stay_exact_under_concurrent_workers(store: JobStore) -> None:
    jobs = [store.create("index_documents", "docs", items(*(f"{j}-{k}" for k in range(60)))) for j in range(3)]
    seen: list[tuple[str, str]] = []
    lock = threading.Lock()

    def worker(name: str) -> None:
        while (claimed := store.claim(name, 60)) is not None:
            job, item = claimed
            with lock:
                seen.append((job.id, item.key))
            if item.seq % 7 == 0:
                store.fail_item(job.id, item.key, {"code": "x", "message": "m"}, attempt=item.attempts)
            else:
                store.complete_item(job.id, item.key, {"ok": True}, attempt=item.attempts)

    threads = [threading.Thread(target=worker, args=(f"w{n}",)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == len(set(seen)) == 180  # every item claimed exactly once
    assert store.check_counts() == []
    for job in jobs:
        ended = store.get(job.id)
        assert ended.status == "completed" and ended.counts == JobCounts(0, 0, 51, 9, 0, 60)


def test_delivery_claims_and_attempts_are_recorded(store: JobStore) -> None:
    job = store.create("index_documents", "docs", [], webhook=True)
    [pending] = store.list_deliveries()
    assert pending.status == "pending" and pending.attempts == 0 and store.next_delivery_at() is not None
    assert pending.data == {**store.get(job.id).summary()}
    claimed = store.claim_delivery(lease_s=60)
    assert claimed is not None and claimed.id == pending.id
    assert store.claim_delivery(lease_s=60) is None  # held by the first claim
    retry = store.record_delivery_attempt(pending.id, delivered=False, error="HTTP 500", retry_at=0.0)
    assert (retry.status, retry.attempts, retry.last_error) == ("pending", 1, "HTTP 500")
    assert store.claim_delivery(lease_s=60) is not None
    done = store.record_delivery_attempt(pending.id, delivered=True)
    assert (done.status, done.attempts, done.last_error) == ("delivered", 2, None) and done.delivered_at
    assert store.next_delivery_at() is None
    with pytest.raises(ConflictError):
        store.record_delivery_attempt(pending.id, delivered=True)


def test_get_items_reads_many_pairs_at_once_and_skips_what_is_gone(store: JobStore) -> None:
    a = store.create("k", "i", items("x", "y"))
    b = store.create("k", "i", [(f"f{i}", {"n": i}) for i in range(900)])  # more than one IN (...) slice
    pairs = [(a.id, "x"), (a.id, "y"), (a.id, "nope"), ("job_gone", "x")] + [(b.id, f"f{i}") for i in range(900)]
    got = store.get_items(pairs)
    assert set(got) == {(a.id, "x"), (a.id, "y")} | {(b.id, f"f{i}") for i in range(900)}
    assert got[(b.id, "f899")].payload == {"n": 899} and got[(a.id, "y")].status == "queued"
    assert store.get_items([]) == {}
