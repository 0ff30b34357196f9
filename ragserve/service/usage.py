"""Usage metering, token budgets and request rate limits per API key (docs/architecture.md §7).

Three parts, pure (no Ray):

- :class:`UsageLedger`, the durable record: one SQLite file (``<storage_dir>/usage.sqlite3``, WAL,
  ``synchronous=NORMAL``)
  with hourly buckets ``(hour, key, index, metric) → value`` for ``GET /usage`` and the same
  buckets per key alone (``key_usage``: a request over several indexes counted once), which the
  token budget reads. Its limiter :meth:`UsageLedger.admit` counts a request of a limited key in its
  minute window and checks the tokens recorded today, in one ``BEGIN IMMEDIATE`` transaction under
  one lock: concurrent admissions never exceed a limit.
- :class:`UsageService`, the ledger on worker threads: what one process owns (the in-process
  application, or under Ray the ``Ingestion`` deployment's replica, which every ingress replica
  reaches, so the counts are the server's, not a replica's).
- :class:`UsageMeter`, in each ingress replica: buffers what requests used and sends it to the owner
  in the background (every ``interval_s``, at once for a limited key, and when it stops); a key
  with limits waits for one admission call per request, a key without none.

Windows: ``requests_per_minute`` is a fixed window, the UTC minute (``floor(now / 60)``): at most N
requests are admitted in each, so a burst straddling a minute's end can see up to 2N in 60 s;
``tokens_per_day`` is the UTC day, against the tokens *recorded* (prompt, completion, embedding):
a request is admitted while what was recorded today is below the budget, so the request that
crosses it finishes (a stream is never cut off) and the next one is refused. Tokens are recorded
after the response, so a request admitted while earlier ones are still running or unflushed may
also pass (the lag is a request's length plus a flush, about a second). ``Retry-After`` is the whole
seconds until the window that refused the request resets (next minute, next UTC day).
"""

from __future__ import annotations

import asyncio
import logging
import math
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ragserve.aio import cancel_and_wait, wait_event
from ragserve.api.usage import USAGE_METRICS, UsageReport, UsageRow, UsageTotal
from ragserve.errors import ServiceError
from ragserve.ports import TokenCounter
from ragserve.service.access import Principal
from ragserve.store.schema import connect, write_transaction
from ragserve.telemetry import Telemetry

log = logging.getLogger(__name__)

USAGE_FILE = "usage.sqlite3"
HOUR_S = 3600
DAY_S = 86400
MINUTE_S = 60
TOKEN_METRICS = ("prompt_tokens", "completion_tokens", "embedding_tokens")

_DDL = """
CREATE TABLE IF NOT EXISTS usage (
    hour INTEGER NOT NULL, key TEXT NOT NULL, idx TEXT NOT NULL, metric TEXT NOT NULL, value INTEGER NOT NULL,
    PRIMARY KEY (hour, key, idx, metric)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS key_usage (
    hour INTEGER NOT NULL, key TEXT NOT NULL, metric TEXT NOT NULL, value INTEGER NOT NULL,
    PRIMARY KEY (key, hour, metric)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS request_window (
    key TEXT PRIMARY KEY, window INTEGER NOT NULL, count INTEGER NOT NULL
) WITHOUT ROWID;
"""


@dataclass(frozen=True)
class KeyLimits:
    requests_per_minute: int | None = None
    tokens_per_day: int | None = None

    def __bool__(self) -> bool:
        return self.requests_per_minute is not None or self.tokens_per_day is not None

    @classmethod
    def of(cls, principal: Principal) -> KeyLimits:
        return cls(principal.requests_per_minute, principal.tokens_per_day)


@dataclass
class Usage:
    """What requests of one key used on the indexes they named (``()``: none; each index is counted
    in full); deltas, merged while buffered."""

    key: str
    indexes: tuple[str, ...] = ()
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    embedding_tokens: int = 0
    documents: int = 0
    bytes: int = 0

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens + self.embedding_tokens

    def counts(self) -> dict[str, int]:
        return {m: int(getattr(self, m)) for m in USAGE_METRICS}

    def merge(self, other: Usage) -> None:
        for m in USAGE_METRICS:
            setattr(self, m, getattr(self, m) + getattr(other, m))


@dataclass(frozen=True)
class Allowance:
    """One limit as the ``x-ratelimit-*`` headers report it."""

    limit: int
    remaining: int
    reset_s: float  # seconds until the window resets


@dataclass(frozen=True)
class Decision:
    allowed: bool
    requests: Allowance | None = None
    tokens: Allowance | None = None
    exceeded: str | None = None  # "requests" | "tokens" when refused

    @property
    def retry_after_s(self) -> int:
        """Whole seconds until the refusing window resets (at least 1)."""
        refused = self.requests if self.exceeded == "requests" else self.tokens
        return max(1, math.ceil(refused.reset_s)) if refused is not None else 1


class RateLimitError(ServiceError):
    """Over a key's ``requests_per_minute`` or ``tokens_per_day`` (429, OpenAI's shape: ``type``
    ``requests`` or ``tokens``, ``code`` ``rate_limit_exceeded``); ``decision`` fills the headers."""

    status = 429
    type = "requests"

    def __init__(self, key: str, decision: Decision):
        kind = decision.exceeded or "requests"
        if kind == "tokens":
            a = decision.tokens
            message = (
                f"Rate limit reached for key '{key}' on tokens per day (TPD): limit {a.limit if a else '?'}, "
                f"used {a.limit - a.remaining if a else '?'}. Try again in {decision.retry_after_s}s."
            )
        else:
            a = decision.requests
            message = (
                f"Rate limit reached for key '{key}' on requests per minute (RPM): limit {a.limit if a else '?'}. "
                f"Try again in {decision.retry_after_s}s."
            )
        super().__init__(message, code="rate_limit_exceeded", type_=kind)
        self.decision = decision
        self.retry_after = decision.retry_after_s


class UsageLedger:
    """The durable record and the limiter. One connection serialised by a lock (calls run on
    worker threads); other processes on the file are serialised by SQLite's ``BEGIN IMMEDIATE``."""

    def __init__(self, path: str | Path):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._conn = connect(path)
        # NORMAL, not the catalogs' FULL: in WAL mode a commit survives a crash of the process, and
        # only a power loss may take the last ones back; usage already waits up to a second in the
        # replicas' buffers, and an fsync per admission would cost a limited key milliseconds a request.
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.executescript(_DDL)
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def record(self, batch: Iterable[Usage], now: float | None = None) -> None:
        """Add ``batch`` to the current hour's buckets, in one transaction."""
        hour = _floor(time.time() if now is None else now, HOUR_S)
        rows: list[tuple[int, str, str, str, int]] = []
        per_key: list[tuple[int, str, str, int]] = []
        for u in batch:
            counts = {m: v for m, v in u.counts().items() if v}
            for idx in u.indexes or ("",):
                rows += [(hour, u.key, idx, m, v) for m, v in counts.items()]
            per_key += [(hour, u.key, m, v) for m, v in counts.items()]
        if not per_key:
            return
        with self._lock, write_transaction(self._conn) as c:
            c.executemany(
                "INSERT INTO usage VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (hour, key, idx, metric) DO UPDATE SET value = value + excluded.value",
                rows,
            )
            c.executemany(
                "INSERT INTO key_usage VALUES (?, ?, ?, ?) "
                "ON CONFLICT (key, hour, metric) DO UPDATE SET value = value + excluded.value",
                per_key,
            )

    def _tokens_today(self, c: sqlite3.Connection, key: str, now: float) -> int:
        day = _floor(now, DAY_S)
        marks = ",".join("?" * len(TOKEN_METRICS))
        row = c.execute(
            f"SELECT COALESCE(SUM(value), 0) FROM key_usage WHERE key = ? AND hour >= ? AND hour < ? "
            f"AND metric IN ({marks})",
            (key, day, day + DAY_S, *TOKEN_METRICS),
        ).fetchone()
        return int(row[0])

    def admit(self, key: str, limits: KeyLimits, now: float | None = None) -> Decision:
        """Check ``key``'s token budget and count the request in its minute window, atomically:
        refused by tokens, nothing is counted; refused by requests, the window is not raised."""
        now = time.time() if now is None else now
        with self._lock, write_transaction(self._conn) as c:
            tokens = None
            if limits.tokens_per_day is not None:
                used = self._tokens_today(c, key, now)
                reset = _floor(now, DAY_S) + DAY_S - now
                tokens = Allowance(limits.tokens_per_day, max(0, limits.tokens_per_day - used), reset)
            requests = None
            if limits.requests_per_minute is not None:
                window = _floor(now, MINUTE_S)
                row = c.execute("SELECT window, count FROM request_window WHERE key = ?", (key,)).fetchone()
                count = row[1] if row is not None and row[0] == window else 0
                rpm = limits.requests_per_minute
                requests = Allowance(rpm, rpm - count, window + MINUTE_S - now)
            if tokens is not None and tokens.remaining <= 0:
                return Decision(False, requests, tokens, "tokens")
            if requests is not None:
                if requests.remaining <= 0:
                    return Decision(False, requests, tokens, "requests")
                c.execute(
                    "INSERT INTO request_window VALUES (?, ?, 1) ON CONFLICT (key) DO UPDATE SET "
                    "count = CASE WHEN window = excluded.window THEN count + 1 ELSE 1 END, window = excluded.window",
                    (key, window),
                )
                requests = Allowance(requests.limit, requests.remaining - 1, requests.reset_s)
            return Decision(True, requests, tokens)

    def report(self, since: float, until: float) -> UsageReport:
        """Every key's use per index over the hours that overlap ``[since, until)``."""
        start, end = _floor(since, HOUR_S), _floor(until + HOUR_S - 1, HOUR_S)
        with self._lock:
            cells = self._conn.execute(
                "SELECT key, idx, metric, SUM(value) FROM usage WHERE hour >= ? AND hour < ? GROUP BY key, idx, metric",
                (start, end),
            ).fetchall()
            totals = self._conn.execute(
                "SELECT key, metric, SUM(value) FROM key_usage WHERE hour >= ? AND hour < ? GROUP BY key, metric",
                (start, end),
            ).fetchall()
        rows: dict[tuple[str, str], dict[str, int]] = {}
        for key, idx, metric, value in cells:
            if metric in USAGE_METRICS:
                rows.setdefault((key, idx), {})[metric] = int(value)
        per_key: dict[str, dict[str, int]] = {}
        for key, metric, value in totals:
            if metric in USAGE_METRICS:
                per_key.setdefault(key, {})[metric] = int(value)
        return UsageReport(
            since=start,
            until=end,
            data=[UsageRow(key=k, index=i, **c) for (k, i), c in sorted(rows.items())],
            totals=[UsageTotal(key=k, **c) for k, c in sorted(per_key.items())],
        )


def _floor(t: float, size: int) -> int:
    return int(t // size) * size


def scoped_report(report: UsageReport, principal: Principal) -> UsageReport:
    """What ``principal`` may see of ``report``: everything for a key that reaches every index; else
    the rows of the indexes it reaches (not the rows without an index, which may be anyone's), with
    totals summed over those rows (a request over several of them counted on each)."""
    if principal.sees_all:
        return report
    rows = [r for r in report.data if r.index and principal.sees(r.index)]
    totals: dict[str, UsageTotal] = {}
    for r in rows:
        t = totals.setdefault(r.key, UsageTotal(key=r.key))
        for m in USAGE_METRICS:
            setattr(t, m, getattr(t, m) + getattr(r, m))
    return report.model_copy(update={"data": rows, "totals": [totals[k] for k in sorted(totals)]})


class UsageService:
    """The ledger's calls on worker threads, in the process that owns it (served by name to the
    ingress replicas under Ray: its public coroutine methods)."""

    def __init__(self, ledger: UsageLedger):
        self.ledger = ledger

    async def admit(self, key: str, limits: KeyLimits) -> Decision:
        return await asyncio.to_thread(self.ledger.admit, key, limits)

    async def record(self, batch: list[Usage]) -> None:
        await asyncio.to_thread(self.ledger.record, batch)

    async def report(self, since: float, until: float) -> UsageReport:
        return await asyncio.to_thread(self.ledger.report, since, until)

    def close(self) -> None:
        self.ledger.close()


class UsageBackend(Protocol):
    """Where the meter sends what it counted: a :class:`UsageService` here, or its proxy on the
    ``Ingestion`` deployment."""

    async def admit(self, key: str, limits: KeyLimits) -> Decision: ...

    async def record(self, batch: list[Usage]) -> None: ...

    async def report(self, since: float, until: float) -> UsageReport: ...


@dataclass
class RequestUsage:
    """What one request used, filled in by its route while it runs; the middleware adds the request
    itself and hands it to the meter when the response has been sent. ``texts`` are counted
    (embedding tokens, and ``bytes`` where ``count_bytes``) on a worker thread after that."""

    key: str
    limited: bool = False
    indexes: tuple[str, ...] = ()
    usage: Usage = field(init=False)
    query_texts: list[str] = field(default_factory=list)  # embedded for a search (embedding tokens)
    documents: Sequence[str] = ()  # ingested texts (documents, bytes, embedding tokens)
    documents_embedded: bool = True  # False: accepted for a job; tokens counted when the job embeds them
    completions: list[tuple[TokenCounter, str]] = field(default_factory=list)  # answers the engine did not count

    def __post_init__(self) -> None:
        self.usage = Usage(self.key)

    def chat(self, prompt_tokens: int, completion_tokens: int) -> None:
        self.usage.prompt_tokens += prompt_tokens
        self.usage.completion_tokens += completion_tokens


#: How long :meth:`UsageMeter.stop` waits for the sends under way.
STOP_SEND_WAIT_S = 10.0


class UsageMeter:
    """Buffers usage in an ingress replica and sends it to the backend in the background; admits
    requests of limited keys. Also reports each delta to the metrics as it is added."""

    def __init__(
        self,
        backend: UsageBackend,
        telemetry: Telemetry,
        count_tokens: Callable[[str], int],
        interval_s: float = 1.0,
    ):
        self.backend = backend
        self.telemetry = telemetry
        self.count_tokens = count_tokens
        self.interval_s = interval_s
        self._buffer: dict[tuple[str, tuple[str, ...]], Usage] = {}
        self._wake: asyncio.Event | None = None  # made by start, on the loop that serves
        self._task: asyncio.Task[None] | None = None
        self._finishing: set[asyncio.Task[None]] = set()
        self._sending: set[asyncio.Task[None]] = set()

    async def admit(self, key: str, limits: KeyLimits) -> Decision:
        decision = await self.backend.admit(key, limits)
        if not decision.allowed:
            self.telemetry.rate_limited(key, decision.exceeded or "requests")
        return decision

    async def finish(self, request: RequestUsage, *, failed: bool) -> None:
        """Count what ``request`` used (texts on a worker thread) and buffer it; a failed request
        counts as one request on no index (an index it named may not exist: not a label)."""
        u = request.usage
        u.requests += 1
        u.indexes = () if failed else request.indexes
        if not failed and (request.query_texts or request.documents or request.completions):
            await asyncio.to_thread(self._count_texts, request)
        self.add(u, urgent=request.limited)

    def finish_soon(self, request: RequestUsage, *, failed: bool) -> None:
        """:meth:`finish` on a task of its own (a response's end must not wait for it, and a client
        that disconnects cancels the request's task, not this one); ``stop`` waits for it."""
        task = asyncio.get_running_loop().create_task(self.finish(request, failed=failed))
        self._finishing.add(task)
        task.add_done_callback(self._finishing.discard)

    def _count_texts(self, request: RequestUsage) -> None:
        u = request.usage
        u.embedding_tokens += sum(self.count_tokens(t) for t in request.query_texts)
        u.completion_tokens += sum(counter.count_text(t) for counter, t in request.completions)
        if request.documents:
            u.documents += len(request.documents)
            u.bytes += sum(len(t.encode("utf-8", "surrogatepass")) for t in request.documents)
            if request.documents_embedded:
                u.embedding_tokens += sum(self.count_tokens(t) for t in request.documents)

    def add(self, usage: Usage, *, urgent: bool = False) -> None:
        for idx in usage.indexes or ("",):
            for metric, value in usage.counts().items():
                if value:
                    self.telemetry.usage(usage.key, idx, metric, value)
        self.add_back(Usage(usage.key, usage.indexes, **usage.counts()))  # a copy: the buffer merges into it
        if urgent and self._wake is not None:
            self._wake.set()

    async def flush(self) -> None:
        """Send what is buffered; on failure it is kept for the next flush (and logged).

        A send, once started, runs to its end even when the caller is cancelled (the meter's loop
        stopping, a client leaving ``GET /usage``): the caller only stops waiting. A cancelled call
        may still have been recorded by the owner (a thread or a Ray call runs on), so keeping its
        rows for the next flush would count them twice; its own answer says which."""
        self._start_send()
        if self._sending:  # this one and any under way (GET /usage reads after them)
            await asyncio.shield(asyncio.gather(*self._sending, return_exceptions=True))

    def _start_send(self) -> None:
        """Send the buffer on a task of its own (in ``_sending`` until it ends), if it holds anything."""
        if not self._buffer:
            return
        batch, self._buffer = list(self._buffer.values()), {}
        send = asyncio.get_running_loop().create_task(self._send(batch))
        self._sending.add(send)
        send.add_done_callback(self._sending.discard)

    async def _send(self, batch: list[Usage]) -> None:
        try:
            await self.backend.record(batch)
        except Exception:
            log.exception("could not record usage (%d rows kept for the next flush)", len(batch))
            for u in batch:
                self.add_back(u)

    def add_back(self, usage: Usage) -> None:
        slot = self._buffer.get((usage.key, usage.indexes))
        if slot is None:
            self._buffer[(usage.key, usage.indexes)] = usage
        else:
            slot.merge(usage)

    async def _run(self, wake: asyncio.Event) -> None:
        while True:
            await wait_event(wake, self.interval_s)
            wake.clear()
            await self.flush()

    async def start(self) -> None:
        if self._task is None:
            self._wake = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._run(self._wake))

    async def stop(self, timeout_s: float = STOP_SEND_WAIT_S) -> None:
        """Count what requests left, stop the loop, send what is left and wait for every send (up to
        ``timeout_s``: one whose owner never answers is cancelled, and its rows may be lost, which
        is logged; one that failed is kept in the buffer)."""
        if self._finishing:  # requests that ended but are not counted yet
            await asyncio.gather(*self._finishing, return_exceptions=True)
        if self._task is not None:
            task, self._task, self._wake = self._task, None, None
            await cancel_and_wait(task)
        # Send what is left until nothing is (a send that fails puts its rows back) or time is up.
        deadline = time.monotonic() + timeout_s
        while self._buffer or self._sending:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._start_send()
            _, pending = await asyncio.wait(set(self._sending), timeout=left, return_when=asyncio.FIRST_COMPLETED)
            if self._buffer and not pending:  # the owner refused them just now: not at once again
                await asyncio.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
        late = set(self._sending)
        for send in late:
            send.cancel()
        if late:
            await asyncio.wait(late)
        if late or self._buffer:
            log.error(
                "usage: stopped with %d sends unanswered and %d rows unsent after %.0f s; they are lost",
                len(late),
                len(self._buffer),
                timeout_s,
            )
