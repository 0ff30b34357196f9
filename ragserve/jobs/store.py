"""The job store: jobs, their items and pending webhook deliveries in one SQLite file.

Every state change is one ``BEGIN IMMEDIATE`` transaction, so the file is always in a state some
sequence of whole calls produced: a job is created with all of its items or not at all, an item's
result and the job's counts and end state change together, and a job that ends enqueues its webhook
delivery in the transaction that ends it (a crash between the two cannot lose the notification).
The counts are columns maintained by those same transactions, so they are exact under concurrency
and reading a job costs one row, not a scan of its items.

Durability: WAL with ``synchronous=FULL``. A job's acceptance is an acknowledgement to a client
("accepted, here is its id") and must survive a power loss, not only a process crash; writes here
are one per item, and an item is a document to convert and embed (milliseconds to seconds), so an
fsync per commit is noise. One connection (``check_same_thread=False``) serialised by a lock
serves the worker threads ``asyncio.to_thread`` runs calls on; other processes on the same file
(the CLI, a restarted server) are serialised by SQLite's own locking (``BEGIN IMMEDIATE`` and a
30 s busy timeout).

Item life: ``queued`` → (``claim``) ``in_progress`` → ``completed`` | ``failed``; ``queued`` →
``cancelled`` by a cancel. ``claim`` takes a lease and counts an attempt; ``complete_item`` and
``fail_item`` accept only the claim they were given (its ``attempts``), so a worker whose item was
recovered and claimed again cannot record over the newer run. ``recover`` puts items whose worker
died back in the queue (or fails them with code ``interrupted`` after ``max_attempts`` claims, so an
item that kills its process every time does not loop for ever). So an item may run again after a
crash, never twice at the same time under live leases, and its result is recorded once.

Job status rules (docs for the HTTP layer and the OpenAI file-batch mapping):

- ``queued`` until its first item is claimed, then ``in_progress`` (``started_at`` set).
- When no item is queued or running: ``failed`` if every item failed (``error`` says so and quotes
  the first item's message), else ``completed`` — like an OpenAI file batch, a job with *some*
  failed items is ``completed`` and its counts and items say which failed. A job with no items is
  ``completed`` at once.
- ``cancel``: queued items become ``cancelled`` and the job is ``cancelled`` at once (no
  ``cancelling`` state). Items already running finish and their results are recorded (a document
  indexed is indexed); ``finished_at`` is set, and the webhook enqueued, when the last of them ends.
  Cancelling a job that has ended is a no-op that returns it.
- ``fail_job``: a job-level error (the caller's, e.g. its index was deleted): like ``cancel`` but
  the job ends ``failed`` with that ``error``.
- ``finished_at`` is set exactly once, when the job is terminal and nothing of it runs any more;
  ``Job.done`` is that test.

Order: each job has an ``owner`` (the name of the key that submitted it; "" for none), and the
runner is shared between owners in turn: a claim goes to the owner served least recently among
those with queued items, and takes that owner's oldest runnable job's first queued item. One key's
thousand-item job thus delays another key's single file by one item per runner, not by the whole
queue (a hostile probe found a 200 MB file holding every other tenant's jobs for hours). With one
owner (no keys) this is first in, first out; within a job, items run in ``seq`` order.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar, cast, get_args

from ragserve.errors import BadRequestError, ConflictError, NotFoundError
from ragserve.store.schema import connect, write_transaction

JobStatus = Literal["queued", "in_progress", "completed", "failed", "cancelled"]
ItemStatus = JobStatus
DeliveryStatus = Literal["pending", "delivered", "failed"]
JOB_STATUSES: tuple[str, ...] = get_args(JobStatus)
#: A job in one of these accepts no more claims; it is ``done`` once its running items have ended.
TERMINAL: frozenset[str] = frozenset({"completed", "failed", "cancelled"})
#: The largest page ``list_jobs`` and ``list_items`` return.
MAX_PAGE = 1000
#: The error code of an item whose worker died ``max_attempts`` times while running it.
INTERRUPTED = "interrupted"

_DDL = """
CREATE TABLE IF NOT EXISTS jobs (
    n INTEGER PRIMARY KEY AUTOINCREMENT,  -- creation order: FIFO claims, newest-first pages
    id TEXT NOT NULL UNIQUE,
    kind TEXT NOT NULL,
    index_name TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    started_at INTEGER,
    finished_at INTEGER,
    error TEXT,
    meta TEXT NOT NULL,
    webhook INTEGER NOT NULL,
    queued INTEGER NOT NULL,
    in_progress INTEGER NOT NULL DEFAULT 0,
    completed INTEGER NOT NULL DEFAULT 0,
    failed INTEGER NOT NULL DEFAULT 0,
    cancelled INTEGER NOT NULL DEFAULT 0,
    total INTEGER NOT NULL,
    owner TEXT NOT NULL DEFAULT ''  -- the submitting key's name: the runner's turns go by owner
);
CREATE INDEX IF NOT EXISTS jobs_by_index ON jobs(index_name, n);
CREATE INDEX IF NOT EXISTS jobs_by_status ON jobs(status, n);
CREATE TABLE IF NOT EXISTS job_items (
    job_n INTEGER NOT NULL REFERENCES jobs(n) ON DELETE CASCADE,
    seq INTEGER NOT NULL,
    key TEXT NOT NULL,
    payload TEXT NOT NULL,
    status TEXT NOT NULL,
    error TEXT,
    result TEXT,
    attempts INTEGER NOT NULL DEFAULT 0,
    updated_at INTEGER NOT NULL,
    lease_owner TEXT,
    lease_expires REAL,
    PRIMARY KEY (job_n, seq),
    UNIQUE (job_n, key)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS items_by_status ON job_items(job_n, status, seq);
CREATE INDEX IF NOT EXISTS items_running ON job_items(lease_expires) WHERE status = 'in_progress';
CREATE TABLE IF NOT EXISTS webhook_deliveries (
    n INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    job_id TEXT NOT NULL,
    type TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    data TEXT NOT NULL,
    status TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_at REAL NOT NULL,
    last_error TEXT,
    delivered_at INTEGER
);
CREATE INDEX IF NOT EXISTS deliveries_due ON webhook_deliveries(next_attempt_at) WHERE status = 'pending';
CREATE TABLE IF NOT EXISTS job_owners (
    owner TEXT PRIMARY KEY,
    served INTEGER NOT NULL  -- the number of the owner's last claim: the lowest is served next
) WITHOUT ROWID;
"""

#: A job with items to claim: the condition of the partial indexes ``claim`` reads.
_RUNNABLE = "queued > 0 AND status IN ('queued', 'in_progress')"
#: After ``_DDL``, once a file made before owners has been given the column.
_OWNER_INDEX = f"CREATE INDEX IF NOT EXISTS jobs_runnable_by_owner ON jobs(owner, n) WHERE {_RUNNABLE}"
#: The distinct owners of runnable jobs, by a skip-scan of ``jobs_runnable_by_owner`` (each step the
#: least owner after the last: one seek), so 100,000 queued jobs of one owner cost one seek, not a
#: read of each (SQLite's DISTINCT read them all: ~80 ms a claim at 100,000, found by review).
_RUNNABLE_OWNERS = f"""
WITH RECURSIVE runnable(owner) AS (
    SELECT (SELECT MIN(owner) FROM jobs INDEXED BY jobs_runnable_by_owner WHERE {_RUNNABLE})
    UNION ALL
    SELECT (SELECT MIN(owner) FROM jobs INDEXED BY jobs_runnable_by_owner WHERE owner > runnable.owner AND {_RUNNABLE})
    FROM runnable WHERE runnable.owner IS NOT NULL
)"""
#: The owner whose turn it is: served least recently (never: first), ties by name.
_NEXT_OWNER = (
    _RUNNABLE_OWNERS + " SELECT r.owner FROM runnable AS r LEFT JOIN job_owners AS o ON o.owner = r.owner"
    " WHERE r.owner IS NOT NULL ORDER BY COALESCE(o.served, 0), r.owner LIMIT 1"
)

_JOB_COLUMNS = (
    "id, kind, index_name, status, created_at, started_at, finished_at, error, meta, webhook, "
    "queued, in_progress, completed, failed, cancelled, total, owner"
)
_ITEM_COLUMNS = "seq, key, payload, status, error, result, attempts, updated_at"
_DELIVERY_COLUMNS = "id, job_id, type, created_at, data, status, attempts, next_attempt_at, last_error, delivered_at"
_COUNT_COLUMNS = frozenset(JOB_STATUSES)

T = TypeVar("T")


@dataclass(frozen=True)
class JobCounts:
    """How many of a job's items are in each state; ``total`` is their sum."""

    queued: int
    in_progress: int
    completed: int
    failed: int
    cancelled: int
    total: int


@dataclass(frozen=True)
class Job:
    id: str
    kind: str
    index: str
    status: JobStatus
    created_at: int
    started_at: int | None
    finished_at: int | None
    counts: JobCounts
    error: str | None
    meta: dict[str, Any]
    webhook: bool
    #: The name of the key that submitted it ("" for none): the runner takes owners in turn.
    owner: str = ""

    @property
    def done(self) -> bool:
        """Terminal and nothing of it runs any more (a cancelled job may still finish running items)."""
        return self.finished_at is not None

    def summary(self) -> dict[str, Any]:
        """The job as JSON-ready data (what a webhook event carries)."""
        return {
            "id": self.id,
            "kind": self.kind,
            "index": self.index,
            "status": self.status,
            "created_at": self.created_at,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "counts": {
                "queued": self.counts.queued,
                "in_progress": self.counts.in_progress,
                "completed": self.counts.completed,
                "failed": self.counts.failed,
                "cancelled": self.counts.cancelled,
                "total": self.counts.total,
            },
            "error": self.error,
            "meta": self.meta,
        }


@dataclass(frozen=True)
class JobItem:
    job_id: str
    seq: int
    key: str
    payload: dict[str, Any]
    status: ItemStatus
    #: ``{"code": ..., "message": ...}`` when the item failed.
    error: dict[str, str] | None
    result: dict[str, Any] | None
    #: How many times it was claimed; ``complete_item``/``fail_item`` take it back as the claim's token.
    attempts: int
    updated_at: int


@dataclass(frozen=True)
class Delivery:
    """One webhook event for one ended job; ``data`` is the job's summary when it ended."""

    id: str
    job_id: str
    type: str
    created_at: int
    data: dict[str, Any]
    status: DeliveryStatus
    attempts: int
    next_attempt_at: float
    last_error: str | None
    delivered_at: int | None


@dataclass(frozen=True)
class Page(Generic[T]):
    data: tuple[T, ...]
    has_more: bool


def to_json(value: Any, what: str) -> str:
    """``value`` as compact JSON text, or a 400 that says why it cannot be stored: NaN and infinity
    have no JSON form (Python would write a bare ``NaN`` no other parser reads back), a lone
    surrogate is not Unicode (it cannot be written as UTF-8, so no client could read it), and a
    value that is not JSON data (bytes, a set, a cycle) has no stored form at all."""
    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError) as e:
        reason = str(e)
        if isinstance(e, ValueError) and _dumps_with_nan(value):
            reason = "it holds NaN or Infinity, which JSON cannot represent"
        raise BadRequestError(f"{what} cannot be stored as JSON: {reason}", param=what) from None
    _check_unicode(text, what)
    return text


def _dumps_with_nan(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=True)
    except (TypeError, ValueError, RecursionError):
        return False
    return True


def _check_unicode(text: str, what: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise BadRequestError(f"{what} holds a lone surrogate (not valid Unicode text)", param=what) from None


def _name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise BadRequestError(f"{what} must be a non-empty string", param=what)
    _check_unicode(value, what)
    return value


def _limit(limit: int) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
        raise BadRequestError(f"limit must be an integer from 1 to {MAX_PAGE}", param="limit")
    return limit


def _status(status: str | None, what: str = "status") -> str | None:
    if status is not None and status not in JOB_STATUSES:
        raise BadRequestError(f"{what} must be one of {', '.join(JOB_STATUSES)}", param=what)
    return status


def _item_error(error: Mapping[str, Any]) -> dict[str, str]:
    if not isinstance(error, Mapping) or set(error) != {"code", "message"}:
        raise BadRequestError('an item error is {"code": str, "message": str}', param="error")
    code, message = error["code"], error["message"]
    if not isinstance(code, str) or not code or not isinstance(message, str):
        raise BadRequestError("an item error's code is a non-empty string and its message a string", param="error")
    return {"code": code, "message": message}


def new_job_id() -> str:
    """A new job's id; a caller may choose it before the job exists (``JobStore.create(job_id=...)``),
    to record it elsewhere first."""
    return "job_" + uuid.uuid4().hex


class JobStore:
    """Jobs and their items in one SQLite file (see the module docstring for the status rules).

    Every method is synchronous and thread-safe; the runner calls them through
    ``asyncio.to_thread``. Methods raise ``NotFoundError`` for an unknown job or item,
    ``BadRequestError`` for an input that cannot be stored, ``ConflictError`` for a state change
    the item or job is no longer in a state to take.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = connect(self.path)  # WAL, synchronous=FULL: an accepted job survives a power loss
        self._lock = threading.RLock()
        with self._transaction() as db:
            for statement in _DDL.split(";"):
                if statement.strip():
                    db.execute(statement)
            if "owner" not in {row[1] for row in db.execute("PRAGMA table_info(jobs)")}:  # a file made before
                db.execute("ALTER TABLE jobs ADD COLUMN owner TEXT NOT NULL DEFAULT ''")
            db.execute(_OWNER_INDEX)
            # claims read jobs_runnable_by_owner now; the index on n alone that they read before only cost writes
            db.execute("DROP INDEX IF EXISTS jobs_runnable")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> JobStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, taken at once (``IMMEDIATE``) so two writers never both read
        a state and then both change it."""
        with self._lock, write_transaction(self._db) as db:
            yield db

    @contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        """A read in one snapshot (a page and its ``has_more`` agree)."""
        with self._lock:
            self._db.execute("BEGIN")
            try:
                yield self._db
            finally:
                self._db.execute("COMMIT")

    # --- jobs ---------------------------------------------------------------------------------
    def create(
        self,
        kind: str,
        index: str,
        items: Sequence[tuple[str, Mapping[str, Any]]],
        meta: Mapping[str, Any] | None = None,
        webhook: bool = False,
        *,
        job_id: str | None = None,
        owner: str = "",
    ) -> Job:
        """Accept a job of ``items`` (``(key, payload)`` pairs, run in this order) in one
        transaction: all of it is stored, or nothing. Keys are the caller's ids (a file id) and must
        be unique within the job. ``job_id``: an id from :func:`new_job_id` the caller has already
        recorded (default: a new one). ``owner``: the submitting key's name, whose turn it runs in."""
        if not isinstance(owner, str):
            raise BadRequestError("owner must be a string", param="owner")
        _check_unicode(owner, "owner")
        kind = _name(kind, "kind")
        index = _name(index, "index")
        if meta is not None and not isinstance(meta, Mapping):
            raise BadRequestError("meta must be an object", param="meta")
        meta_text = to_json(dict(meta) if meta is not None else {}, "meta")
        rows: list[tuple[int, str, str]] = []
        seen: set[str] = set()
        duplicates: list[str] = []
        for seq, pair in enumerate(items):
            if not isinstance(pair, tuple | list) or len(pair) != 2:
                raise BadRequestError("each item is a (key, payload) pair", param="items")
            key = _name(pair[0], "key")
            if not isinstance(pair[1], Mapping):
                raise BadRequestError(f"the payload of item {key!r} must be an object", param="payload")
            if key in seen:
                duplicates.append(key)
            seen.add(key)
            rows.append((seq, key, to_json(dict(pair[1]), f"payload of item {key!r}")))
        if duplicates:
            shown = ", ".join(repr(k) for k in duplicates[:5])
            raise BadRequestError(f"item keys must be unique within a job; repeated: {shown}", param="items")
        job_id = _name(job_id, "job_id") if job_id is not None else new_job_id()
        now = int(time.time())
        with self._transaction() as db:
            n = db.execute(
                "INSERT INTO jobs (id, kind, index_name, status, created_at, meta, webhook, queued, total, owner) "
                "VALUES (?, ?, ?, 'queued', ?, ?, ?, ?, ?, ?)",
                (job_id, kind, index, now, meta_text, int(bool(webhook)), len(rows), len(rows), owner),
            ).lastrowid
            db.executemany(
                "INSERT INTO job_items (job_n, seq, key, payload, status, updated_at) VALUES (?, ?, ?, ?, 'queued', ?)",
                ((n, seq, key, payload, now) for seq, key, payload in rows),
            )
            self._settle(db, cast(int, n), now)
            return self._job(db, job_id)

    def get(self, job_id: str) -> Job:
        with self._lock:
            return self._job(self._db, job_id)

    def list_jobs(
        self, index: str | None = None, status: str | None = None, limit: int = 20, after: str | None = None
    ) -> Page[Job]:
        """Jobs newest first; ``after`` is the id of the last job of the previous page."""
        limit = _limit(limit)
        where: list[str] = []
        args: list[Any] = []
        if index is not None:
            where.append("index_name = ?")
            args.append(index)
        if _status(status) is not None:
            where.append("status = ?")
            args.append(status)
        with self._reading() as db:
            if after is not None:
                where.append("n < ?")
                args.append(self._cursor(db, "SELECT n FROM jobs WHERE id = ?", (after,)))
            sql = f"SELECT {_JOB_COLUMNS} FROM jobs"
            if where:
                sql += " WHERE " + " AND ".join(where)
            rows = db.execute(sql + " ORDER BY n DESC LIMIT ?", (*args, limit + 1)).fetchall()
        return Page(tuple(_job_of(r) for r in rows[:limit]), len(rows) > limit)

    def cancel(self, job_id: str) -> Job:
        """Cancel a job: its queued items become ``cancelled`` and it is ``cancelled`` at once;
        items already running are stopped by their runner (``cancel_item``). A job that has ended is returned as
        it is."""
        return self._stop(job_id, "cancelled", None)

    def fail_job(self, job_id: str, error: str) -> Job:
        """End a job ``failed`` with a job-level ``error`` (the caller's reason, e.g. its index is
        gone); queued items become ``cancelled``, running ones finish. A job that has ended is
        returned as it is."""
        if not isinstance(error, str) or not error:
            raise BadRequestError("a job error is a non-empty string", param="error")
        _check_unicode(error, "error")
        return self._stop(job_id, "failed", error)

    def _stop(self, job_id: str, status: str, error: str | None) -> Job:
        now = int(time.time())
        with self._transaction() as db:
            job = self._job(db, job_id)
            if job.status in TERMINAL:
                return job
            n = self._job_n(db, job_id)
            moved = db.execute(
                "UPDATE job_items SET status = 'cancelled', updated_at = ? WHERE job_n = ? AND status = 'queued'",
                (now, n),
            ).rowcount
            self._move(db, n, "queued", "cancelled", moved)
            db.execute("UPDATE jobs SET status = ?, error = ? WHERE n = ?", (status, error, n))
            self._settle(db, n, now)
            return self._job(db, job_id)

    def delete_job(self, job_id: str) -> None:
        """Forget a job and its items. A job still running (not ``done``) cannot be deleted: cancel
        it and let its running items end first, so no worker records into a job that is gone.
        Its webhook deliveries are kept (they carry their own copy of the job)."""
        with self._transaction() as db:
            if not self._job(db, job_id).done:
                raise ConflictError(f"job {job_id} is still running; cancel it and wait until it has ended")
            db.execute("DELETE FROM jobs WHERE id = ?", (job_id,))

    # --- items --------------------------------------------------------------------------------
    def get_item(self, job_id: str, key: str) -> JobItem:
        with self._lock:
            n = self._job_n(self._db, job_id)
            return self._item(self._db, job_id, n, key)

    def get_items(self, pairs: Sequence[tuple[str, str]]) -> dict[tuple[str, str], JobItem]:
        """The items named by ``(job_id, key)`` pairs, in one read; a pair that names nothing (its
        job was deleted) is absent from the answer rather than an error: a listing of many things
        that each point at an item asks this."""
        out: dict[tuple[str, str], JobItem] = {}
        wanted = sorted(set(pairs))
        with self._reading() as db:
            jobs: dict[str, int] = {}
            for i in range(0, len(wanted), 400):
                part = wanted[i : i + 400]
                ids = sorted({j for j, _ in part} - jobs.keys())
                if ids:
                    marks = ",".join("?" * len(ids))
                    jobs.update(db.execute(f"SELECT id, n FROM jobs WHERE id IN ({marks})", ids).fetchall())
                for job_id, key in part:
                    n = jobs.get(job_id)
                    if n is None:
                        continue
                    row = db.execute(
                        f"SELECT {_ITEM_COLUMNS} FROM job_items WHERE job_n = ? AND key = ?", (n, key)
                    ).fetchone()
                    if row is not None:
                        out[(job_id, key)] = _item_of(job_id, row)
        return out

    def list_items(
        self,
        job_id: str,
        status: str | None = None,
        limit: int = 100,
        after: str | None = None,
        *,
        payload: bool = True,
    ) -> Page[JobItem]:
        """A job's items in ``seq`` order; ``after`` is the key of the last item of the previous page.
        ``payload=False``: each item's ``payload`` is ``{}``, not read (what a job's progress needs is
        its items' outcomes; their payloads may hold every document of the job)."""
        limit = _limit(limit)
        with self._reading() as db:
            n = self._job_n(db, job_id)
            where: list[str] = ["job_n = ?"]
            args: list[Any] = [n]
            if _status(status) is not None:
                where.append("status = ?")
                args.append(status)
            if after is not None:
                where.append("seq > ?")
                args.append(self._cursor(db, "SELECT seq FROM job_items WHERE job_n = ? AND key = ?", (n, after)))
            columns = _ITEM_COLUMNS if payload else _ITEM_COLUMNS.replace("payload", "'{}'")
            rows = db.execute(
                f"SELECT {columns} FROM job_items WHERE {' AND '.join(where)} ORDER BY seq LIMIT ?",
                (*args, limit + 1),
            ).fetchall()
        return Page(tuple(_item_of(job_id, r) for r in rows[:limit]), len(rows) > limit)

    def claim(self, owner: str, lease_s: float) -> tuple[Job, JobItem] | None:
        """The next item to run, marked ``in_progress`` under a lease of ``lease_s`` seconds held by
        ``owner`` (the worker), its attempt counted; None when nothing is queued. The next item is
        the first queued item of the oldest runnable job of the job owner served least recently
        (the module's "Order"): the owners with runnable jobs are found by skipping along the
        ``jobs_runnable_by_owner`` index, one seek an owner whatever its number of jobs
        (``_RUNNABLE_OWNERS``), then two indexed lookups."""
        owner = _name(owner, "owner")
        now = time.time()
        with self._transaction() as db:
            turn = db.execute(_NEXT_OWNER).fetchone()
            if turn is None:
                return None
            (job_owner,) = turn
            n, job_id = db.execute(
                f"SELECT n, id FROM jobs INDEXED BY jobs_runnable_by_owner WHERE owner = ? AND {_RUNNABLE} "
                "ORDER BY n LIMIT 1",
                (job_owner,),
            ).fetchone()
            db.execute(
                "INSERT INTO job_owners (owner, served) "
                "VALUES (?, (SELECT COALESCE(MAX(served), 0) + 1 FROM job_owners)) "
                "ON CONFLICT (owner) DO UPDATE SET served = excluded.served",
                (job_owner,),
            )
            (seq,) = db.execute(
                "SELECT seq FROM job_items WHERE job_n = ? AND status = 'queued' ORDER BY seq LIMIT 1", (n,)
            ).fetchone()
            db.execute(
                "UPDATE job_items SET status = 'in_progress', attempts = attempts + 1, lease_owner = ?, "
                "lease_expires = ?, updated_at = ? WHERE job_n = ? AND seq = ?",
                (owner, now + lease_s, int(now), n, seq),
            )
            self._move(db, n, "queued", "in_progress", 1)
            db.execute(
                "UPDATE jobs SET status = 'in_progress', started_at = ? WHERE n = ? AND status = 'queued'",
                (int(now), n),
            )
            item = db.execute(f"SELECT {_ITEM_COLUMNS} FROM job_items WHERE job_n = ? AND seq = ?", (n, seq)).fetchone()
            return self._job(db, job_id), _item_of(job_id, item)

    def renew(self, job_id: str, key: str, attempt: int, lease_s: float) -> bool:
        """Extend a running item's lease; False when that claim is no longer the item's (it ended,
        or was recovered and claimed again)."""
        with self._transaction() as db:
            n = self._job_n(db, job_id)
            return (
                db.execute(
                    "UPDATE job_items SET lease_expires = ? WHERE job_n = ? AND key = ? AND status = 'in_progress' "
                    "AND attempts = ?",
                    (time.time() + lease_s, n, key, attempt),
                ).rowcount
                == 1
            )

    def complete_item(self, job_id: str, key: str, result: Mapping[str, Any], *, attempt: int | None = None) -> Job:
        """Record a running item's ``result`` and return its job (ended when this was its last
        running item). ``attempt`` is the claim's ``JobItem.attempts``: a result from an older claim
        is refused (``ConflictError``), so an item's result is recorded once."""
        if not isinstance(result, Mapping):
            raise BadRequestError("an item's result must be an object", param="result")
        text = to_json(dict(result), "result")
        return self._finish_item(job_id, key, "completed", None, text, attempt)

    def fail_item(self, job_id: str, key: str, error: Mapping[str, Any], *, attempt: int | None = None) -> Job:
        """Record that a running item failed with ``error`` (``{"code", "message"}``); see
        ``complete_item``."""
        text = to_json(_item_error(error), "error")
        return self._finish_item(job_id, key, "failed", text, None, attempt)

    def cancel_item(self, job_id: str, key: str, *, attempt: int | None = None) -> Job:
        """Record that a running item was stopped because its job ended (``cancel``, ``fail_job``)
        while it ran; see ``complete_item``."""
        return self._finish_item(job_id, key, "cancelled", None, None, attempt)

    def _finish_item(
        self, job_id: str, key: str, status: str, error: str | None, result: str | None, attempt: int | None
    ) -> Job:
        now = int(time.time())
        with self._transaction() as db:
            n = self._job_n(db, job_id)
            item = self._item(db, job_id, n, key)
            if item.status != "in_progress" or (attempt is not None and item.attempts != attempt):
                raise ConflictError(
                    f"item {key!r} of job {job_id} is {item.status} (attempt {item.attempts}), "
                    f"not running under attempt {attempt}"
                )
            db.execute(
                "UPDATE job_items SET status = ?, error = ?, result = ?, lease_owner = NULL, lease_expires = NULL, "
                "updated_at = ? WHERE job_n = ? AND seq = ?",
                (status, error, result, now, n, item.seq),
            )
            self._move(db, n, "in_progress", status, 1)
            self._settle(db, n, now)
            return self._job(db, job_id)

    def recover(self, *, expired_only: bool = True, max_attempts: int = 3) -> int:
        """Take back items whose worker is gone: those ``in_progress`` with an expired lease, or
        every one (``expired_only=False``, what the single owner of the file does at startup, when
        nothing can be running). Each goes back to the queue, or fails with code ``interrupted``
        once it was claimed ``max_attempts`` times; an item of a cancelled or failed job is
        cancelled. Returns how many items were taken back."""
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        now = time.time()
        sql = (
            "SELECT job_n, seq, attempts, jobs.status FROM job_items JOIN jobs ON jobs.n = job_n "
            "WHERE job_items.status = 'in_progress'"
        )
        args: tuple[Any, ...] = ()
        if expired_only:
            sql += " AND lease_expires < ?"
            args = (now,)
        interrupted = to_json(
            {"code": INTERRUPTED, "message": f"the worker running this item stopped {max_attempts} times"}, "error"
        )
        with self._transaction() as db:
            rows = db.execute(sql, args).fetchall()
            for n, seq, attempts, job_status in rows:
                if job_status in TERMINAL:
                    to, error = "cancelled", None
                elif attempts >= max_attempts:
                    to, error = "failed", interrupted
                else:
                    to, error = "queued", None
                db.execute(
                    "UPDATE job_items SET status = ?, error = ?, lease_owner = NULL, lease_expires = NULL, "
                    "updated_at = ? WHERE job_n = ? AND seq = ?",
                    (to, error, int(now), n, seq),
                )
                self._move(db, n, "in_progress", to, 1)
            for n in sorted({r[0] for r in rows}):
                self._settle(db, n, int(now))
        return len(rows)

    # --- webhook deliveries -------------------------------------------------------------------
    def claim_delivery(self, lease_s: float) -> Delivery | None:
        """The oldest delivery that is due, held for ``lease_s`` seconds (its next attempt moved
        that far on), so another notifier does not send it meanwhile and a notifier that dies while
        sending leaves it to be sent again after the lease. None when none is due."""
        now = time.time()
        with self._transaction() as db:
            row = db.execute(
                f"SELECT {_DELIVERY_COLUMNS} FROM webhook_deliveries WHERE status = 'pending' AND next_attempt_at <= ? "
                "ORDER BY n LIMIT 1",
                (now,),
            ).fetchone()
            if row is None:
                return None
            db.execute("UPDATE webhook_deliveries SET next_attempt_at = ? WHERE id = ?", (now + lease_s, row[0]))
            return _delivery_of(row)

    def record_delivery_attempt(
        self, delivery_id: str, *, delivered: bool, error: str | None = None, retry_at: float | None = None
    ) -> Delivery:
        """Count one attempt: ``delivered``; or failed, to be tried again at ``retry_at`` (unix
        seconds) or, when that is None, given up (``failed``, kept for inspection)."""
        now = time.time()
        status = "delivered" if delivered else "pending" if retry_at is not None else "failed"
        with self._transaction() as db:
            changed = db.execute(
                "UPDATE webhook_deliveries SET status = ?, attempts = attempts + 1, last_error = ?, "
                "next_attempt_at = ?, delivered_at = ? WHERE id = ? AND status = 'pending'",
                (
                    status,
                    None if delivered else error,
                    retry_at if retry_at is not None else now,
                    int(now) if delivered else None,
                    delivery_id,
                ),
            ).rowcount
            if changed != 1:
                raise ConflictError(f"webhook delivery {delivery_id} is not pending")
            return self._delivery(db, delivery_id)

    def next_delivery_at(self) -> float | None:
        """When the earliest pending delivery is due (unix seconds); None when none is pending."""
        with self._lock:
            (due,) = self._db.execute(
                "SELECT min(next_attempt_at) FROM webhook_deliveries WHERE status = 'pending'"
            ).fetchone()
            return cast(float | None, due)

    def get_delivery(self, delivery_id: str) -> Delivery:
        with self._lock:
            return self._delivery(self._db, delivery_id)

    def list_deliveries(self, job_id: str | None = None) -> list[Delivery]:
        """Deliveries oldest first, of one job or of all."""
        sql = f"SELECT {_DELIVERY_COLUMNS} FROM webhook_deliveries"
        args: tuple[str, ...] = ()
        if job_id is not None:
            sql += " WHERE job_id = ?"
            args = (job_id,)
        with self._lock:
            return [_delivery_of(r) for r in self._db.execute(sql + " ORDER BY n", args).fetchall()]

    # --- internals ----------------------------------------------------------------------------
    @staticmethod
    def _move(db: sqlite3.Connection, n: int, frm: str, to: str, count: int) -> None:
        """Move ``count`` items of job ``n`` from one state's count to another's."""
        if frm not in _COUNT_COLUMNS or to not in _COUNT_COLUMNS:
            raise ValueError(f"no count column {frm!r} or {to!r}")
        if count:
            db.execute(f"UPDATE jobs SET {frm} = {frm} - ?, {to} = {to} + ? WHERE n = ?", (count, count, n))

    def _settle(self, db: sqlite3.Connection, n: int, now: int) -> None:
        """Apply the status rules after a change: a job with nothing queued or running ends
        (``completed``, or ``failed`` when every item failed); a cancelled or failed job is
        finished when its last running item ends. Ending sets ``finished_at`` and, when the job
        asked for it, enqueues its webhook delivery in this same transaction."""
        status, queued, in_progress, completed, total, finished_at, webhook, job_id = db.execute(
            "SELECT status, queued, in_progress, completed, total, finished_at, webhook, id FROM jobs WHERE n = ?",
            (n,),
        ).fetchone()
        if finished_at is not None or in_progress > 0 or (status not in TERMINAL and queued > 0):
            return
        if status not in TERMINAL:
            error = None
            if total > 0 and completed == 0:
                status = "failed"
                (first,) = db.execute(
                    "SELECT error FROM job_items WHERE job_n = ? AND status = 'failed' ORDER BY seq LIMIT 1", (n,)
                ).fetchone()
                error = f"every item failed; the first: {json.loads(first)['message']}"
            else:
                status = "completed"
            db.execute("UPDATE jobs SET status = ?, error = ? WHERE n = ?", (status, error, n))
        db.execute("UPDATE jobs SET finished_at = ? WHERE n = ?", (now, n))
        if webhook:
            job = self._job(db, job_id)
            db.execute(
                "INSERT INTO webhook_deliveries (id, job_id, type, created_at, data, status, next_attempt_at) "
                "VALUES (?, ?, ?, ?, ?, 'pending', ?)",
                ("evt_" + uuid.uuid4().hex, job_id, f"job.{status}", now, to_json(job.summary(), "job"), now),
            )

    @staticmethod
    def _cursor(db: sqlite3.Connection, sql: str, args: tuple[Any, ...]) -> int:
        row = db.execute(sql, args).fetchone()
        if row is None:
            raise BadRequestError("after names no entry of this list", param="after")
        return cast(int, row[0])

    @staticmethod
    def _job_n(db: sqlite3.Connection, job_id: str) -> int:
        row = db.execute("SELECT n FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            raise NotFoundError(f"no job {job_id}", param="job_id", code="job_not_found")
        return cast(int, row[0])

    @staticmethod
    def _job(db: sqlite3.Connection, job_id: str) -> Job:
        row = db.execute(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            raise NotFoundError(f"no job {job_id}", param="job_id", code="job_not_found")
        return _job_of(row)

    @staticmethod
    def _item(db: sqlite3.Connection, job_id: str, n: int, key: str) -> JobItem:
        row = db.execute(f"SELECT {_ITEM_COLUMNS} FROM job_items WHERE job_n = ? AND key = ?", (n, key)).fetchone()
        if row is None:
            raise NotFoundError(f"job {job_id} has no item {key!r}", param="key", code="job_item_not_found")
        return _item_of(job_id, row)

    @staticmethod
    def _delivery(db: sqlite3.Connection, delivery_id: str) -> Delivery:
        row = db.execute(f"SELECT {_DELIVERY_COLUMNS} FROM webhook_deliveries WHERE id = ?", (delivery_id,)).fetchone()
        if row is None:
            raise NotFoundError(f"no webhook delivery {delivery_id}", param="delivery_id")
        return _delivery_of(row)

    def check_counts(self) -> list[str]:
        """The self-check tests run after concurrent work: every job's count columns equal a recount
        of its items. Returns the disagreements (empty when consistent)."""
        with self._reading() as db:
            recount: dict[int, dict[str, int]] = {}
            for n, status, count in db.execute("SELECT job_n, status, count(*) FROM job_items GROUP BY job_n, status"):
                recount.setdefault(n, {})[status] = count
            problems = []
            for n, job_id, *stored in db.execute(
                "SELECT n, id, queued, in_progress, completed, failed, cancelled, total FROM jobs"
            ):
                actual = [recount.get(n, {}).get(s, 0) for s in JOB_STATUSES]
                actual.append(sum(actual))
                if stored != actual:
                    problems.append(f"{job_id}: counts {stored} but items {actual}")
            return problems


def _job_of(row: tuple[Any, ...]) -> Job:
    (id_, kind, index, status, created, started, finished, error, meta, webhook, *counts, owner) = row
    return Job(
        id=id_,
        kind=kind,
        index=index,
        status=status,
        created_at=created,
        started_at=started,
        finished_at=finished,
        counts=JobCounts(*counts),
        error=error,
        meta=json.loads(meta),
        webhook=bool(webhook),
        owner=owner,
    )


def _item_of(job_id: str, row: tuple[Any, ...]) -> JobItem:
    seq, key, payload, status, error, result, attempts, updated_at = row
    return JobItem(
        job_id=job_id,
        seq=seq,
        key=key,
        payload=json.loads(payload),
        status=status,
        error=json.loads(error) if error is not None else None,
        result=json.loads(result) if result is not None else None,
        attempts=attempts,
        updated_at=updated_at,
    )


def _delivery_of(row: tuple[Any, ...]) -> Delivery:
    id_, job_id, type_, created_at, data, status, attempts, next_attempt_at, last_error, delivered_at = row
    return Delivery(
        id=id_,
        job_id=job_id,
        type=type_,
        created_at=created_at,
        data=json.loads(data),
        status=status,
        attempts=attempts,
        next_attempt_at=next_attempt_at,
        last_error=last_error,
        delivered_at=delivered_at,
    )
