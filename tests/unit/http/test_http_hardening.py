"""Issue 21, "Hardening, second round": client mistakes the audit turned into 500s or wrong results,
each a 4xx that says what to fix (or a right result), over HTTP on the in-process app with real
shards and embedder; the LLM is the fake upstream."""

from __future__ import annotations

import json
import random
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ragserve.api.documents import NodeWithScore, validate_index_name
from ragserve.api.values import MAX_JSON_DEPTH, json_depth
from ragserve.http.headers import MAX_QUERY_HEADER_BYTES, query_headers
from ragserve.rag.citations import _MARKER, parse_citations
from ragserve.testing.fake_openai import FakeOpenAI
from ragserve.testing.inprocess import inprocess_app
from tests.unit.test_dos_shapes import BOUND_S

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


# --- JSON nesting depth, in bodies and query strings ------------------------------------------


def _nested(depth: int, shape: str) -> str:
    if shape == "list":
        return "[" * depth + "]" * depth
    return '{"a":' * depth + "1" + "}" * depth


@pytest.mark.parametrize("depth", [300, 5000])
@pytest.mark.parametrize("shape", ["list", "object"])
def test_json_nested_deeper_than_the_limit_is_a_400_saying_it(client: TestClient, depth: int, shape: str) -> None:
    deep = _nested(depth, shape)
    in_url = _nested(min(depth, 2000), shape)  # what a URL holds
    r = client.get("/indexes/kb/documents", params={"metadata_filter": in_url})
    assert r.status_code == 400 and f"at most {MAX_JSON_DEPTH} levels" in r.text, r.text
    chat = '{"index_name": "kb", "messages": [{"role": "user", "content": "What is KAITO?"}], '
    for path, body in [
        ("/v1/chat/completions", chat + '"response_format": DEEP}'),
        ("/v1/chat/completions", chat + '"tools": [DEEP]}'),
        ("/v1/chat/completions", chat + '"metadata_filter": {"a": DEEP}}'),
        ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi", "x": DEEP}]}'),
        ("/v1/embeddings", '{"input": "hello", "user": DEEP}'),
        ("/retrieve", '{"index_name": "kb", "query": "KAITO", "metadata_filter": DEEP}'),
        ("/query", '{"index_name": "kb", "query": "KAITO", "metadata_filter": DEEP}'),
        ("/index", '{"index_name": "kb", "documents": [{"text": "t", "metadata": {"a": DEEP}}]}'),
        ("/indexes/kb/documents", '{"documents": [{"doc_id": "a", "text": "t", "metadata": DEEP}]}'),
        ("/indexes/kb/documents/delete", '{"doc_ids": DEEP}'),
    ]:
        r = raw_post(client, path, body.replace("DEEP", deep))
        assert r.status_code == 400, (path, r.text)
        message = r.json()["error"]["message"] if path.startswith("/v1/") else r.json()["detail"]
        assert f"at most {MAX_JSON_DEPTH} levels are accepted" in message, (path, message)
    assert client.get("/indexes/kb/documents").json()["total_items"] == 1


def test_json_within_the_depth_limit_is_served(client: TestClient, fake: FakeOpenAI) -> None:
    schema = _nested(MAX_JSON_DEPTH - 3, "object")  # the body and response_format's own levels
    r = raw_post(
        client,
        "/v1/chat/completions",
        '{"index_name": "kb", "messages": [{"role": "user", "content": "What is KAITO?"}], '
        f'"response_format": {schema}}}',
    )
    assert r.status_code == 200, r.text
    assert fake.requests[-1]["response_format"] == json.loads(schema)


def test_json_depth_is_linear_on_a_megabyte_of_worst_shapes() -> None:
    for shape in ("[", "{", '"[', "\\", '\\"', '"', '[1,"\\"],', '{"a":'):
        text = shape * (2**20 // len(shape))
        t0 = time.thread_time()  # CPU time: the shared machine's load does not count
        json_depth(text)
        assert time.thread_time() - t0 < 0.5, shape


def _real_depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max(map(_real_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(_real_depth, value.values()), default=0)
    return 0


def test_json_depth_is_the_nesting_of_the_parsed_value() -> None:
    rng = random.Random(21)
    alphabet = '[]{}"\\a,: é\n'

    def text() -> str:
        return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 6)))

    def value(level: int) -> Any:
        r = rng.random()
        if level > 6 or r < 0.3:
            return rng.choice([text(), 1, None, True, 2.5])
        if r < 0.65:
            return [value(level + 1) for _ in range(rng.randint(0, 3))]
        return {text(): value(level + 1) for _ in range(rng.randint(0, 3))}

    for _ in range(3000):
        v = value(0)
        dumped = json.dumps(v, ensure_ascii=rng.random() < 0.5, indent=rng.choice([None, 1]))
        assert json_depth(dumped) == _real_depth(v), dumped


# --- malformed bodies: what is wrong and where -------------------------------------------------


@pytest.mark.parametrize(
    "path", ["/v1/chat/completions", "/v1/embeddings", "/index", "/retrieve", "/query", "/indexes/kb/documents/delete"]
)
def test_a_malformed_json_body_says_what_is_wrong_and_where(client: TestClient, path: str) -> None:
    r = raw_post(client, path, '{"messages": [{"role": "user"\n  "content": "x"}]}')
    assert 400 <= r.status_code < 500, r.text
    if path.startswith("/v1/"):
        error = r.json()["error"]
        assert error["param"] is None
        message = error["message"]
    else:
        message = r.json()["detail"]
    assert message == "invalid JSON at line 2, column 3: Expecting ',' delimiter", message


def test_a_body_that_is_not_utf8_is_a_400_in_the_route_shape(client: TestClient) -> None:
    bad = b'{"input": "caf\xe9"}'
    r = client.post("/v1/embeddings", content=bad, headers={"content-type": "application/json"})
    assert r.status_code == 400 and "not valid UTF-8 (byte 14)" in r.json()["error"]["message"], r.text
    r = client.post("/retrieve", content=bad, headers={"content-type": "application/json"})
    assert r.status_code == 400 and "not valid UTF-8" in r.json()["detail"], r.text


def test_framework_errors_on_openai_routes_are_openai_errors(client: TestClient) -> None:
    r = client.get("/v1/nothing-here")
    assert r.status_code == 404 and r.json()["error"]["message"] == "Not Found", r.text
    r = client.get("/v1/chat/completions")
    assert r.status_code == 405 and r.json()["error"]["type"] == "invalid_request_error", r.text
    r = client.get("/nothing-here")
    assert r.status_code == 404 and r.json() == {"detail": "Not Found"}


# --- lone surrogates, in every string of every request -----------------------------------------

SURROGATE = '"\\ud800"'


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/indexes/kb/documents/delete", '{"doc_ids": ["a", S]}', "doc_ids[1]"),
        ("/v1/embeddings", '{"input": S}', "input"),
        ("/v1/embeddings", '{"input": ["fine", S]}', "input[1]"),
        ("/v1/embeddings", '{"input": "fine", "model": S}', "model"),
        ("/v1/embeddings", '{"input": "fine", "user": S}', "user"),
        ("/v1/chat/completions", '{"model": S, "messages": [{"role": "user", "content": "hi"}]}', "model"),
        ("/v1/chat/completions", '{"user": S, "messages": [{"role": "user", "content": "hi"}]}', "user"),
        (
            "/v1/chat/completions",
            '{"index_name": "kb", "model": S, "messages": [{"role": "user", "content": "hi"}]}',
            "model",
        ),
        ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi", "name": S}]}', "name"),
        ("/v1/chat/completions", '{"messages": [{"role": S, "content": "hi"}]}', "role"),
        ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi", "x": [S]}]}', "x[0]"),
        ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi"}], "stop": ["a", S]}', "stop[1]"),
        (
            "/v1/chat/completions",
            '{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": S}]}',
            "tools[0]['type']",
        ),
        (
            "/v1/chat/completions",
            '{"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": S}}',
            "response_format['type']",
        ),
        (
            "/v1/chat/completions",
            '{"messages": [{"role": "user", "content": "hi"}], "seed_text": {S: 1}}',
            "seed_text key",
        ),
        ("/query", '{"index_name": "kb", "query": "KAITO", "llm_params": {"stop": S}}', "stop"),
        ("/query", '{"index_name": "kb", "query": "KAITO", "llm_params": {"stop": ["a", S]}}', "stop[1]"),
        ("/retrieve", '{"index_name": "kb", "query": "KAITO", "metadata_filter": {"a": S}}', "metadata_filter['a']"),
        (
            "/indexes/kb/documents",
            '{"documents": [{"doc_id": "a", "text": "new", "metadata": {"k": [S]}}]}',
            "metadata['k'][0]",
        ),
    ],
)
def test_a_lone_surrogate_in_any_string_is_a_4xx_naming_the_field(
    client: TestClient, fake: FakeOpenAI, path: str, body: str, field: str
) -> None:
    before = len(fake.requests)
    r = raw_post(client, path, body.replace("S", SURROGATE))
    assert r.status_code == (400 if path.startswith("/v1/") else 422), r.text
    message = r.json()["error"]["message"] if path.startswith("/v1/") else r.json()["detail"]
    assert f"{field} contains a lone surrogate (\\ud800)" in message, message
    assert len(fake.requests) == before  # nothing reached the engine
    listed = client.get("/indexes/kb/documents").json()
    assert listed["total_items"] == 1 and listed["documents"][0]["text"] == DOC["text"]


def test_the_value_at_fault_is_named_at_any_depth_and_a_filters_size_is_refused_first() -> None:
    from pydantic import ValidationError

    from ragserve.api.documents import RetrieveRequest
    from ragserve.api.values import check_values

    lone = "\ud800"
    for value, place in [
        ([1, {"a": [2, {"b\u00e9": lone}]}], "body[1]['a'][1]['b\u00e9'] contains a lone surrogate"),
        ({"x": [1.5, float("nan")]}, "body['x'][1]: nan is not a finite"),
        ([{"k": 1}, {lone: 1}], "body[1] key contains a lone surrogate"),
    ]:
        with pytest.raises(ValueError) as caught:
            check_values(value, "body")
        assert place in str(caught.value), caught.value
    # a filter's keys are counted before anything reads them (300,000 keys: seconds of the loop)
    flt = {f"k{i}": lone for i in range(300)}
    with pytest.raises(ValidationError, match="metadata_filter has 300 keys"):
        RetrieveRequest.model_validate({"index_name": "kb", "query": "q", "metadata_filter": flt})


def test_every_request_model_checks_its_strings() -> None:
    """Every model a route reads a body into is a RequestModel (and so is every model inside one)."""
    import ragserve.api.documents as documents
    import ragserve.api.openai as openai
    from ragserve.api.values import RequestModel

    requests = [documents.IndexRequest, documents.UpdateDocumentsRequest, documents.DeleteDocumentsRequest]
    requests += [
        documents.QueryRequest,
        documents.RetrieveRequest,
        openai.ChatCompletionRequest,
        openai.EmbeddingRequest,
    ]
    seen: set[type] = set()
    while requests:
        model = requests.pop()
        if model in seen:
            continue
        seen.add(model)
        assert issubclass(model, RequestModel), model
        for info in model.model_fields.values():
            requests += [t for t in _models_in(info.annotation) if t not in seen]
    assert len(seen) >= 11


def _models_in(annotation: Any) -> list[type]:
    from typing import get_args

    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models_in(arg)]


# --- response headers built from client input are bounded -------------------------------------

LONG_CJK_QUESTION = "KAITO 是什么？它如何在 Kubernetes 上运行模型推理" * 80  # ~2,300 characters


def decoded(value: str) -> str:
    """What a client reads from ``X-RAG-Query``: its JSON-safe form parsed as a JSON string."""
    return json.loads(f'"{value}"', strict=True)


@pytest.mark.parametrize("stream", [False, True])
def test_a_long_query_gives_a_bounded_x_rag_query_that_says_it_was_cut(client: TestClient, stream: bool) -> None:
    r = client.post(
        "/v1/chat/completions",
        json={"index_name": "kb", "stream": stream, "messages": [{"role": "user", "content": LONG_CJK_QUESTION}]},
    )
    assert r.status_code == 200 and r.headers["x-rag-mode"] == "rag", r.text
    header = r.headers["x-rag-query"]
    assert len(header) <= MAX_QUERY_HEADER_BYTES and r.headers["x-rag-query-truncated"] == "true"
    assert header.isascii() and "%" not in header
    assert LONG_CJK_QUESTION.startswith(decoded(header)) and decoded(header).startswith(
        "KAITO 是"
    )  # cut between characters
    assert sum(len(k) + len(v) for k, v in r.headers.items()) < 4096  # fits any proxy's header buffer
    if stream:
        first = json.loads(r.text.split("\n\n")[0].removeprefix("data: "))
        assert first["rag"]["query"] == LONG_CJK_QUESTION
    else:
        assert r.json()["rag"]["query"] == LONG_CJK_QUESTION


def test_a_short_query_is_sent_readable_and_whole_and_not_marked(client: TestClient) -> None:
    r = client.post(
        "/v1/chat/completions",
        json={"index_name": "kb", "messages": [{"role": "user", "content": "What is KAITO?\r\n"}]},
    )
    assert r.headers["x-rag-query"] == "What is KAITO?\\r\\n" and "x-rag-query-truncated" not in r.headers
    assert decoded(r.headers["x-rag-query"]) == r.json()["rag"]["query"]  # the body's query, exactly


@pytest.mark.parametrize(
    "query",
    [
        "What is KAITO?",
        'Is "KAITO" a C:\\path\\to\\it?',
        "KAITO: café, naïve, 東京, 😀?",
        "What is KAITO?\r\nline two\ttab\x00nul\x7fdel\x1b[31m",
        "  KAITO operator  ",
        "%41%0D%0A: KAITO is not percent-decoded",
    ],
)
def test_x_rag_query_decodes_to_the_body_query(client: TestClient, query: str) -> None:
    """(A lone surrogate is refused with a 400 before retrieval; ``query_headers`` escapes one.)"""
    body = {"index_name": "kb", "messages": [{"role": "user", "content": query}]}
    r = client.post("/v1/chat/completions", content=json.dumps(body), headers={"Content-Type": "application/json"})
    assert r.status_code == 200, r.text
    header = r.headers["x-rag-query"]
    assert header.isascii() and header.isprintable() and "\r" not in header and "\n" not in header
    assert decoded(header) == r.json()["rag"]["query"]
    assert "x-rag-query-truncated" not in r.headers


@pytest.mark.parametrize("length", [0, 1, 2, 5, 6, 11, 12, 13, 256, 1000])
def test_query_headers_cut_at_character_and_escape_boundaries(length: int) -> None:
    for text in ("a" * 2000, "é" * 2000, "😀" * 2000, "a😀" * 1000, "\n" * 2000, " x" * 1000, "\ud800" * 2000):
        headers = query_headers(text, limit=length)
        value = headers["X-RAG-Query"]
        assert len(value) <= length and value.isascii() and value == value.strip(" ")
        assert text.startswith(decoded(value))  # never inside an escape or between a surrogate pair's halves
        assert headers.get("X-RAG-Query-Truncated") == "true"
        assert len(value) > length - len("\\ud83d\\ude00") - len("\\u0020")  # as much as fits


def test_query_headers_of_a_megabyte_read_only_what_they_send() -> None:
    text = "\r\n" * 1_000_000
    t0 = time.thread_time()
    headers = query_headers(text)
    assert time.thread_time() - t0 < 1.0
    assert headers == {"X-RAG-Query": "\\r\\n" * 64, "X-RAG-Query-Truncated": "true"}


def test_headers_from_a_huge_request_stay_small(client: TestClient) -> None:
    """Every header a response builds (mode, reason, query, timings) stays small whatever was sent."""
    huge = "KAITO operator " * 300  # 4,500 characters that fit the window
    for r in (
        client.post("/v1/chat/completions", json={"index_name": "kb", "messages": [{"role": "user", "content": huge}]}),
        client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": huge}]}),
        client.post("/retrieve", json={"index_name": "kb", "query": huge}),
    ):
        assert r.status_code == 200, r.text
        assert sum(len(k) + len(v) for k, v in r.headers.items()) < 4096, dict(r.headers)


# --- citations: [n] in code is code --------------------------------------------------------------

SOURCES = [NodeWithScore(doc_id=f"d{i}", node_id=f"n{i}", text="t", score=1.0) for i in range(1, 4)]


@pytest.mark.parametrize(
    ("answer", "cited"),
    [
        ("Index it with `a[1]` then read [2].", [2]),
        ("Use ``x`[1]`` or `y[3]` [2].", [2]),
        ("Before [1].\n```python\nvalues[2] = 3\n```\nAfter [3].", [1, 3]),
        ("Before [1].\n~~~\nvalues[2]\n```\nstill code [3]\n~~~\nAfter [1].", [1, 1]),
        ("Before [1].\n```\nnever closed [2] [3]", [1]),
        ("Before [1].\n   ````\nv[2]\n```\nstill v[3]\n````\n[2]", [1, 2]),
        ("An unmatched ` backtick is literal [1], and so is `` this [2].", [1, 2]),
        ("Inline `spans\nmay cross lines [1]` [3].", [3]),
    ],
)
def test_markers_inside_code_are_not_citations(answer: str, cited: list[int]) -> None:
    valid, invalid = parse_citations(answer, SOURCES)
    assert [c.marker for c in valid] == cited and invalid == []


def test_a_marker_in_code_is_not_reported_over_http(client: TestClient, fake: FakeOpenAI) -> None:
    fake.answer = "Call `nodes[9]` or:\n```python\nnodes[3]\n```\nKAITO runs models [1]."
    try:
        r = client.post(
            "/v1/chat/completions",
            json={"index_name": "kb", "messages": [{"role": "user", "content": "What is KAITO?"}]},
        )
    finally:
        fake.answer = "KAITO runs models [1]."
    body = r.json()
    assert [c["marker"] for c in body["citations"]] == [1] and body["invalid_citations"] == [], body


@pytest.mark.parametrize(
    "shape", ["[1,", "[", "[1 ", "[1, ", "`", "` ", "```\n", "`a[1]` ", "~~~\n[1]\n", "[1]\n```\n", "\\[1"]
)
def test_citation_parsing_is_linear_on_a_megabyte_of_worst_shapes(shape: str) -> None:
    from ragserve.rag.citations import code_regions

    text = shape * (2**20 // len(shape))
    t0 = time.thread_time()  # CPU time: the shared machine's load does not count (mostly)
    code_regions(text)
    list(_MARKER.finditer(text))
    assert time.thread_time() - t0 < BOUND_S, shape  # a megabyte's bound, as for every worst shape
    if shape in ("`", "` ", "```\n", "`a[1]` "):  # every marker in code: the whole parse, skipping them
        t0 = time.thread_time()
        parse_citations(text, SOURCES)
        assert time.thread_time() - t0 < BOUND_S, shape


# --- a max_tokens that leaves no room for the sources -------------------------------------------


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
@pytest.mark.parametrize("stream", [False, True])
def test_a_max_tokens_that_leaves_no_room_for_sources_is_a_400_saying_what_to_lower(
    client: TestClient, fake: FakeOpenAI, field: str, stream: bool
) -> None:
    question = {"index_name": "kb", "stream": stream, "messages": [{"role": "user", "content": "What is KAITO?"}]}
    before = len(fake.requests)
    r = client.post("/v1/chat/completions", json={**question, field: 4000})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "context_budget" and error["param"] == field
    assert "tokens are left for sources" in error["message"] and "no_context" not in r.text
    assert len(fake.requests) == before  # not answered without its sources
    room = int(re.search(rf"lower {field} \(now 4000\) to at most about (\d+)", error["message"]).group(1))
    r = client.post("/v1/chat/completions", json={**question, field: room})
    assert r.status_code == 200 and r.headers["x-rag-mode"] == "rag", r.text
    assert "KAITO is a Kubernetes operator" in json.dumps(fake.requests[-1]["messages"])


def test_query_with_a_max_tokens_that_leaves_no_room_for_sources_is_a_400(client: TestClient) -> None:
    r = client.post("/query", json={"index_name": "kb", "query": "What is KAITO?", "llm_params": {"max_tokens": 4000}})
    assert r.status_code == 400 and "lower llm_params.max_tokens (now 4000)" in r.json()["detail"], r.text


def test_nothing_relevant_is_still_the_no_context_passthrough(client: TestClient) -> None:
    r = client.post(
        "/v1/chat/completions",
        json={
            "index_name": "kb",
            "max_tokens": 4000,
            "similarity_threshold": 0.99,
            "messages": [{"role": "user", "content": "What is KAITO?"}],
        },
    )
    assert r.status_code == 200 and (r.headers["x-rag-mode"], r.headers["x-rag-reason"]) == (
        "passthrough",
        "no_context",
    )


@pytest.mark.parametrize(
    ("path", "body", "says"),
    [
        ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi"}], "foo": NaN}', "foo: nan"),
        (
            "/v1/chat/completions",
            '{"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"1": Infinity}}',
            "logit_bias['1']: inf",
        ),
        (
            "/v1/chat/completions",
            '{"index_name": "kb", "messages": [{"role": "user", "content": "hi", "x": [-Infinity]}]}',
            "x[0]: -inf",
        ),
        ("/v1/embeddings", '{"input": "hi", "foo": {"bar": NaN}}', "foo['bar']: nan"),
    ],
)
def test_nan_and_infinity_anywhere_are_refused_not_forwarded(
    client: TestClient, fake: FakeOpenAI, path: str, body: str, says: str
) -> None:
    before = len(fake.requests)
    r = raw_post(client, path, body)
    assert r.status_code == 400 and says in r.json()["error"]["message"], r.text
    assert "is not a finite number" in r.text and len(fake.requests) == before


def test_a_body_that_is_not_an_object_says_so_with_no_param(client: TestClient) -> None:
    for body in ("[]", '"x"', "null", "3"):
        r = raw_post(client, "/v1/chat/completions", body)
        error = r.json()["error"]
        assert r.status_code == 400 and error["param"] is None, r.text
        assert error["message"].startswith("body: Input should be a valid dictionary"), r.text


def test_a_union_mismatch_names_fields_not_pydantic_types(client: TestClient) -> None:
    r = client.post(
        "/v1/chat/completions", json={"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}
    )
    message = r.json()["error"]["message"]
    assert r.status_code == 400 and message.startswith("messages.0.content: Input should be a valid string"), message
    assert "messages.0.content.0.text: Input should be a valid string" in message and "[" not in message


def test_a_malformed_metadata_filter_in_the_query_string_says_where(client: TestClient) -> None:
    r = client.get("/indexes/kb/documents", params={"metadata_filter": '{"topic": kaito}'})
    assert r.status_code == 400, r.text
    assert r.json()["detail"] == "metadata_filter: invalid JSON at line 1, column 11: Expecting value"


# --- numbers JSON allows but Python will not read ------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/index", '{"index_name": "kb", "documents": [{"text": "t", "metadata": {"n": %s}}]}'),
        ("/indexes/kb/documents/delete", '{"doc_ids": ["a", %s]}'),
        ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi"}], "temperature": %s}'),
        ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi"}],\n "extra": [%s]}'),
        ("/retrieve", '{"index_name": "kb", "query": "q", "metadata_filter": {"n": %s}}'),
    ],
)
def test_an_integer_of_thousands_of_digits_is_a_400_saying_where(client: TestClient, path: str, body: str) -> None:
    """Python refuses to read an integer of more than 4300 digits (a ValueError, not a JSON decode
    error): FastAPI answered "There was an error parsing the body". Now a 400 naming where it is."""
    text = body % ("1" * 5001)
    r = raw_post(client, path, text)
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"] if path.startswith("/v1/") else r.json()["detail"]
    line = text[: text.index("1" * 5001)].count("\n") + 1
    assert f"invalid JSON at line {line}, column" in message and "more than 4300 digits" in message, message
    assert "64 bits" in message and "set_int_max_str_digits" not in message


def test_a_body_over_a_mib_is_checked_and_parsed_off_the_loop_with_the_same_answers(client: TestClient) -> None:
    # bodies over OFF_LOOP_BYTES are scanned and parsed on a worker thread: the same 400 for a number
    # Python refuses, the same result for a good body
    from ragserve.http.json_body import OFF_LOOP_BYTES

    pad = "x" * (OFF_LOOP_BYTES + 1000)
    text = '{"index_name": "kb", "documents": [{"text": "PAD", "metadata": {"n": N}}]}'
    r = raw_post(client, "/index", text.replace("PAD", pad).replace("N", "1" * 5001))
    assert r.status_code == 400 and "more than 4300 digits" in r.json()["detail"], r.text
    # over a MiB in metadata (cheap to index): 20 values of 60,000 characters
    meta = ", ".join(f'"k{i}": "{"m" * 60_000}"' for i in range(20))
    r = raw_post(
        client,
        "/index",
        '{"index_name": "big", "documents": [{"text": "t", "metadata": {META}}]}'.replace("META", meta),
    )
    assert r.status_code == 200, r.text
    assert client.get("/indexes/big/documents").json()["documents"][0]["metadata"]["k19"] == "m" * 60_000
    truncated = '{"index_name": "kb", "documents": [{"text": "PAD"}'.replace("PAD", pad)
    assert raw_post(client, "/index", truncated).status_code == 422


def test_an_integer_of_thousands_of_digits_in_the_list_filter_is_a_400_saying_where(client: TestClient) -> None:
    r = client.get("/indexes/kb/documents", params={"metadata_filter": '{"n": ' + "9" * 5000 + "}"})
    assert r.status_code == 400, r.text
    assert "invalid JSON at line 1, column 7" in r.json()["detail"] and "set_int_max_str_digits" not in r.text


def test_a_long_run_of_digits_inside_a_string_is_only_text(client: TestClient) -> None:
    r = raw_post(client, "/retrieve", '{"index_name": "kb", "query": "' + "7" * 6000 + '", "max_node_count": 1}')
    assert r.status_code == 200, r.text


def test_finding_a_long_integer_is_linear() -> None:
    from ragserve.api.values import number_error_message

    t0 = time.process_time()
    for shape in ("1" * 4300 + " ") * 240, "1" * 1_000_000, ("12 " * 333_333):
        number_error_message(shape)
    assert time.process_time() - t0 < BOUND_S  # linear: well under a second on a quiet host


# --- an upstream's lone surrogates ----------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("index", [None, "kb"])
def test_a_lone_surrogate_in_the_upstream_answer_is_served_not_a_500(
    client: TestClient, fake: FakeOpenAI, stream: bool, index: str | None
) -> None:
    fake.answer = "KAITO \ud800 runs models [1]."
    try:
        body: dict[str, Any] = {"messages": [{"role": "user", "content": "What is KAITO?"}], "stream": stream}
        if index:
            body["index_name"] = index
        r = client.post("/v1/chat/completions", json=body)
    finally:
        fake.answer = "KAITO runs models [1]."
    assert r.status_code == 200, r.text
    if stream:
        events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
        assert not [e for e in events if "error" in e], events
        text = "".join(c["delta"].get("content") or "" for e in events for c in e.get("choices", []))
    else:
        text = r.json()["choices"][0]["message"]["content"]
    assert "KAITO \ufffd runs models" in text, text
