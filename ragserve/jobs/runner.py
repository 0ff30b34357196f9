"""The job runner: claims items from the store and runs the caller's handler on them, a few at a time.

One asyncio task claims items (oldest job first, items in order) while a slot is free; each item
runs on its own task, at most ``concurrency`` at once, so a large job leaves the rest of the
server's capacity to queries. Every store call goes through ``asyncio.to_thread``: SQLite's fsync
never stalls the event loop that also serves requests.

What an item's outcome becomes:

- the handler returns a dict: the item is ``completed`` with it as its ``result``;
- it raises a ``ServiceError``: the item is ``failed`` with ``{"code": err.code or the class name,
  "message": err.message}`` — the client's own problem (an unreadable file, say), so it is not
  retried;
- it raises anything else: ``failed`` with code ``internal_error`` and a message that reveals
  nothing of the server; the traceback goes to the log;
- it returns something the store cannot keep (not a dict, NaN): ``failed``, code ``invalid_result``;
- the process dies or ``stop`` gives up on it: the item stays ``in_progress`` and the next
  ``start`` puts it back in the queue (``JobStore.recover``), so it runs again — which is why a
  handler must be idempotent (deterministic document ids, add-replaces).

A running item's lease is renewed every third of ``lease_s``, so a slow item is not taken for a
dead one. Cancelling a job stops its queued items from being claimed, and an item already running
is stopped within ``CHECK_S`` (its task cancelled: the embedding batches not yet sent are never
sent) and recorded ``cancelled``; what it had already written stays, document by document, as
after a client that leaves ``POST /index``. The same holds for a job that ends otherwise while an
item runs (failed, or gone). When an item's end ends its job, the webhook delivery the store
enqueued is handed to the notifier at once (``wake``), which sends it on its own task.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from ragserve import tracing
from ragserve.aio import wait_ended, wait_event
from ragserve.errors import BadRequestError, ConflictError, NotFoundError, ServiceError
from ragserve.jobs.store import TERMINAL, Job, JobItem, JobStore
from ragserve.jobs.webhook import WebhookNotifier, set_from_any_thread

log = logging.getLogger("ragserve.jobs")

#: Does one item's work and returns what to record as its result.
Handler = Callable[[Job, JobItem], Awaitable[Mapping[str, Any]]]
#: How often a running item's job is looked at (seconds): how soon a cancel stops the item.
CHECK_S = 1.0
#: The message of an item failed by an unexpected exception: the details are in the server's log only.
INTERNAL_MESSAGE = "the item could not be processed because of an internal error"


class JobRunner:
    """Runs the store's queued items through ``handler``; see the module docstring.

    ``owner`` names this runner in item leases (default: host, pid and a random suffix).
    ``start`` assumes this runner is the only one on its store: it takes back *every* item left
    ``in_progress`` (a previous process's), which is right for one server per store file.
    ``max_attempts`` is how many claims an item gets before a crash that keeps killing its worker
    fails it (code ``interrupted``). A ``notifier`` is started and stopped with the runner.
    """

    def __init__(
        self,
        store: JobStore,
        handler: Handler,
        *,
        concurrency: int = 1,
        lease_s: float = 300.0,
        poll_s: float = 1.0,
        notifier: WebhookNotifier | None = None,
        owner: str | None = None,
        max_attempts: int = 3,
    ):
        if concurrency < 1 or lease_s <= 0 or poll_s <= 0 or max_attempts < 1:
            raise ValueError("a job runner needs concurrency >= 1, lease_s > 0, poll_s > 0 and max_attempts >= 1")
        self._store = store
        self._handler = handler
        self.concurrency = concurrency
        self.lease_s = lease_s
        self.poll_s = poll_s
        self.max_attempts = max_attempts
        self._notifier = notifier
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wakeup: asyncio.Event | None = None
        self._slots: asyncio.Semaphore | None = None
        self._task: asyncio.Task[None] | None = None
        self._running: set[asyncio.Task[None]] = set()
        self._claiming = False
        self._stopping = False

    @property
    def alive(self) -> bool:
        """Whether the claim loop runs (started, not stopped, not ended by an error)."""
        return self._task is not None and not self._task.done()

    @property
    def in_flight(self) -> int:
        """How many items are running now."""
        return len(self._running)

    async def start(self) -> None:
        """Take back what a previous process left running, then start claiming."""
        if self._task is not None:
            raise RuntimeError("the job runner is already running")
        self._loop = asyncio.get_running_loop()
        self._wakeup = asyncio.Event()
        self._slots = asyncio.Semaphore(self.concurrency)
        self._stopping = False
        recovered = await asyncio.to_thread(self._store.recover, expired_only=False, max_attempts=self.max_attempts)
        if recovered:
            log.warning("took back %d job items left running by a previous process", recovered)
        if self._notifier is not None:
            await self._notifier.start()
            self._notifier.wake()  # the recovery may have ended jobs, and deliveries may be pending
        self._task = asyncio.create_task(self._claim_loop(), name="job-runner")

    async def stop(self, timeout_s: float = 30.0) -> None:
        """Stop claiming, give running items ``timeout_s`` to finish, then cancel the rest (they
        stay ``in_progress`` and run again after the next ``start``)."""
        self._stopping = True
        if self._wakeup is not None:
            self._wakeup.set()
        task, self._task = self._task, None
        if task is not None:
            if not self._claiming:  # a claim in flight is let through, so the item it takes is run, not lost
                task.cancel()
            await wait_ended(task)
        if self._running:
            _, late = await asyncio.wait(set(self._running), timeout=timeout_s)
            for t in late:
                t.cancel()
            if late:
                log.warning(
                    "stopped %d job items still running after %.0f s; they will run again", len(late), timeout_s
                )
                await asyncio.gather(*late, return_exceptions=True)
        if self._notifier is not None:
            await self._notifier.stop()

    def wake(self) -> None:
        """Something changed (a job was created or cancelled): look for work, and for webhooks to
        send, now rather than at the next poll. Safe to call from any thread."""
        set_from_any_thread(self._loop, self._wakeup)
        if self._notifier is not None:
            self._notifier.wake()

    async def wait(self, job_id: str, timeout_s: float | None = None, poll_s: float = 0.05) -> Job:
        """The job once it is ``done`` (ended, nothing of it running); ``TimeoutError`` after ``timeout_s``."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not (job := await asyncio.to_thread(self._store.get, job_id)).done:
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"job {job_id} is still {job.status} after {timeout_s} s")
            await asyncio.sleep(poll_s)
        return job

    # --- the loop -----------------------------------------------------------------------------
    async def _claim_loop(self) -> None:
        assert self._slots is not None and self._wakeup is not None
        while not self._stopping:
            await self._slots.acquire()
            self._wakeup.clear()  # before the claim: a wake() while it runs is not lost
            self._claiming = True
            try:
                claimed = await asyncio.to_thread(self._store.claim, self.owner, self.lease_s)
            except Exception:
                log.exception("claiming a job item failed; trying again in %.1f s", self.poll_s)
                claimed = None
            finally:
                self._claiming = False
            if claimed is None:
                self._slots.release()
                await wait_event(self._wakeup, self.poll_s)
                continue
            task = asyncio.create_task(self._run(*claimed), name=f"job-item-{claimed[0].id}-{claimed[1].seq}")
            self._running.add(task)
            task.add_done_callback(self._item_done)

    def _item_done(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        assert self._slots is not None
        self._slots.release()
        if not task.cancelled() and task.exception() is not None:
            log.error("a job item task failed", exc_info=task.exception())

    async def _run(self, job: Job, item: JobItem) -> None:
        work = asyncio.ensure_future(self._work(job, item))
        watcher = asyncio.create_task(self._watch(item, work))
        try:
            result = await work
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if not (watcher.done() and not watcher.cancelled() and watcher.result()) or (
                current is not None and current.cancelling()
            ):
                raise  # ``stop``: the item stays in progress and runs again after the next start
            await self._record(job, item, None, None, cancelled=True)  # its job ended while it ran
        except ServiceError as e:
            code = _text(str(e.code)) if e.code is not None else type(e).__name__
            await self._record(job, item, None, {"code": code or type(e).__name__, "message": _text(e.message)})
        except Exception:
            log.exception("job %s item %r (attempt %d) failed", job.id, item.key, item.attempts)
            await self._record(job, item, None, {"code": "internal_error", "message": INTERNAL_MESSAGE})
        else:
            await self._record(job, item, result, None)
        finally:
            watcher.cancel()
            work.cancel()

    async def _work(self, job: Job, item: JobItem) -> Mapping[str, Any]:
        # each item's run is a trace of its own (docs/architecture.md §7): its chunking,
        # embedding and shard writes are its children
        with tracing.span("job.item", _span_attributes(job, item) if tracing.ENABLED else None):
            return await self._handler(job, item)

    async def _record(
        self, job: Job, item: JobItem, result: Any, error: dict[str, str] | None, *, cancelled: bool = False
    ) -> None:
        """Record the outcome under this claim (``attempt``); a result the store refuses fails the item."""
        store, attempt = self._store, item.attempts
        try:
            try:
                if cancelled:
                    ended = await asyncio.to_thread(store.cancel_item, job.id, item.key, attempt=attempt)
                elif error is None:
                    ended = await asyncio.to_thread(store.complete_item, job.id, item.key, result, attempt=attempt)
                else:
                    ended = await asyncio.to_thread(store.fail_item, job.id, item.key, error, attempt=attempt)
            except BadRequestError as e:
                invalid = {"code": "invalid_result", "message": e.message}
                ended = await asyncio.to_thread(store.fail_item, job.id, item.key, invalid, attempt=attempt)
        except (ConflictError, NotFoundError) as e:
            # The claim is no longer this item's (recovered and claimed again) or the job is gone.
            log.warning("job %s item %r: outcome not recorded: %s", job.id, item.key, e.message)
            return
        if ended.done and ended.webhook and self._notifier is not None:
            self._notifier.wake()

    async def _watch(self, item: JobItem, work: asyncio.Future[Any]) -> bool:
        """While ``item`` runs: renew its lease every third of ``lease_s`` and, every ``CHECK_S``,
        look at its job. A job that has ended meanwhile (cancelled, also by deleting its vector
        store; failed; gone) stops the item: ``work`` is cancelled and True returned, so an item of
        hours is not left running for a job nobody wants."""
        renew_every = self.lease_s / 3
        next_renew = time.monotonic() + renew_every
        renewing = True
        while True:
            await asyncio.sleep(max(0.0, min(CHECK_S, next_renew - time.monotonic())))
            try:
                job = await asyncio.to_thread(self._store.get, item.job_id)
            except NotFoundError:
                job = None
            except Exception:
                log.exception("reading job %s while its item %r ran failed", item.job_id, item.key)
                continue
            if job is None or job.status in TERMINAL:
                log.info("job %s ended while its item %r ran: stopping the item", item.job_id, item.key)
                work.cancel()
                return True
            if not renewing or time.monotonic() < next_renew:
                continue
            next_renew = time.monotonic() + renew_every
            try:
                held = await asyncio.to_thread(self._store.renew, item.job_id, item.key, item.attempts, self.lease_s)
            except Exception:
                log.exception("renewing the lease of job %s item %r failed", item.job_id, item.key)
                continue
            if not held:
                log.warning("job %s item %r: its lease was lost while it ran", item.job_id, item.key)
                renewing = False


def _span_attributes(job: Job, item: JobItem) -> dict[str, Any]:
    return {
        "ragserve.job_id": job.id,
        "ragserve.job_kind": job.kind,
        "ragserve.index": tracing.names([job.index]),
        "ragserve.job_item": item.seq,
        "ragserve.job_attempt": item.attempts,
    }


def _text(value: str) -> str:
    """``value`` with anything that is not Unicode (a lone surrogate from a decoded file name) as ``?``,
    so an error message can always be stored and shown."""
    return value.encode("utf-8", "replace").decode("utf-8")
