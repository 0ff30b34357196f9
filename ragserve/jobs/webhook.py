"""Job-end webhooks: signed per Standard Webhooks, delivered by a background task, retried durably.

The store enqueues a delivery in the transaction that ends a job (``ragserve.jobs.store``), so a
crash between the two cannot lose it; this module sends them. The wire format is Standard Webhooks
(https://www.standardwebhooks.com/), what OpenAI's own webhooks use, so a receiver can verify one
with ``openai.OpenAI(webhook_secret=...).webhooks.unwrap(body, headers)`` or any Standard Webhooks
library:

- headers ``webhook-id`` (the event id, the same on every retry, for the receiver's deduplication),
  ``webhook-timestamp`` (unix seconds of *this attempt*: verifiers refuse a timestamp more than
  five minutes off, so a retry an hour later is signed afresh) and
  ``webhook-signature: v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">``;
- the key is the secret's base64 after ``whsec_``, or the secret's UTF-8 bytes when it has no
  such prefix (what ``openai``'s ``verify_signature`` does);
- the body is ``{"id", "type": "job.completed"|"job.failed"|"job.cancelled", "created_at", "data"}``,
  ``data`` the job's summary when it ended.

A 2xx answer is a delivery; any other status (a redirect included: it is not followed), a
connection error or a timeout is retried after an exponential, jittered, capped delay, persisted
in the store so it survives a restart, until ``max_attempts``; then the delivery is ``failed`` and
kept for inspection. Deliveries go one at a time, oldest due first, on their own task: a slow or
dead endpoint delays other webhooks, never ingestion. The secret is never logged, nor is the URL
(it may carry a token); a delivery is named by its id.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import json
import logging
import random
import time
from typing import Any
from urllib.parse import urlsplit

import httpx

from ragserve.aio import cancel_and_wait, wait_event, within
from ragserve.jobs.store import Delivery, JobStore

log = logging.getLogger("ragserve.jobs.webhook")
SECRET_PREFIX = "whsec_"


def validate_webhook_url(url: str) -> str:
    """``url`` if it is an absolute http(s) URL with a host, else ``ValueError`` (for a settings
    validator: a webhook that can never be delivered should fail at startup, not at a job's end)."""
    if not isinstance(url, str) or url != url.strip() or any(c.isspace() for c in url):
        raise ValueError("the webhook URL must be a URL without spaces")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError as e:
        raise ValueError(f"the webhook URL is not a valid URL: {e}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("the webhook URL must be an http:// or https:// URL with a host")
    return url


def webhook_key(secret: str) -> bytes:
    """The HMAC key of a secret: the base64 after ``whsec_``, else the secret's UTF-8 bytes."""
    if not isinstance(secret, str) or not secret:
        raise ValueError("the webhook secret must be a non-empty string")
    if secret.startswith(SECRET_PREFIX):
        try:
            key = base64.b64decode(secret[len(SECRET_PREFIX) :], validate=True)
        except binascii.Error:
            raise ValueError("a webhook secret that starts with whsec_ must be base64 after it") from None
        if not key:
            raise ValueError("the webhook secret is empty after whsec_")
        return key
    return secret.encode("utf-8")


def sign(key: bytes, event_id: str, timestamp: int, body: str) -> str:
    """The ``webhook-signature`` header value for one attempt."""
    mac = hmac.new(key, f"{event_id}.{timestamp}.{body}".encode(), hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode("ascii")


def event_body(delivery: Delivery) -> str:
    """The JSON body of a delivery (ASCII: the bytes a receiver verifies survive any re-encoding)."""
    event: dict[str, Any] = {
        "id": delivery.id,
        "type": delivery.type,
        "created_at": delivery.created_at,
        "data": delivery.data,
    }
    return json.dumps(event, separators=(",", ":"))


def set_from_any_thread(loop: asyncio.AbstractEventLoop | None, event: asyncio.Event | None) -> None:
    """Set ``event`` of ``loop`` from this thread or any other (an ``asyncio.Event`` may only be
    set on its own loop); nothing before the loop runs or after it closed."""
    if loop is None or event is None or loop.is_closed():
        return
    try:
        same = asyncio.get_running_loop() is loop
    except RuntimeError:
        same = False
    if same:
        event.set()
    else:
        loop.call_soon_threadsafe(event.set)


class WebhookNotifier:
    """Delivers the store's pending webhook deliveries to one URL from a background task.

    ``start``/``stop`` own the task (and the HTTP client, unless one is given); ``wake`` says a
    delivery may be due now (a job just ended); ``deliver_due`` sends what is due once, for tests
    and for callers that want no task.
    """

    def __init__(
        self,
        store: JobStore,
        url: str,
        secret: str,
        *,
        client: httpx.AsyncClient | None = None,
        max_attempts: int = 8,
        base_delay_s: float = 1.0,
        max_delay_s: float = 300.0,
        timeout_s: float = 10.0,
        poll_s: float = 30.0,
    ):
        if max_attempts < 1 or base_delay_s < 0 or max_delay_s < base_delay_s or timeout_s <= 0 or poll_s <= 0:
            raise ValueError("webhook delivery needs max_attempts >= 1, 0 <= base_delay_s <= max_delay_s, timeouts > 0")
        self._store = store
        self._url = validate_webhook_url(url)
        self._key = webhook_key(secret)
        self._client = client
        self._own_client = client is None
        self.max_attempts = max_attempts
        self.base_delay_s = base_delay_s
        self.max_delay_s = max_delay_s
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self._task: asyncio.Task[None] | None = None
        self._wakeup: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def __repr__(self) -> str:  # no secret, no URL
        return f"WebhookNotifier(max_attempts={self.max_attempts})"

    async def start(self) -> None:
        if self._task is not None:
            raise RuntimeError("the webhook notifier is already running")
        self._loop = asyncio.get_running_loop()
        self._wakeup = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name="webhook-notifier")

    async def stop(self) -> None:
        """Stop sending. A delivery cut off mid-send stays pending and is sent again once its claim
        lapses (``timeout_s`` after it was taken, plus a margin)."""
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)
        if self._own_client and self._client is not None:
            await self._client.aclose()
            self._client = None

    def wake(self) -> None:
        """A delivery may be due now; safe to call from any thread."""
        set_from_any_thread(self._loop, self._wakeup)

    def backoff_s(self, attempts: int) -> float:
        """The delay before the next try after ``attempts`` failed ones: doubling from
        ``base_delay_s``, capped at ``max_delay_s``, scaled by a random 50-100% so that receivers
        that fail together are not retried together."""
        delay = min(self.max_delay_s, self.base_delay_s * 2.0 ** min(attempts - 1, 60))
        return delay * random.uniform(0.5, 1.0)

    async def deliver_due(self) -> int:
        """Send every delivery that is due now, oldest first; returns how many attempts were made."""
        sent = 0
        lease_s = self.timeout_s * 2 + 5
        while (delivery := await asyncio.to_thread(self._store.claim_delivery, lease_s)) is not None:
            await self._attempt(delivery)
            sent += 1
        return sent

    async def _attempt(self, delivery: Delivery) -> None:
        body = event_body(delivery)
        timestamp = int(time.time())
        headers = {
            "content-type": "application/json",
            "user-agent": "ragserve-webhooks",
            "webhook-id": delivery.id,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": sign(self._key, delivery.id, timestamp, body),
        }
        if self._client is None:
            self._client = httpx.AsyncClient(follow_redirects=False)
            self._own_client = True
        error: str | None = None
        try:
            # httpx's timeout bounds each network step; within bounds the whole attempt (a
            # receiver that trickles its answer).
            status = await within(self._post(body, headers), self.timeout_s)
            if not 200 <= status < 300:
                error = f"HTTP {status}"
        except httpx.HTTPError as e:
            error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        except asyncio.TimeoutError:  # not the builtin TimeoutError before Python 3.11
            error = f"no answer within {self.timeout_s:g} s"
        except Exception as e:  # counted as a failed attempt, so a surprise cannot retry it for ever
            log.exception("webhook %s of job %s: unexpected error while sending", delivery.id, delivery.job_id)
            error = type(e).__name__
        attempts = delivery.attempts + 1
        retry_at = None
        if error is not None and attempts < self.max_attempts:
            retry_at = time.time() + self.backoff_s(attempts)
        if error is None:
            log.info("webhook %s (%s of job %s) delivered", delivery.id, delivery.type, delivery.job_id)
        elif retry_at is None:
            log.error(
                "webhook %s of job %s failed %d times; gave up: %s", delivery.id, delivery.job_id, attempts, error
            )
        else:
            log.warning("webhook %s of job %s failed (attempt %d): %s", delivery.id, delivery.job_id, attempts, error)
        await asyncio.to_thread(
            self._store.record_delivery_attempt, delivery.id, delivered=error is None, error=error, retry_at=retry_at
        )

    async def _post(self, body: str, headers: dict[str, str]) -> int:
        """POST one attempt and return the status; the answer is streamed and never read (only the
        status matters, and a receiver's large answer is not downloaded)."""
        assert self._client is not None
        async with self._client.stream(
            "POST", self._url, content=body.encode("ascii"), headers=headers, timeout=self.timeout_s
        ) as response:
            return response.status_code

    async def _run(self) -> None:
        assert self._wakeup is not None
        while True:
            self._wakeup.clear()  # before looking, so a wake() during the pass is not lost
            due: float | None = None
            try:
                await self.deliver_due()
                due = await asyncio.to_thread(self._store.next_delivery_at)
            except Exception:
                log.exception("webhook delivery pass failed; trying again in %.0f s", self.poll_s)
            wait_s = self.poll_s if due is None else min(self.poll_s, max(0.0, due - time.time()))
            await wait_event(self._wakeup, wait_s)
