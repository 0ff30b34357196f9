"""Ingestion jobs over HTTP (``/jobs``): accepted at once, progress, per-document errors,
cancellation, scoped keys; and a server killed (SIGKILL) in the middle of a job that, started again
on the same storage, finishes it with every document stored exactly once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from ragserve.testing.live import free_port
from tests.live_server import live_app

ADMIN = "sk-jobs"
SCOPED = {"key": "sk-team-a", "indexes": ["team-a*"], "role": "write"}
H = {"Authorization": f"Bearer {ADMIN}"}


def docs(n: int, prefix: str = "doc") -> list[dict[str, Any]]:
    return [
        {"text": f"{prefix} {i}: the part number KR-{1000 + i} ships from warehouse {i % 7}.", "metadata": {"n": i}}
        for i in range(n)
    ]


def wait(base: str, job_id: str, timeout_s: float = 60, headers: dict[str, str] = H) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        r = httpx.get(f"{base}/jobs/{job_id}", headers=headers)
        assert r.status_code == 200, r.text
        job = r.json()
        if job["finished_at"] is not None:
            return job
        assert time.monotonic() < deadline, job
        time.sleep(0.1)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory, embedding_model: Any) -> Iterator[str]:
    from ragserve.testing.embedder import InProcessEmbedder

    with live_app(
        tmp_path_factory.mktemp("jobs"),
        InProcessEmbedder(embedding_model),
        api_keys=[ADMIN, SCOPED],
        job_batch_documents=8,
    ) as (url, _):
        yield url


def test_a_job_is_accepted_at_once_and_indexes_every_document(base: str) -> None:
    r = httpx.post(f"{base}/jobs", json={"index_name": "jobs-a", "documents": docs(30)}, headers=H)
    assert r.status_code == 202, r.text
    job = r.json()
    assert job["status"] in ("queued", "in_progress", "completed") and r.headers["location"] == f"jobs/{job['id']}"
    assert job["counts"]["total"] == 4 and job["documents"]["total"] == 30  # 8 documents a batch
    done = wait(base, job["id"])
    assert done["status"] == "completed" and done["documents"] == {
        "total": 30,
        "indexed": 30,
        "failed": 0,
        "pending": 0,
        "cancelled": 0,
    }
    listed = httpx.get(f"{base}/indexes/jobs-a/documents", params={"limit": 100}, headers=H).json()
    assert listed["total_items"] == 30
    # the same job again stores nothing twice (documents without ids: ids from their content)
    again = httpx.post(f"{base}/jobs", json={"index_name": "jobs-a", "documents": docs(30)}, headers=H).json()
    assert wait(base, again["id"])["status"] == "completed"
    assert httpx.get(f"{base}/indexes/jobs-a/documents", headers=H).json()["total_items"] == 30
    found = httpx.get(f"{base}/jobs", params={"index_name": "jobs-a"}, headers=H).json()
    assert [j["id"] for j in found["data"]] == [again["id"], job["id"]]


def test_a_bad_document_fails_alone_with_its_position(base: str) -> None:
    batch = docs(10)
    batch[3] = {"text": "a repeated id", "doc_id": "same"}
    batch[5] = {"text": "   ", "doc_id": "blank"}  # no content to index
    r = httpx.post(f"{base}/jobs", json={"index_name": "jobs-b", "documents": batch}, headers=H)
    assert r.status_code == 202, r.text
    done = wait(base, r.json()["id"])
    assert done["status"] == "completed"
    assert done["documents"]["indexed"] == 9 and done["documents"]["failed"] == 1, done
    assert [(e["index"], e["doc_id"]) for e in done["errors"]] == [(5, "blank")]
    assert "no content" in done["errors"][0]["message"]


def test_if_exists_keep_leaves_held_documents_over_index_and_jobs(base: str) -> None:
    """``if_exists: keep``: POST /index returns a held document as stored (another hash), a job
    records it as a ``document_exists`` error; the held documents are unchanged. A wrong value is
    a 422 naming the field."""
    held = {"text": "written by another client", "doc_id": "shared", "metadata": {"by": "other"}}
    r = httpx.post(f"{base}/index", json={"index_name": "jobs-keep", "documents": [held]}, headers=H)
    assert r.status_code == 200, r.text
    held_hash = r.json()[0]["hash_value"]
    mine = [{"text": "my copy", "doc_id": "shared"}, {"text": "my new one", "doc_id": "new"}]
    r = httpx.post(f"{base}/index", json={"index_name": "jobs-keep", "documents": mine, "if_exists": "keep"}, headers=H)
    assert r.status_code == 200, r.text
    assert [(d["doc_id"], d["text"], d["hash_value"] == held_hash) for d in r.json()] == [
        ("shared", "written by another client", True),
        ("new", "my new one", False),
    ]
    job_docs = [{"text": "my job copy", "doc_id": "shared"}, *docs(3, "kept-job")]
    body = {"index_name": "jobs-keep", "documents": job_docs, "if_exists": "keep"}
    r = httpx.post(f"{base}/jobs", json=body, headers=H)
    assert r.status_code == 202 and r.json()["meta"]["if_exists"] == "keep", r.text
    done = wait(base, r.json()["id"])
    assert done["documents"]["indexed"] == 3 and done["documents"]["failed"] == 1, done
    assert [(e["index"], e["doc_id"], e["code"]) for e in done["errors"]] == [(0, "shared", "document_exists")]
    got = httpx.get(f"{base}/indexes/jobs-keep/documents/shared", headers=H).json()
    assert got["text"] == "written by another client"
    # replace (the default) still replaces
    r = httpx.post(f"{base}/index", json={"index_name": "jobs-keep", "documents": mine[:1]}, headers=H)
    assert r.status_code == 200 and r.json()[0]["text"] == "my copy"
    for route in ("/index", "/jobs"):
        r = httpx.post(f"{base}{route}", json={**body, "if_exists": "skip"}, headers=H)
        assert r.status_code == 422 and "if_exists" in r.text, r.text


def test_requests_a_job_refuses_before_storing_anything(base: str) -> None:
    bad = [
        ({"index_name": "jobs-c", "documents": []}, 422),
        ({"index_name": "../x", "documents": docs(1)}, 422),
        ({"index_name": "jobs-c", "documents": [{"text": "a", "doc_id": "x"}, {"text": "b", "doc_id": "x"}]}, 400),
    ]
    for body, status in bad:
        r = httpx.post(f"{base}/jobs", json=body, headers=H)
        assert r.status_code == status, (body, r.text)
    nan = '{"index_name": "jobs-c", "documents": [{"text": "x", "metadata": {"v": NaN}}]}'
    r = httpx.post(f"{base}/jobs", content=nan, headers={**H, "Content-Type": "application/json"})
    assert r.status_code == 422 and "not a finite number" in r.text, r.text
    assert httpx.get(f"{base}/jobs", params={"index_name": "jobs-c"}, headers=H).json()["data"] == []
    assert httpx.get(f"{base}/jobs/job_unknown", headers=H).status_code == 404


def test_cancel_stops_what_has_not_started(base: str) -> None:
    r = httpx.post(f"{base}/jobs", json={"index_name": "jobs-d", "documents": docs(400)}, headers=H)
    job_id = r.json()["id"]
    cancelled = httpx.post(f"{base}/jobs/{job_id}/cancel", headers=H).json()
    assert cancelled["status"] == "cancelled"
    done = wait(base, job_id)
    d = done["documents"]
    assert done["status"] == "cancelled" and d["cancelled"] > 0 and d["indexed"] + d["cancelled"] == 400, done
    stored = httpx.get(f"{base}/indexes/jobs-d/documents", headers=H).json().get("total_items", 0)
    assert stored == d["indexed"]  # what is counted indexed is what is there; nothing else


def test_a_scoped_key_sees_and_starts_jobs_only_on_its_indexes(base: str) -> None:
    team = {"Authorization": "Bearer sk-team-a"}
    assert (
        httpx.post(f"{base}/jobs", json={"index_name": "jobs-e", "documents": docs(1)}, headers=team).status_code == 403
    )
    mine = httpx.post(f"{base}/jobs", json={"index_name": "team-a-kb", "documents": docs(2)}, headers=team)
    assert mine.status_code == 202
    wait(base, mine.json()["id"], headers=team)
    seen = {j["index_name"] for j in httpx.get(f"{base}/jobs", headers=team).json()["data"]}
    assert seen == {"team-a-kb"}
    other = httpx.get(f"{base}/jobs", params={"index_name": "jobs-a"}, headers=H).json()["data"][0]["id"]
    # another tenant's job is answered as no job at all: neither its existence nor its index's name
    missing = "job_" + "0" * 32
    for path in (f"/jobs/{other}", f"/jobs/{missing}"):
        got = httpx.get(f"{base}{path}", headers=team)
        assert got.status_code == 404 and "jobs-a" not in got.text, got.text
        assert httpx.post(f"{base}{path}/cancel", headers=team).status_code == 404
    answers = {httpx.get(f"{base}/jobs/{j}", headers=team).json()["detail"].replace(j, "ID") for j in (other, missing)}
    assert len(answers) == 1, answers
    for cursor in (other, missing):  # a cursor of another tenant's is no entry of this key's list
        got = httpx.get(f"{base}/jobs", params={"after": cursor}, headers=team)
        assert got.status_code == 400 and "after names no entry" in got.text, got.text
    assert httpx.get(f"{base}/jobs/{other}", headers=H).status_code == 200
    assert httpx.get(f"{base}/jobs", params={"after": mine.json()["id"]}, headers=team).status_code == 200


def test_another_key_s_job_runs_beside_a_large_one_not_after_it(base: str) -> None:
    """The runner takes keys in turn: the team's one batch runs after at most one more of the
    admin's, while 49 of those are still queued (first in, first out it waited for all 50)."""
    team = {"Authorization": "Bearer sk-team-a"}
    large = httpx.post(f"{base}/jobs", json={"index_name": "jobs-f", "documents": docs(400)}, headers=H).json()
    small = httpx.post(f"{base}/jobs", json={"index_name": "team-a-fair", "documents": docs(3)}, headers=team)
    assert small.status_code == 202, small.text
    assert wait(base, small.json()["id"], headers=team)["status"] == "completed"
    counts = httpx.get(f"{base}/jobs/{large['id']}", headers=H).json()["counts"]
    assert counts["total"] == 50 and counts["queued"] >= 40, counts
    httpx.post(f"{base}/jobs/{large['id']}/cancel", headers=H)
    wait(base, large["id"])


# --- a kill in the middle of a job ------------------------------------------------------------------
def _start(storage: Path, port: int) -> subprocess.Popen[bytes]:
    settings = ["job_batch_documents=10", "job_concurrency=1", "num_shards=2"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "ragserve.testing.serve_process", str(storage), str(port), *settings],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(
                f"the server did not start: {proc.stderr.read().decode()[-2000:] if proc.stderr else ''}"
            )
        time.sleep(0.2)


@pytest.mark.slow
def test_a_job_survives_a_kill_and_stores_every_document_once(tmp_path: Path) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = _start(tmp_path, port)
    try:
        many = docs(300, "crash")
        many[7]["doc_id"] = "given-7"  # one with a client id: replaced, never doubled
        job = httpx.post(f"{base}/jobs", json={"index_name": "crash", "documents": many}).json()
        deadline = time.monotonic() + 60
        while httpx.get(f"{base}/jobs/{job['id']}").json()["counts"]["completed"] < 3:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # no shutdown: what a crash or an OOM kill does
        proc.wait()
    proc = _start(tmp_path, port)
    try:
        done = wait(base, job["id"], timeout_s=120, headers={})
        assert done["status"] == "completed" and done["documents"]["indexed"] == 300, done
        seen: list[str] = []
        while True:
            page = httpx.get(f"{base}/indexes/crash/documents", params={"limit": 100, "offset": len(seen)}).json()
            seen += [d["doc_id"] for d in page["documents"]]
            if not page["documents"]:
                break
        assert page["total_items"] == 300 and len(seen) == 300 and len(set(seen)) == 300 and "given-7" in seen
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


# --- the webhook, as configured -----------------------------------------------------------------
class _Receiver(BaseHTTPRequestHandler):
    """A job-event endpoint that is down (503) for its first request, then takes them."""

    received: list[tuple[bytes, dict[str, str]]] = []  # noqa: RUF012 - one test uses it

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        self.received.append((body, dict(self.headers.items())))
        self.send_response(503 if len(self.received) == 1 else 200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_a_configured_webhook_announces_the_end_signed_and_retried(tmp_path: Path, embedding_model: Any) -> None:
    """``job_webhook_url`` and ``job_webhook_secret`` in the settings: a job that ends is announced
    once, in an event the openai SDK verifies, after the endpoint's first failure; the job itself
    ends without waiting for it. A job that asks for no webhook gets none."""
    import base64

    from openai import OpenAI

    from ragserve.testing.embedder import InProcessEmbedder

    secret = "whsec_" + base64.b64encode(b"a secret of the test").decode()
    _Receiver.received = []
    receiver = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    try:
        with live_app(
            tmp_path,
            InProcessEmbedder(embedding_model),
            job_webhook_url=f"http://127.0.0.1:{receiver.server_address[1]}/hook",
            job_webhook_secret=secret,
        ) as (base, _):
            quiet = httpx.post(f"{base}/jobs", json={"index_name": "hooked", "documents": docs(2), "webhook": False})
            job = httpx.post(f"{base}/jobs", json={"index_name": "hooked", "documents": docs(3)}).json()
            assert wait(base, quiet.json()["id"], headers={})["status"] == "completed"
            assert wait(base, job["id"], headers={})["status"] == "completed"
            deadline = time.monotonic() + 30
            while len(_Receiver.received) < 2:  # the refused attempt, then the delivery (backoff ~1 s)
                assert time.monotonic() < deadline, _Receiver.received
                time.sleep(0.1)
    finally:
        receiver.shutdown()
        receiver.server_close()
    (first, headers1), (body, headers) = _Receiver.received
    assert first == body and headers1["webhook-id"] == headers["webhook-id"]  # the same event, again
    event = OpenAI(api_key="unused", webhook_secret=secret).webhooks.unwrap(body, headers)
    assert event.type == "job.completed" and event.data.id == job["id"]  # type: ignore[union-attr]
    assert json.loads(body)["data"]["counts"]["completed"] == 1
