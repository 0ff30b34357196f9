"""API keys, request limits and path confinement over HTTP, on the in-process application."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from app.http.security import KeyChecker
from tests.fakes.fake_openai import FakeOpenAI
from tests.inprocess import inprocess_app

KEY = "sk-test-key-0123456789"
OPEN = {"/health", "/metrics", "/ui", "/ui/"}  # probes, and the playground page (its API calls need the key)


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(answer="ok", model="fake-model", max_model_len=4096) as f:
        yield f


@pytest.fixture
def secured(tmp_path, embedder, fake) -> Iterator[TestClient]:
    with inprocess_app(tmp_path, embedder, fake.url, api_keys=[KEY, "second-key"]) as (app, _), \
            TestClient(app) as client:
        yield client


@pytest.fixture
def limited(tmp_path, embedder, fake) -> Iterator[TestClient]:
    with inprocess_app(tmp_path, embedder, fake.url, max_request_bytes=4096, max_documents_per_request=3,
                       max_document_chars=200, max_chat_messages=4, max_top_k=7, max_list_limit=20) as (app, _), \
            TestClient(app) as client:
        client.post("/index", json={"index_name": "kb", "documents": [{"text": "KAITO runs models."}]})
        yield client


def concrete(path: str) -> str:
    return path.replace("{index_name}", "kb")


def all_routes(client: TestClient) -> list[tuple[str, str]]:
    routes = []
    for r in client.app.routes:
        methods = getattr(r, "methods", None) or {"GET"}
        for m in sorted(methods - {"HEAD", "OPTIONS"}):
            routes.append((m, concrete(r.path)))
    return routes


def test_every_route_but_the_probes_needs_a_key(secured: TestClient) -> None:
    routes = all_routes(secured)
    api_routes = {concrete(r.path) for r in secured.app.routes if isinstance(r, APIRoute)}
    assert {"/v1/chat/completions", "/index", "/persist/kb", "/retrieve", "/openapi.json"} <= \
        api_routes | {p for _, p in routes}
    for method, path in routes:
        bare = secured.request(method, path)
        wrong = secured.request(method, path, headers={"Authorization": "Bearer sk-wrong"})
        right = secured.request(method, path, headers={"Authorization": f"Bearer {KEY}"})
        if path in OPEN:
            assert bare.status_code == 200, path
            continue
        assert bare.status_code == 401 and wrong.status_code == 401, (method, path)
        assert bare.headers["www-authenticate"].startswith("Bearer")
        assert right.status_code != 401, (method, path)
    # a second configured key works too; other schemes and empty tokens do not
    assert secured.get("/indexes", headers={"Authorization": "Bearer second-key"}).status_code == 200
    assert secured.get("/indexes", headers={"Authorization": f"Basic {KEY}"}).status_code == 401
    assert secured.get("/indexes", headers={"Authorization": "Bearer "}).status_code == 401


def test_unauthenticated_error_shapes(secured: TestClient) -> None:
    r = secured.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 401
    err = r.json()["error"]
    assert err["code"] == "invalid_api_key" and err["type"] == "invalid_request_error" and "Bearer" in err["message"]
    r = secured.get("/indexes", headers={"Authorization": "Bearer nope"})
    assert r.json() == {"detail": "Incorrect API key provided."}
    # unknown paths do not reveal whether they exist
    assert secured.get("/no/such/route").status_code == 401
    assert secured.get("/no/such/route", headers={"Authorization": f"Bearer {KEY}"}).status_code == 404


def test_the_key_is_never_logged(secured: TestClient, caplog) -> None:
    caplog.set_level("DEBUG")
    secured.post("/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"},
                 json={"messages": [{"role": "user", "content": "hi"}]})
    secured.get("/indexes", headers={"Authorization": "Bearer sk-wrong-key-987"})
    assert KEY not in caplog.text and "sk-wrong-key-987" not in caplog.text


def test_key_checker_compares_every_key() -> None:
    check = KeyChecker(["a" * 32, "b" * 32])
    assert check("a" * 32) and check("b" * 32)
    assert not check("a" * 31) and not check("") and not check("c" * 32)
    with pytest.raises(ValueError):
        KeyChecker([])


def test_body_size_limit_is_413_declared_or_streamed(limited: TestClient) -> None:
    big = {"index_name": "kb", "documents": [{"text": "x" * 5000}]}
    r = limited.post("/index", json=big)
    assert r.status_code == 413 and "4096 bytes" in r.json()["detail"]
    r = limited.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "y" * 5000}]})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit applies while the body streams
        body = json.dumps(big).encode()
        for i in range(0, len(body), 1000):
            yield body[i:i + 1000]

    r = limited.post("/index", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_document_limits(limited: TestClient) -> None:
    four = [{"text": f"document {i}"} for i in range(4)]
    r = limited.post("/index", json={"index_name": "kb", "documents": four})
    assert r.status_code == 413 and "at most 3" in r.json()["detail"]
    r = limited.post("/index", json={"index_name": "kb", "documents": [{"text": "z" * 201}]})
    assert r.status_code == 413 and "documents[0].text has 201 characters" in r.json()["detail"]
    r = limited.post("/indexes/kb/documents", json={"documents": [{"doc_id": "a", "text": "z" * 201}]})
    assert r.status_code == 413
    r = limited.post("/indexes/kb/documents/delete", json={"doc_ids": ["a", "b", "c", "d"]})
    assert r.status_code == 413 and "doc_ids" in r.json()["detail"]
    r = limited.post("/v1/embeddings", json={"input": ["a", "b", "c", "d"]})
    assert r.status_code == 413 and r.json()["error"]["param"] == "input"
    # at the limit is fine
    assert limited.post("/index", json={"index_name": "kb", "documents": four[:3]}).status_code == 200


def test_chat_and_retrieval_limits(limited: TestClient) -> None:
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}] * 2 + \
        [{"role": "user", "content": "q"}]
    r = limited.post("/v1/chat/completions", json={"messages": msgs})
    assert r.status_code == 400 and "at most 4" in r.json()["error"]["message"]
    r = limited.post("/v1/chat/completions", json={"index_name": "kb", "top_k": 8,
                                                   "messages": [{"role": "user", "content": "q"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "top_k"
    r = limited.post("/retrieve", json={"index_name": "kb", "query": "q", "max_node_count": 8})
    assert r.status_code == 400 and "max_node_count must be at most 7" in r.json()["detail"]
    assert limited.post("/query", json={"index_name": "kb", "query": "q", "top_k": 8}).status_code == 400
    r = limited.get("/indexes/kb/documents", params={"limit": 21})
    assert r.status_code == 400 and "limit must be at most 20" in r.json()["detail"]
    assert limited.get("/indexes/kb/documents", params={"limit": 20}).status_code == 200
    assert limited.post("/retrieve", json={"index_name": "kb", "query": "q", "max_node_count": 7}).status_code == 200


@pytest.mark.parametrize("name", ["bad name", "a/b", "..", ".hidden", "x" * 129, "ünï", "a%2Fb"])
def test_index_names_are_validated_with_the_rule(limited: TestClient, name: str) -> None:
    r = limited.post("/index", json={"index_name": name, "documents": [{"text": "t"}]})
    assert r.status_code in (400, 422)
    assert "index names are 1-128 characters" in json.dumps(r.json())


@pytest.mark.parametrize("path", ["../x", "/etc", "%2e%2e/x", "%252e%252e%252fx", "..%2Fx", "a/../../x", "."])
def test_persist_and_load_traversal_is_400(limited: TestClient, path: str) -> None:
    r = limited.post("/persist/kb", params={"path": path})
    assert r.status_code == 400, r.text
    assert limited.post("/load/kb", params={"path": path, "overwrite": True}).status_code == 400
