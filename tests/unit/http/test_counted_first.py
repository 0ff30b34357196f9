"""Lists too long to accept are refused before the body is validated item by item on the event loop
(``ragserve.http.json_body.counted_first``): a hostile probe's 300,000 one-word messages (10 MB) were
validated for 13.8 s, with every other request of the replica waiting, before the count refused
them. Each body below holds, past the limit, an item validation would refuse: the count's error
coming back shows the count ran first, and validation never walked the list."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from ragserve.testing.fake_openai import FakeOpenAI
from ragserve.testing.inprocess import inprocess_app


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(answer="ok", model="fake-model", max_model_len=4096) as f:
        yield f


@pytest.fixture
def client(tmp_path, embedder, fake) -> Iterator[TestClient]:
    with (
        inprocess_app(
            tmp_path,
            embedder,
            fake.url,
            max_documents_per_request=3,
            max_documents_per_job=5,
            max_chat_messages=4,
            max_content_parts=6,
        ) as (app, _),
        TestClient(app) as c,
    ):
        c.post("/index", json={"index_name": "kb", "documents": [{"text": "KAITO runs models."}]}).raise_for_status()
        yield c


BAD_MESSAGE = {"role": 12, "content": {"not": "a message"}}
BAD_DOCUMENT = {"text": 12, "metadata": "not an object"}


def _error(r) -> tuple[str, str | None]:
    body = r.json()
    err = body.get("error") or {}
    return (err.get("message") or str(body.get("detail")), err.get("param"))


def test_too_many_chat_messages_are_counted_before_any_is_validated(client: TestClient) -> None:
    messages = [{"role": "user", "content": "hi"}] * 9 + [BAD_MESSAGE] * 3
    r = client.post("/v1/chat/completions", json={"messages": messages})
    assert r.status_code == 400
    message, param = _error(r)
    assert "12 messages; at most 4" in message and param == "messages"


def test_content_parts_are_counted_across_the_messages(client: TestClient) -> None:
    part = {"type": "text", "text": "hi"}
    within = [{"role": "user", "content": [part] * 3}, {"role": "user", "content": [part] * 3}]
    assert client.post("/v1/chat/completions", json={"messages": within}).status_code == 200
    over = [{"role": "user", "content": [part] * 4}, {"role": "user", "content": [part] * 2 + [{"type": 5}]}]
    r = client.post("/v1/chat/completions", json={"messages": over})
    assert r.status_code == 400
    message, param = _error(r)
    assert "7 content parts in all; at most 6" in message and param == "messages"


@pytest.mark.parametrize("field", ["tools", "functions"])
def test_tools_past_openais_128_are_refused_uncounted_items_unvalidated(client: TestClient, field: str) -> None:
    tools = [{"type": "function", "function": {"name": f"f{i}"}} for i in range(128)] + ["not a tool"]
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], field: tools})
    assert r.status_code == 400
    message, param = _error(r)
    assert f"{field}: 129 items; at most 128" in message and param == field


@pytest.mark.parametrize(
    "path, body",
    [
        ("/index", {"index_name": "kb", "documents": [BAD_DOCUMENT] * 4}),
        ("/indexes/kb/documents", {"documents": [{"doc_id": "a", "text": "x"}] * 3 + [BAD_DOCUMENT]}),
        ("/indexes/kb/documents/delete", {"doc_ids": ["a", "b", "c", 4]}),
        ("/v1/embeddings", {"input": ["a", "b", "c", 4]}),
    ],
)
def test_document_lists_are_counted_before_any_item_is_validated(client: TestClient, path: str, body: dict) -> None:
    r = client.post(path, json=body)
    assert r.status_code == 413, r.text
    message, param = _error(r)
    field = next(k for k in body if k != "index_name")
    assert f"{field}: 4 items in one request; at most 3" in message
    assert param in (field, None)  # OpenAI's shape names it as param too; {detail} in its message


def test_a_job_is_counted_against_max_documents_per_job_first(client: TestClient) -> None:
    r = client.post("/jobs", json={"index_name": "kb", "documents": [{"text": "fine"}] * 5 + [BAD_DOCUMENT]})
    assert r.status_code == 413
    message, _ = _error(r)
    assert "6 in one job; at most 5" in message


def test_within_the_limits_validation_still_names_the_bad_item(client: TestClient) -> None:
    """The count only refuses a list too long; a list within it is validated as before."""
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}, BAD_MESSAGE]})
    assert r.status_code == 400 and "messages" in r.text and "1" in (_error(r)[1] or r.text)
    r = client.post("/index", json={"index_name": "kb", "documents": [BAD_DOCUMENT]})
    assert r.status_code in (400, 422) and "documents" in r.text
    assert client.post("/v1/chat/completions", json={"messages": "not a list"}).status_code == 400


@pytest.mark.parametrize("where", ["top", "message", "tool_call"])
def test_a_body_of_too_many_json_values_is_refused_before_parsing(
    client: TestClient, fake: FakeOpenAI, where: str
) -> None:
    """Free-form fields are validated value by value too (an extra field, a message's tool calls):
    the hostile review's 3 M empty objects in one were 9.5 s of a stopped event loop, then sent
    upstream. The body's values are counted in the scan that bounds its depth, before it is parsed."""
    from ragserve.http.json_body import MAX_CHAT_JSON_VALUES

    many = [{}] * (MAX_CHAT_JSON_VALUES + 10)
    message: dict = {"role": "user", "content": "hi"}
    body: dict = {"messages": [message]}
    if where == "top":
        body["foo"] = many
    elif where == "message":
        message["foo"] = many
    else:
        message["tool_calls"] = many
    before = len(fake.requests)
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 413, r.text
    assert "JSON values" in r.json()["error"]["message"]
    assert len(fake.requests) == before


def test_the_document_api_takes_a_larger_body_of_values(client: TestClient) -> None:
    """Documents with metadata count many values: past the chat bound, within the body bound."""
    from ragserve.http.json_body import MAX_CHAT_JSON_VALUES, MAX_JSON_VALUES

    docs = [{"text": f"doc {i}", "metadata": {"tags": list(range(1000))}} for i in range(3)]
    values = 3 * 1000
    assert values < MAX_JSON_VALUES
    assert client.post("/index", json={"index_name": "kb", "documents": docs}).status_code == 200
    r = client.post("/index", json={"index_name": "kb", "documents": [{"text": "x", "extra": [0] * MAX_JSON_VALUES}]})
    assert r.status_code == 413 and "JSON values" in r.text
    assert MAX_CHAT_JSON_VALUES < MAX_JSON_VALUES
