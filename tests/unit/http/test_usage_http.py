"""Usage metering, budgets and rate limits per key over HTTP, in-process (real shards, chunker and
MiniLM; a fake upstream whose token counts are known): counts after chat (whole and streamed),
/query, /retrieve over two indexes, /v1/embeddings, /index and /jobs; 429s with OpenAI's headers;
a stream never cut off by its budget; GET /usage and its scope; kept across a restart; /metrics
hiding key names."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from ragserve.config import Settings
from ragserve.http.errors import reset_text
from ragserve.ingest import hf_token_counter
from ragserve.models.tokenizers import counter_for_model
from ragserve.testing.fake_openai import FakeOpenAI
from ragserve.testing.inprocess import inprocess_app

ADMIN = "sk-usage-admin-0123456789"
TEAM_A = "sk-usage-team-a-0123456789"
SCOPED_ADMIN = "sk-usage-pumps-admin-0123"
RPM = "sk-usage-rpm-0123456789"
TPD = "sk-usage-tpd-0123456789"
BARE = "sk-usage-bare-0123456789"
KEYS: list[Any] = [
    {"key": ADMIN, "name": "ops", "role": "admin"},
    {"key": TEAM_A, "name": "team-a", "indexes": ["pumps", "lamps"], "role": "write"},
    {"key": SCOPED_ADMIN, "name": "pumps-admin", "indexes": ["pumps"], "role": "admin"},
    {"key": RPM, "name": "rpm", "indexes": ["pumps"], "role": "read", "requests_per_minute": 3},
    {"key": TPD, "name": "tpd", "indexes": ["pumps"], "role": "read", "tokens_per_day": 10},
    BARE,
]
PUMPS = [{"doc_id": "zephyr", "text": "The Zephyr X200 is a submersible pump for garden ponds, 2000 litres per hour."}]
LAMPS = [{"doc_id": "lumen", "text": "The Lumen desk lamp charges its battery over USB-C in two hours."}]
ANSWER = "The Zephyr X200 moves 2000 litres [1]."


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(answer=ANSWER, model="fake-model", max_model_len=4096) as f:
        yield f


@pytest.fixture
def app(tmp_path, embedder, fake) -> Iterator[TestClient]:
    with inprocess_app(tmp_path, embedder, fake.url, api_keys=KEYS) as (application, _), TestClient(application) as c:
        for index, docs in (("pumps", PUMPS), ("lamps", LAMPS)):
            assert (
                c.post("/index", json={"index_name": index, "documents": docs}, headers=bearer(ADMIN)).status_code
                == 200
            )
        yield c


def rows(client: TestClient, key: str = ADMIN, **params: Any) -> dict[tuple[str, str], dict[str, Any]]:
    """GET /usage as rows by (key name, index), once what the requests before used is recorded (it is
    counted after each response: poll until the previous request's row settles)."""
    response = client.get("/usage", params=params, headers=bearer(key))
    assert response.status_code == 200, response.text
    return {(r["key"], r["index"]): r for r in response.json()["data"]}


def settled(client: TestClient, want: tuple[str, str], metric: str, value: int, timeout: float = 5.0) -> dict:
    """The row ``want`` once its ``metric`` reached ``value`` (usage is recorded after the response)."""
    deadline = time.monotonic() + timeout
    while True:
        got = rows(client).get(want)
        if (got is not None and got[metric] >= value) or time.monotonic() > deadline:
            assert got is not None, rows(client)
            return got
        time.sleep(0.05)


def fake_prompt_tokens(body: dict[str, Any]) -> int:
    """What the fake upstream reports as prompt tokens for ``body``."""
    return sum(len(str(m["content"]).split()) + 4 for m in body["messages"])


def test_chat_counts_the_upstreams_tokens_and_the_query_embedding(app, fake, embedder) -> None:
    question = "How much water does the Zephyr pump move?"
    body = {"model": "fake-model", "index_name": "pumps", "messages": [{"role": "user", "content": question}]}
    r = app.post("/v1/chat/completions", json=body, headers=bearer(TEAM_A))
    assert r.status_code == 200 and r.headers["x-rag-mode"] == "rag", r.text
    usage = r.json()["usage"]
    row = settled(app, ("team-a", "pumps"), "requests", 1)
    assert (row["prompt_tokens"], row["completion_tokens"]) == (usage["prompt_tokens"], usage["completion_tokens"])
    assert usage["prompt_tokens"] == fake_prompt_tokens(fake.requests[-1]) and usage["completion_tokens"] == len(
        ANSWER.split()
    )
    assert row["embedding_tokens"] == hf_token_counter(embedder.model.tokenizer)(question) > 0
    assert "x-ratelimit-limit-requests" not in r.headers  # a key without limits: no headers

    # streamed, without include_usage: the engine's usage is still counted, once the stream ended
    # (computed again, not served from the answer cache, which spends no tokens)
    stream = app.post("/v1/chat/completions", json={**body, "stream": True, "cache": False}, headers=bearer(TEAM_A))
    assert stream.status_code == 200 and stream.text.rstrip().endswith("data: [DONE]")
    row = settled(app, ("team-a", "pumps"), "requests", 2)
    assert row["completion_tokens"] == 2 * len(ANSWER.split()) and row["prompt_tokens"] == 2 * usage["prompt_tokens"]


def test_retrieve_over_two_indexes_counts_on_each_and_once_in_the_totals(app) -> None:
    body = {"index_name": ["pumps", "lamps"], "query": "garden pond pump", "top_k": 2}
    assert app.post("/retrieve", json=body, headers=bearer(TEAM_A)).status_code == 200
    settled(app, ("team-a", "lamps"), "requests", 1)
    got = rows(app)
    assert got[("team-a", "pumps")]["requests"] == got[("team-a", "lamps")]["requests"] == 1
    assert got[("team-a", "pumps")]["embedding_tokens"] == got[("team-a", "lamps")]["embedding_tokens"] > 0
    totals = {t["key"]: t for t in app.get("/usage", headers=bearer(ADMIN)).json()["totals"]}
    assert totals["team-a"]["requests"] == 1 and totals["team-a"]["embedding_tokens"] > 0


def test_query_counts_generation_tokens(app, fake) -> None:
    body = {"index_name": "pumps", "query": "How much water does the Zephyr X200 move per hour?"}
    r = app.post("/query", json=body, headers=bearer(TEAM_A))
    assert r.status_code == 200, r.text
    row = settled(app, ("team-a", "pumps"), "requests", 1)
    assert row["prompt_tokens"] == fake_prompt_tokens(fake.requests[-1]) and row["completion_tokens"] == len(
        ANSWER.split()
    )


def test_embeddings_index_and_jobs_are_metered(app, embedder) -> None:
    r = app.post("/v1/embeddings", json={"model": "m", "input": ["one two", "three"]}, headers=bearer(TEAM_A))
    assert r.status_code == 200
    row = settled(app, ("team-a", ""), "requests", 1)
    assert row["embedding_tokens"] == r.json()["usage"]["prompt_tokens"] > 0

    docs = [{"text": "Lamps need light bulbs: ü counts twice in UTF-8."}, {"text": "A second lamp document."}]
    assert (
        app.post("/index", json={"index_name": "lamps", "documents": docs}, headers=bearer(TEAM_A)).status_code == 200
    )
    row = settled(app, ("team-a", "lamps"), "requests", 1)
    count = hf_token_counter(embedder.model.tokenizer)
    assert row["documents"] == 2
    assert row["bytes"] == sum(len(d["text"].encode()) for d in docs)
    assert row["embedding_tokens"] == sum(count(d["text"]) for d in docs)

    job = app.post("/jobs", json={"index_name": "lamps", "documents": docs[:1]}, headers=bearer(TEAM_A))
    assert job.status_code == 202
    assert "_usage_key" not in job.text  # the submitter's name is the server's, not shown in the job
    row = settled(app, ("team-a", "lamps"), "requests", 2)
    assert row["documents"] == 3
    # the job's tokens are recorded by the runner as it embeds its batch
    want = sum(count(d["text"]) for d in docs) + count(docs[0]["text"])
    row = settled(app, ("team-a", "lamps"), "embedding_tokens", want)
    assert row["embedding_tokens"] == want and row["requests"] == 2
    done = app.get(f"/jobs/{job.json()['id']}", headers=bearer(TEAM_A)).json()
    assert done["status"] == "completed" and "_usage_key" not in done["meta"]


def test_requests_per_minute_answers_429_with_openais_headers(app) -> None:
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
    seen = []
    for _ in range(3):
        r = app.post("/v1/chat/completions", json=body, headers=bearer(RPM))
        assert r.status_code == 200, r.text
        seen.append(int(r.headers["x-ratelimit-remaining-requests"]))
        assert r.headers["x-ratelimit-limit-requests"] == "3"
        assert r.headers["x-ratelimit-reset-requests"].endswith("s")
    assert seen == [2, 1, 0]
    refused = app.post("/v1/chat/completions", json=body, headers=bearer(RPM))
    assert refused.status_code == 429
    error = refused.json()["error"]
    assert error["type"] == "requests" and error["code"] == "rate_limit_exceeded"
    assert "requests per minute" in error["message"] and "'rpm'" in error["message"] and RPM not in refused.text
    assert 1 <= int(refused.headers["retry-after"]) <= 60
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    assert refused.headers["x-ratelimit-limit-requests"] == "3"
    # the document API: the same status and headers in its own shape
    other = app.post("/retrieve", json={"index_name": "pumps", "query": "pump"}, headers=bearer(RPM))
    assert other.status_code == 429 and "requests per minute" in other.json()["detail"]
    assert other.json()["error"]["code"] == "rate_limit_exceeded"  # and OpenAI's object beside it
    assert "retry-after" in other.headers
    # other keys are not limited by it, and the probes are never limited
    assert app.get("/v1/models", headers=bearer(TEAM_A)).status_code == 200
    assert app.get("/health", headers=bearer(RPM)).status_code == 200
    settled_rows = rows(app)
    assert settled_rows[("rpm", "")]["requests"] == 3  # the refused requests are not counted


def test_a_stream_is_never_cut_off_by_its_budget_and_the_next_request_is_refused(app, fake) -> None:
    fake.chunk_delay_s = 0.01
    try:
        body = {
            "model": "fake-model",
            "index_name": "pumps",
            "stream": True,
            "messages": [{"role": "user", "content": "How much water does the Zephyr X200 move per hour?"}],
        }
        r = app.post("/v1/chat/completions", json=body, headers=bearer(TPD))
        assert r.status_code == 200 and r.headers["x-ratelimit-limit-tokens"] == "10"
        assert r.headers["x-ratelimit-remaining-tokens"] == "10"
        text = "".join(
            json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
            for line in r.text.splitlines()
            if line.startswith("data: {") and json.loads(line[6:])["choices"]
        )
        assert ANSWER in text and r.text.rstrip().endswith("data: [DONE]")  # whole, far past 10 tokens
    finally:
        fake.chunk_delay_s = 0.0
    deadline = time.monotonic() + 5
    while True:  # the stream's tokens are recorded just after it ended
        refused = app.get("/v1/models", headers=bearer(TPD))
        if refused.status_code == 429 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["type"] == "tokens" and refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert refused.headers["x-ratelimit-remaining-tokens"] == "0"
    assert 0 < int(refused.headers["retry-after"]) <= 86400


def test_usage_needs_an_admin_key_and_shows_only_its_scope(app) -> None:
    app.post("/retrieve", json={"index_name": ["pumps", "lamps"], "query": "pump"}, headers=bearer(TEAM_A))
    app.get("/v1/models", headers=bearer(BARE))
    settled(app, ("unnamed", ""), "requests", 1)
    everything = rows(app)
    assert {("team-a", "pumps"), ("team-a", "lamps"), ("unnamed", ""), ("ops", "pumps")} <= set(everything)
    assert all(BARE not in k and TEAM_A not in k for k, _ in everything)  # names, never keys
    scoped = rows(app, SCOPED_ADMIN)
    assert scoped and all(index == "pumps" for _, index in scoped)
    r = app.get("/usage", headers=bearer(SCOPED_ADMIN)).json()
    assert {t["key"] for t in r["totals"]} == {key for key, _ in scoped}
    assert app.get("/usage", headers=bearer(TEAM_A)).status_code == 403


@pytest.mark.parametrize("since", ["2026-01-31", "2026-01-31T12:00:00Z", "2026-01-31T12:00:00", "1769860800"])
def test_usage_reads_dates_datetimes_and_unix_seconds(app, since: str) -> None:
    r = app.get("/usage", params={"since": since}, headers=bearer(ADMIN))
    assert r.status_code == 200 and r.json()["since"] <= 1769860800 + 43200


@pytest.mark.parametrize("since", ["yesterday", "2026-13-01", "-5", "1e30", "nan"])
def test_a_bad_since_is_a_422_saying_what_to_send(app, since: str) -> None:
    r = app.get("/usage", params={"since": since}, headers=bearer(ADMIN))
    assert r.status_code == 422 and "ISO 8601" in r.json()["detail"], r.text


def test_until_before_since_is_a_422(app) -> None:
    r = app.get("/usage", params={"since": "2026-02-01", "until": "2026-01-01"}, headers=bearer(ADMIN))
    assert r.status_code == 422 and "until" in r.json()["detail"]
    r = app.get("/usage", params={"since": "9999-12-31"}, headers=bearer(ADMIN))
    assert r.status_code == 422 and "since is in the future" in r.json()["detail"]


def test_a_streamed_passthrough_without_the_upstreams_usage_counts_what_was_relayed(app, fake) -> None:
    # no index and no include_usage: the upstream sends no usage; the answer relayed is counted
    body = {"model": "fake-model", "stream": True, "messages": [{"role": "user", "content": "say something"}]}
    r = app.post("/v1/chat/completions", json=body, headers=bearer(TEAM_A))
    assert r.status_code == 200 and r.headers["x-rag-mode"] == "passthrough", r.text
    assert r.text.rstrip().endswith("data: [DONE]") and '"usage"' not in r.text
    row = settled(app, ("team-a", ""), "completion_tokens", 1)
    assert row["completion_tokens"] == counter_for_model("fake-model").count_text(ANSWER) > 0
    assert row["prompt_tokens"] > 0


def test_a_limited_key_is_refused_with_a_503_when_the_ledger_cannot_answer(tmp_path, embedder, fake) -> None:
    keys = [{"key": RPM, "name": "rpm", "requests_per_minute": 100}, BARE]
    with inprocess_app(tmp_path, embedder, fake.url, api_keys=keys) as (application, _), TestClient(application) as c:
        meter = next(m.kwargs["meter"] for m in application.user_middleware if "meter" in m.kwargs)

        async def unreachable(*_: Any) -> None:
            raise ConnectionError("owner unreachable")

        meter.admit = unreachable
        r = c.get("/v1/models", headers=bearer(RPM))
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["code"] == "usage_unavailable"
        assert c.get("/v1/models", headers=bearer(BARE)).status_code == 200  # keys without limits never ask


def test_usage_and_windows_are_kept_across_a_restart(tmp_path, embedder, fake) -> None:
    keys = [{"key": ADMIN, "name": "ops", "role": "admin"}, {"key": RPM, "name": "rpm", "requests_per_minute": 2}]
    with inprocess_app(tmp_path, embedder, fake.url, api_keys=keys) as (application, _), TestClient(application) as c:
        assert c.get("/v1/models", headers=bearer(RPM)).status_code == 200
        assert c.post("/v1/embeddings", json={"input": "one two three"}, headers=bearer(ADMIN)).status_code == 200
    # the lifespan's end flushed the meter; a new application over the same storage_dir reads it back
    with inprocess_app(tmp_path, embedder, fake.url, api_keys=keys) as (application, _), TestClient(application) as c:
        got = rows(c)
        assert got[("rpm", "")]["requests"] == 1 and got[("ops", "")]["embedding_tokens"] > 0
        first = c.get("/v1/models", headers=bearer(RPM))
        second = c.get("/v1/models", headers=bearer(RPM))
        # the same minute (unless the test straddled one): the window kept its first request
        if first.headers["x-ratelimit-remaining-requests"] == "0":
            assert second.status_code == 429


def test_without_keys_usage_is_anonymous(tmp_path, embedder, fake) -> None:
    with inprocess_app(tmp_path, embedder, fake.url) as (application, _), TestClient(application) as c:
        assert c.post("/v1/embeddings", json={"input": "hello"}).status_code == 200
        deadline = time.monotonic() + 5
        while ("anonymous", "") not in (got := {(r["key"], r["index"]): r for r in c.get("/usage").json()["data"]}):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert got[("anonymous", "")]["embedding_tokens"] > 0


@pytest.mark.parametrize(
    ("keys", "what"),
    [
        ([{"key": "a", "name": "x"}, {"key": "b", "name": "x"}], "unique"),
        ([{"key": "a", "name": "has space"}], "pattern"),
        ([{"key": "a", "name": "x" * 65}], "pattern"),
        ([{"key": "a", "name": "anonymous"}], "reserved"),
        ([{"key": "a", "requests_per_minute": 0}], "greater than or equal to 1"),
        ([{"key": "a", "tokens_per_day": -1}], "greater than or equal to 1"),
        ([{"key": "a", "requests_per_minute": 5}], "needs a name"),  # unnamed keys would share a window
        ([{"key": "a", "tokens_per_day": 5}], "needs a name"),
    ],
)
def test_key_names_and_limits_are_validated(tmp_path, keys: list[dict[str, Any]], what: str) -> None:
    with pytest.raises(ValidationError, match=what):
        Settings(storage_dir=str(tmp_path), api_keys=keys)


def test_reset_is_written_as_openai_writes_it() -> None:
    assert [reset_text(s) for s in (0.25, 1, 17.2, 360, 5400)] == ["250ms", "1s", "18s", "6m0s", "1h30m0s"]
