"""Issue 21, "Hardening, second round": client mistakes the audit turned into 500s or wrong results,
each a 4xx that says what to fix (or a right result), over HTTP on the in-process app with real
shards and embedder; the LLM is the fake upstream."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from app.api.documents import validate_index_name
from tests.fakes.fake_openai import FakeOpenAI
from tests.inprocess import inprocess_app

DOC = {"text": "KAITO is a Kubernetes operator for AI model inference.", "metadata": {"topic": "kaito"}}


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(answer="KAITO runs models [1].", model="fake-model", max_model_len=4096) as f:
        yield f


@pytest.fixture
def client(tmp_path, embedder, fake: FakeOpenAI) -> Iterator[TestClient]:
    fake.reset()
    with (
        inprocess_app(tmp_path, embedder, fake.url, similarity_threshold=0.0) as (app, _),
        TestClient(app, raise_server_exceptions=False) as c,
    ):
        assert c.post("/index", json={"index_name": "kb", "documents": [{**DOC, "doc_id": "a"}]}).status_code == 200
        yield c


def raw_post(client: TestClient, path: str, text: str):
    """A body as the client wrote it (Python's json would refuse to write lone surrogates)."""
    return client.post(
        path, content=text.encode("utf-8", "surrogatepass"), headers={"content-type": "application/json"}
    )


# --- validation regexes match the whole value --------------------------------------------------


@pytest.mark.parametrize("name", ["kb\n", "kb\r\n", "\nkb", "kb\x00", "k b"])
def test_an_index_name_with_a_trailing_newline_is_refused(client: TestClient, name: str) -> None:
    with pytest.raises(ValueError, match="invalid index name"):
        validate_index_name(name)
    r = client.post("/index", json={"index_name": name, "documents": [{"text": "x"}]})
    assert r.status_code == 422 and "index names are" in r.text, r.text
    r = client.post(
        "/v1/chat/completions", json={"index_name": name, "messages": [{"role": "user", "content": "What is KAITO?"}]}
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "index_name", r.text
    assert client.get("/indexes").json() == ["kb"]


def test_an_index_name_in_the_path_with_a_trailing_newline_is_refused(client: TestClient) -> None:
    for r in (
        client.get("/indexes/kb%0A/documents"),
        client.get("/indexes/kb%0A/stats"),
        client.post("/indexes/kb%0A/documents/delete", json={"doc_ids": ["a"]}),
    ):
        assert r.status_code == 400 and "index names are" in r.text, r.text
