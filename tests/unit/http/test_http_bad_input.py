"""Values the schema lets through but storage, tokenizers or engines cannot hold: each one a 4xx that
names the field, and nothing stored (issue 11, items 9-11, 13, 15). Over HTTP, on the in-process app
with real shards and embedder; the LLM is the fake upstream."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ragserve.testing.fake_openai import FakeOpenAI
from ragserve.testing.inprocess import inprocess_app

DOC = {"text": "KAITO is a Kubernetes operator for AI model inference.", "metadata": {"topic": "kaito"}}


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(answer="KAITO runs models [1].", model="fake-model", max_model_len=4096) as f:
        yield f


@pytest.fixture
def client(tmp_path, embedder, fake: FakeOpenAI) -> Iterator[TestClient]:
    fake.reset()
    with inprocess_app(tmp_path, embedder, fake.url, similarity_threshold=0.0) as (app, _), TestClient(app) as c:
        assert c.post("/index", json={"index_name": "kb", "documents": [DOC]}).status_code == 200
        yield c


def raw_post(client: TestClient, path: str, text: str):
    """A body as the client wrote it (Python's json would refuse to write NaN or lone surrogates)."""
    return client.post(
        path, content=text.encode("utf-8", "surrogatepass"), headers={"content-type": "application/json"}
    )


def document_count(client: TestClient) -> int:
    return client.get("/indexes/kb/documents", params={"limit": 100}).json()["total_items"]


@pytest.mark.parametrize(
    ("metadata", "says"),
    [
        ('{"score": NaN}', "not a finite number"),
        ('{"score": Infinity}', "not a finite number"),
        ('{"big": 123456789012345678901234567890}', "does not fit in 64 bits"),
        ('{"who": "\\ud800"}', "lone surrogate"),
        ('{"\\udfff": 1}', "lone surrogate"),
        ('{"nested": {"a": 1}}', "nested objects are not accepted"),
        ('{"deep": [[1]]}', "not nested lists or objects"),
        ("{" + ", ".join(f'"k{i}": {i}' for i in range(500)) + "}", "at most 128"),
        ('{"deep": ' + "[" * 5000 + "]" * 5000 + "}", ""),
    ],
)
def test_metadata_that_cannot_be_stored_is_refused(client: TestClient, metadata: str, says: str) -> None:
    r = raw_post(
        client,
        "/index",
        f'{{"index_name": "kb", "documents": [{{"text": "Another document.", "metadata": {metadata}}}]}}',
    )
    assert 400 <= r.status_code < 500, r.text
    assert says in r.text
    assert document_count(client) == 1
    r = raw_post(
        client, "/indexes/kb/documents", f'{{"documents": [{{"doc_id": "x", "text": "t", "metadata": {metadata}}}]}}'
    )
    assert 400 <= r.status_code < 500, r.text


@pytest.mark.parametrize("text", ["\\u0000\\u0000", "\\u200b\\u200d", "\\ufeff", "\\u202e \\n"])
def test_text_a_reader_cannot_see_is_refused_like_blank_text(client: TestClient, text: str) -> None:
    """NUL, zero-width, BOM or direction characters alone: a 400 saying so, as for spaces, and
    nothing of the request is stored (the other document in it neither)."""
    body = f'{{"index_name": "kb", "documents": [{{"text": "A visible one."}}, {{"text": "{text}"}}]}}'
    r = raw_post(client, "/index", body)
    assert r.status_code == 400 and "documents[1]: text has no content to index" in r.text, r.text
    (stored,) = client.get("/indexes/kb/documents").json()["documents"]
    r = raw_post(
        client, "/indexes/kb/documents", f'{{"documents": [{{"doc_id": "{stored["doc_id"]}", "text": "{text}"}}]}}'
    )
    assert r.status_code == 400 and "no content to index" in r.text, r.text
    assert client.get("/indexes/kb/documents").json()["documents"] == [stored]


def test_lone_surrogates_in_text_and_queries_are_refused(client: TestClient) -> None:
    r = raw_post(client, "/index", '{"index_name": "kb", "documents": [{"text": "broken \\udc80 text"}]}')
    assert r.status_code == 422 and "documents.0.text" in r.text and "lone surrogate" in r.text
    r = raw_post(client, "/retrieve", '{"index_name": "kb", "query": "what \\ud83d"}')
    assert r.status_code == 422 and "query: contains a lone surrogate" in r.text
    r = raw_post(
        client, "/v1/chat/completions", '{"index_name": "kb", "messages": [{"role": "user", "content": "hi \\ud800"}]}'
    )
    assert r.status_code == 400 and "messages.0" in r.json()["error"]["message"]
    assert document_count(client) == 1


@pytest.mark.parametrize(
    "flt",
    [
        {"n": 2**70},
        {"n": -(2**64)},
        {f"k{i}": i for i in range(300)},
        {"a": {"b": 1}},
        {"a": [1, 2]},
    ],
)
def test_filters_that_cannot_be_evaluated_are_refused(client: TestClient, flt: dict[str, Any]) -> None:
    r = client.get("/indexes/kb/documents", params={"metadata_filter": json.dumps(flt)})
    assert r.status_code == 400, r.text
    r = client.post("/retrieve", json={"index_name": "kb", "query": "KAITO", "metadata_filter": flt})
    assert r.status_code == 422, r.text
    r = client.post(
        "/v1/chat/completions",
        json={"index_name": "kb", "metadata_filter": flt, "messages": [{"role": "user", "content": "KAITO?"}]},
    )
    assert r.status_code == 400, r.text
    r = raw_post(client, "/retrieve", '{"index_name": "kb", "query": "KAITO", "metadata_filter": {"n": NaN}}')
    assert r.status_code == 422 and "finite" in r.text


def test_deeply_nested_code_is_chunked_not_a_crash(client: TestClient) -> None:
    code = "x = " + "[" * 3000 + "]" * 3000 + "\n"
    r = client.post(
        "/index",
        json={
            "index_name": "code",
            "documents": [{"text": code, "metadata": {"split_type": "code", "language": "python"}}],
        },
    )
    assert r.status_code == 200, r.text
    assert client.get("/indexes/code/documents").json()["total_items"] == 1


@pytest.mark.parametrize(
    "params",
    [
        {"max_tokens": "100"},
        {"max_tokens": 1.5},
        {"max_tokens": -5},
        {"temperature": "hot"},
        {"top_p": 2},
        {"stop": 7},
        {"stop": ["a", "b", "c", "d", "e"]},
        {"stop": "=" * 257},  # a local engine checks every stop after every token: each is bounded
        {"stop": ["END", " " * 100_000]},
        {"seed": 2**80},
        {"frequency_penalty": 1.0},
    ],
)
def test_query_llm_params_are_validated(client: TestClient, fake: FakeOpenAI, params: dict[str, Any]) -> None:
    before = len(fake.requests)
    r = client.post("/query", json={"index_name": "kb", "query": "What is KAITO?", "llm_params": params})
    assert r.status_code == 422, r.text
    assert next(iter(params)) in r.text
    assert len(fake.requests) == before  # nothing reached the engine


def test_chat_stop_sequences_are_bounded_in_number_and_length(client: TestClient, fake: FakeOpenAI) -> None:
    before = len(fake.requests)
    for stop, says in (
        ("=" * 257, "at most 256"),
        (["a", "b", "c", "d", "e"], "at most 4"),
        (["x", "y" * 300], "stop sequence 1"),
    ):
        r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "stop": stop})
        assert r.status_code == 400 and says in r.text and "stop" in r.json()["error"]["param"], r.text
    assert len(fake.requests) == before
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "stop": "=" * 256})
    assert r.status_code == 200, r.text


def test_query_llm_params_reach_the_engine(client: TestClient, fake: FakeOpenAI) -> None:
    r = client.post(
        "/query",
        json={
            "index_name": "kb",
            "query": "What is KAITO?",
            "llm_params": {"max_tokens": 20, "temperature": 0.2, "stop": ["\n\n"]},
        },
    )
    assert r.status_code == 200, r.text
    sent = fake.requests[-1]
    assert (sent["max_tokens"], sent["temperature"], sent["stop"]) == (20, 0.2, ["\n\n"])


@pytest.mark.parametrize(
    "params",
    [
        {"max_tokens": "100"},
        {"max_tokens": True},
        {"max_tokens": 100.0},
        {"max_completion_tokens": "5"},
        {"temperature": "0.5"},
        {"temperature": True},
        {"top_p": "1"},
        {"n": True},
        {"seed": "7"},
        {"stream": "true"},
        {"stream": 1},
        {"top_k": "3"},
        {"top_k": True},
        {"context_token_ratio": "0.5"},
        {"similarity_threshold": False},
        {"sources_in_content": "yes"},
        {"cache": 0},
    ],
)
def test_chat_numbers_and_flags_are_strictly_typed_as_openai_takes_them(
    client: TestClient, fake: FakeOpenAI, params: dict[str, Any]
) -> None:
    """As ``/query``'s llm_params: a string or a bool where a number belongs (a flag given as a string
    or number) is a 400 naming the field, not coerced and forwarded."""
    before = len(fake.requests)
    body = {"index_name": "kb", "messages": [{"role": "user", "content": "What is KAITO?"}], **params}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    assert next(iter(params)) in r.text
    assert len(fake.requests) == before


def test_chat_numbers_of_the_right_kind_pass(client: TestClient, fake: FakeOpenAI) -> None:
    """An integer where a float belongs is a number (``temperature: 0``, as SDKs send it)."""
    body = {"messages": [{"role": "user", "content": "hi"}], "temperature": 0, "top_p": 1, "max_tokens": 8}
    assert client.post("/v1/chat/completions", json=body).status_code == 200
    assert (fake.requests[-1]["temperature"], fake.requests[-1]["top_p"]) == (0, 1)


def test_embedding_dimensions_are_checked(client: TestClient) -> None:
    for bad in (0, -3, 385, True, "64", 64.0):
        r = client.post("/v1/embeddings", json={"input": "hello", "dimensions": bad})
        assert r.status_code == 400 and "dimensions" in r.json()["error"]["message"], r.text
    r = client.post("/v1/embeddings", json={"input": "hello", "dimensions": 64})
    vec = r.json()["data"][0]["embedding"]
    assert len(vec) == 64 and abs(sum(v * v for v in vec) - 1.0) < 1e-4


def test_passthrough_forwards_an_omitted_max_tokens_as_omitted(client: TestClient, fake: FakeOpenAI) -> None:
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Write a long essay."}]})
    assert r.status_code == 200, r.text
    assert "max_tokens" not in fake.requests[-1] and "max_completion_tokens" not in fake.requests[-1]
    client.post("/v1/chat/completions", json={"max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]})
    assert fake.requests[-1]["max_tokens"] == 100  # fits: as sent
    client.post("/v1/chat/completions", json={"max_tokens": 10**6, "messages": [{"role": "user", "content": "hi"}]})
    assert fake.requests[-1]["max_tokens"] < 4096  # cannot fit: clamped to the window


def test_rag_names_the_generating_model_and_forwards_sampling_fields(client: TestClient, fake: FakeOpenAI) -> None:
    body = {
        "index_name": "kb",
        "model": "client-model",
        "messages": [{"role": "user", "content": "What is KAITO?"}],
        "response_format": {"type": "json_object"},
        "presence_penalty": 0.5,
        "frequency_penalty": 0.1,
        "logprobs": True,
        "n": 1,
    }
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200 and r.headers["x-rag-mode"] == "rag", r.text
    sent = fake.requests[-1]
    assert sent["model"] == "client-model"  # the remote engine is asked for the requested model
    assert sent["response_format"] == {"type": "json_object"} and sent["presence_penalty"] == 0.5
    assert sent["frequency_penalty"] == 0.1 and sent["logprobs"] is True
    assert r.json()["model"] == "client-model"  # what the upstream says generated it
    r = client.post("/v1/chat/completions", json={**body, "stream": True})
    first = json.loads(r.text.split("\n\n")[0].removeprefix("data: "))
    assert first["model"] == "client-model" and fake.requests[-1]["presence_penalty"] == 0.5
    r = client.post("/v1/chat/completions", json={**body, "n": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"


def test_every_list_limit_the_settings_allow_is_served(tmp_path, embedder, fake: FakeOpenAI) -> None:
    with inprocess_app(tmp_path, embedder, fake.url, max_list_limit=1000) as (app, _), TestClient(app) as c:
        c.post("/index", json={"index_name": "kb", "documents": [{"text": f"Note {i}."} for i in range(3)]})
        r = c.get("/indexes/kb/documents", params={"limit": 500})
        assert r.status_code == 200 and r.json()["count"] == 3, r.text
        assert c.get("/indexes/kb/documents", params={"limit": 1001}).status_code == 422


class SmallerEmbedder:
    """Another embedding model (64-d vectors instead of 384) in front of the same tokenizer: what a
    server restarted with a different ``embedding_model`` on the same storage_dir embeds with."""

    def __init__(self, inner: Any):
        self.model = inner.model
        self._inner = inner

    @staticmethod
    def _shrink(vectors: Any) -> Any:
        import numpy as np

        v = np.asarray(vectors)[..., :64]
        return v / np.linalg.norm(v, axis=-1, keepdims=True)

    async def embed_documents(self, texts: list[str], *, bulk: bool = False) -> Any:
        return self._shrink(await self._inner.embed_documents(texts, bulk=bulk))

    async def embed_query(self, text: str) -> Any:
        return self._shrink(await self._inner.embed_query(text))

    async def count_tokens(
        self, texts: list[str], *, over: int | None = None, total_over: int | None = None
    ) -> list[int]:
        return await self._inner.count_tokens(texts, over=over, total_over=total_over)


def test_an_index_built_with_another_embedding_model_is_a_409_that_says_so(tmp_path, embedder, fake) -> None:
    with inprocess_app(tmp_path, embedder, fake.url) as (app, _), TestClient(app) as c:
        assert c.post("/index", json={"index_name": "kb", "documents": [DOC]}).status_code == 200
    with inprocess_app(tmp_path, SmallerEmbedder(embedder), fake.url) as (app, _), TestClient(app) as c:
        doc_id = c.get("/indexes/kb/documents").json()["documents"][0]["doc_id"]
        writes = [
            c.post("/index", json={"index_name": "kb", "documents": [{"text": "A second document."}]}),
            c.post("/indexes/kb/documents", json={"documents": [{"doc_id": doc_id, "text": "Changed."}]}),
            c.post("/retrieve", json={"index_name": "kb", "query": "What is KAITO?"}),
            c.post("/query", json={"index_name": "kb", "query": "What is KAITO?"}),
        ]
        for r in writes:
            assert r.status_code == 409, r.text
            assert "384-d vectors, got 64-d" in r.text or "384-d vectors, query is 64-d" in r.text
            assert "another embedding model" in r.text
        listed = c.get("/indexes/kb/documents").json()
        assert listed["total_items"] == 1 and listed["documents"][0]["text"] == DOC["text"]
        # a new index is built with the model serving now
        assert c.post("/index", json={"index_name": "kb64", "documents": [DOC]}).status_code == 200
        hits = c.post("/retrieve", json={"index_name": "kb64", "query": "What is KAITO?"}).json()
        assert hits["results"] and hits["results"][0]["text"] == DOC["text"]


@pytest.mark.parametrize(
    "doc_id", ["   ", "\t", "a\x00b", "line\nbreak", "esc\x1b[31m", "del\x7f", "c1\x85", "ls\u2028", "rtl\u202efdp.exe"]
)
def test_a_new_document_id_is_printable_text(client: TestClient, doc_id: str) -> None:
    """A NUL, a newline or a blank id was stored (the hostile probe): ids travel in URLs, logs and
    terminals. Nothing is stored, and the index keeps what it had."""
    before = client.get("/indexes/kb/documents").json()["total_items"]
    r = client.post("/index", json={"index_name": "kb", "documents": [{"text": "hello", "doc_id": doc_id}]})
    assert r.status_code == 422 and "doc_id" in r.text, r.text
    r = client.post("/jobs", json={"index_name": "kb", "documents": [{"text": "hello", "doc_id": doc_id}]})
    assert r.status_code == 422 and "doc_id" in r.text, r.text
    assert client.get("/indexes/kb/documents").json()["total_items"] == before


@pytest.mark.parametrize("path", ["/retrieve", "/query"])
def test_a_lone_surrogate_in_a_query_field_is_named(client: TestClient, fake: FakeOpenAI, path: str) -> None:
    """A field named ``query`` lost its name from the message (taken for FastAPI's "query string"
    location), and pydantic's own words for a lone surrogate said nothing of what to fix."""
    r = raw_post(client, path, '{"index_name": "kb", "query": "a\\ud800b"}')
    assert r.status_code == 422, r.text
    assert r.json()["detail"].startswith("query: contains a lone surrogate"), r.text
