"""Webhooks: signed so the openai SDK verifies them, retried with backoff and persisted, given up after
max_attempts, and a delivery left pending by a dead process is sent by the next notifier."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from ragserve.jobs.store import JobStore
from ragserve.jobs.webhook import WebhookNotifier, event_body, sign, validate_webhook_url, webhook_key
from tests.unit.jobs.polling import eventually

SECRET = "whsec_" + base64.b64encode(b"a 32 byte key for the test hooks").decode()
URL = "https://hooks.example.test/ragserve"


def verify(body: bytes | str, headers: Any, secret: str = SECRET) -> dict[str, Any]:
    """What a receiver does with the openai SDK: raises unless the signature is right and fresh."""
    openai.OpenAI(api_key="unused", webhook_secret=secret).webhooks.verify_signature(body, headers)
    return json.loads(body)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[JobStore]:
    with JobStore(tmp_path / "jobs.sqlite") as s:
        yield s


def ended_job(store: JobStore, *, fail: bool = False) -> str:
    job = store.create("vector_store_file", "docs", [("file-1", {"path": "a.txt"})], meta={"vs": "vs_1"}, webhook=True)
    claimed = store.claim("t", 60)
    assert claimed is not None
    if fail:
        store.fail_item(job.id, "file-1", {"code": "bad_file", "message": "unreadable"})
    else:
        store.complete_item(job.id, "file-1", {"chunks": 3})
    return job.id


class Receiver:
    """An httpx transport that answers ``statuses`` in turn (an exception is raised), then 200."""

    def __init__(self, *statuses: int | Exception):
        self.statuses = list(statuses)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.statuses.pop(0) if self.statuses else 200
        if isinstance(answer, Exception):
            raise answer
        return httpx.Response(answer)

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.MockTransport(self))


@pytest.mark.parametrize("secret", [SECRET, "a plain shared secret"])
def test_the_signature_verifies_with_the_openai_sdk(secret: str) -> None:
    body = '{"id":"evt_1","type":"job.completed"}'
    now = int(time.time())
    headers = {"webhook-id": "evt_1", "webhook-timestamp": str(now), "webhook-signature": ""}
    headers["webhook-signature"] = sign(webhook_key(secret), "evt_1", now, body)
    assert verify(body, headers, secret)["type"] == "job.completed"
    with pytest.raises(openai.InvalidWebhookSignatureError):
        verify(body.replace("completed", "failed"), headers, secret)
    with pytest.raises(openai.InvalidWebhookSignatureError):
        verify(body, headers, "whsec_" + base64.b64encode(b"another key").decode())


def test_secrets_and_urls_are_checked_up_front() -> None:
    assert webhook_key(SECRET) == b"a 32 byte key for the test hooks"
    assert webhook_key("plain") == b"plain"
    for bad in ("", "whsec_", "whsec_not base64!"):
        with pytest.raises(ValueError):
            webhook_key(bad)
    for good in ("http://127.0.0.1:8080/hook", "https://example.com/a?token=x"):
        assert validate_webhook_url(good) == good
    for bad in ("ftp://example.com/x", "https://", "example.com/h", "http://h:port/x", " http://h/x", "http://h/a b"):
        with pytest.raises(ValueError):
            validate_webhook_url(bad)
    with pytest.raises(ValueError):
        WebhookNotifier(JobStore.__new__(JobStore), "file:///etc/passwd", SECRET)


def test_backoff_doubles_with_jitter_and_is_capped() -> None:
    notifier = WebhookNotifier(JobStore.__new__(JobStore), URL, SECRET, base_delay_s=1.0, max_delay_s=10.0)
    for attempts, full in ((1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (5, 10.0), (200, 10.0)):
        for _ in range(20):
            assert full * 0.5 <= notifier.backoff_s(attempts) <= full
    assert "whsec" not in repr(notifier) and "example" not in repr(notifier)


async def test_a_failing_endpoint_is_retried_until_it_answers_2xx(store: JobStore) -> None:
    job_id = ended_job(store)
    receiver = Receiver(500, httpx.ConnectError("refused"), 302)
    async with receiver.client() as client:
        notifier = WebhookNotifier(store, URL, SECRET, client=client, base_delay_s=0.01, max_delay_s=0.02)
        sent = 0
        while store.list_deliveries(job_id)[0].status == "pending" and sent < 10:
            sent += await notifier.deliver_due()
            await asyncio.sleep(0.02)
    [delivery] = store.list_deliveries(job_id)
    assert (delivery.status, delivery.attempts, delivery.last_error) == ("delivered", 4, None)
    assert len(receiver.requests) == 4 and {r.headers["webhook-id"] for r in receiver.requests} == {delivery.id}
    last = receiver.requests[-1]
    event = verify(last.content, last.headers)
    assert event["id"] == delivery.id and event["type"] == "job.completed"
    assert event["data"]["id"] == job_id and event["data"]["status"] == "completed"
    assert event["data"]["counts"]["completed"] == 1 and event["data"]["meta"] == {"vs": "vs_1"}
    assert last.headers["content-type"] == "application/json"
    assert last.content.decode() == event_body(delivery)


async def test_a_dead_endpoint_is_given_up_after_max_attempts(store: JobStore, caplog: Any) -> None:
    job_id = ended_job(store, fail=True)
    receiver = Receiver(*[httpx.ConnectTimeout("timed out")] * 10)
    caplog.set_level(logging.DEBUG, logger="ragserve.jobs")
    async with receiver.client() as client:
        notifier = WebhookNotifier(
            store, URL, SECRET, client=client, max_attempts=3, base_delay_s=0.01, max_delay_s=0.01, poll_s=0.05
        )
        await notifier.start()
        try:
            await eventually(lambda: store.list_deliveries(job_id)[0].status != "pending")
        finally:
            await notifier.stop()
    [delivery] = store.list_deliveries(job_id)
    assert (delivery.status, delivery.attempts, delivery.type) == ("failed", 3, "job.failed")
    assert delivery.last_error == "ConnectTimeout: timed out"
    assert len(receiver.requests) == 3
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "gave up" in logged and SECRET not in logged and "hooks.example.test" not in logged


async def test_a_delivery_left_by_a_dead_process_is_sent_by_the_next_notifier(tmp_path: Path) -> None:
    path = tmp_path / "jobs.sqlite"
    with JobStore(path) as first:  # a process ends a job, then dies before (or while) sending
        job_id = ended_job(first)
        second_id = ended_job(first)
        assert first.claim_delivery(lease_s=0.2) is not None  # taken by a sender that then died
    receiver = Receiver()
    with JobStore(path) as store:
        async with receiver.client() as client:
            notifier = WebhookNotifier(store, URL, SECRET, client=client, poll_s=0.05)
            await notifier.start()
            try:
                await eventually(lambda: {d.status for d in store.list_deliveries()} == {"delivered"})
            finally:
                await notifier.stop()
    assert sorted(json.loads(r.content)["data"]["id"] for r in receiver.requests) == sorted([job_id, second_id])
    for request in receiver.requests:
        verify(request.content, request.headers)


class _Hook(BaseHTTPRequestHandler):
    fail_first = 2
    received: list[tuple[bytes, dict[str, str]]] = []  # noqa: RUF012 - set per test below

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        self.received.append((body, dict(self.headers.items())))
        self.send_response(503 if len(self.received) <= self.fail_first else 204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


async def test_a_real_http_receiver_that_fails_twice_gets_one_verified_delivery(store: JobStore) -> None:
    _Hook.received = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        job_id = ended_job(store)
        url = f"http://127.0.0.1:{server.server_address[1]}/hook"
        notifier = WebhookNotifier(store, url, SECRET, base_delay_s=0.01, max_delay_s=0.02, poll_s=0.05)
        await notifier.start()
        try:
            await eventually(lambda: store.list_deliveries(job_id)[0].status != "pending")
        finally:
            await notifier.stop()
    finally:
        server.shutdown()
        server.server_close()
    [delivery] = store.list_deliveries(job_id)
    assert (delivery.status, delivery.attempts, delivery.last_error) == ("delivered", 3, None)
    assert len(_Hook.received) == 3
    body, headers = _Hook.received[-1]
    event = verify(body, headers)
    assert event["data"]["id"] == job_id and headers["webhook-id"] == delivery.id
