"""Several indexes in one query over HTTP, in-process (real shards, chunker and MiniLM; a fake
upstream): one ranking across indexes whose nodes name their index, filters in each, scoped keys
over every index named, a missing index named in its 404, and one document fetched by id."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ragserve.api.documents import MAX_QUERY_INDEXES
from ragserve.testing.fake_openai import FakeOpenAI
from ragserve.testing.inprocess import inprocess_app

PUMPS = [
    {
        "doc_id": "zephyr",
        "text": "The Zephyr X200 is a submersible water pump for garden ponds, moving 2000 litres per hour.",
        "metadata": {"title": "Zephyr X200", "lang": "en", "path": "pumps/zephyr.md"},
    },
    {
        "doc_id": "zephyr-de",
        "text": "Die Zephyr X200 ist eine Tauchpumpe für Gartenteiche.",
        "metadata": {"title": "Zephyr X200 (de)", "lang": "de"},
    },
]
LAMPS = [
    {
        "doc_id": "lumen",
        "text": "The Lumen desk lamp has three brightness levels and charges its battery over USB-C.",
        "metadata": {"title": "Lumen lamp", "lang": "en", "path": "lamps/lumen.md"},
    },
    {
        "doc_id": "lumen-de",
        "text": "Die Lumen Schreibtischlampe hat drei Helligkeitsstufen.",
        "metadata": {"title": "Lumen (de)", "lang": "de"},
    },
]
SHARED = {"doc_id": "warranty", "text": "Every product carries a two-year warranty against defects."}
READER = "sk-reader-of-pumps-and-lamps"
PUMPS_ONLY = "sk-reader-of-pumps-only"
KEYS: list[Any] = [
    "sk-admin-key-0123456789",
    {"key": READER, "indexes": ["pumps", "lamps"], "role": "read"},
    {"key": PUMPS_ONLY, "indexes": ["pumps"], "role": "read"},
]
ADMIN = {"Authorization": "Bearer sk-admin-key-0123456789"}
SPANNING = "Which pump suits a garden pond, and how does the desk lamp charge?"


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(answer="From the sources [1] [2].", model="fake-model", max_model_len=4096) as f:
        yield f


@pytest.fixture
def client(tmp_path, embedder, fake: FakeOpenAI) -> Iterator[TestClient]:
    with (
        inprocess_app(tmp_path, embedder, fake.url, api_keys=KEYS, similarity_threshold=0.0) as (app, _),
        TestClient(app, headers=ADMIN) as c,
    ):
        for name, docs in (("pumps", [*PUMPS, SHARED]), ("lamps", [*LAMPS, SHARED])):
            assert c.post("/index", json={"index_name": name, "documents": docs}).status_code == 200
        yield c


def retrieve(client: TestClient, index: Any, query: str = SPANNING, **kw: Any) -> list[dict[str, Any]]:
    r = client.post("/retrieve", json={"index_name": index, "query": query, "max_node_count": 4, **kw})
    assert r.status_code == 200, r.text
    return r.json()["results"]


def test_a_question_that_spans_two_indexes_finds_a_document_in_each_and_names_their_index(client) -> None:
    results = retrieve(client, ["pumps", "lamps"])
    found = {(n["index_name"], n["doc_id"]) for n in results[:2]}
    assert found == {("pumps", "zephyr"), ("lamps", "lumen")}, results
    fused = [n["fused_score"] for n in results]
    assert fused == sorted(fused, reverse=True)  # one ranking across both
    assert all(n["index_name"] in ("pumps", "lamps") for n in results)
    # one index alone: its own nodes only, and they name it too
    assert {n["index_name"] for n in retrieve(client, "pumps")} == {"pumps"}


def test_scores_compare_across_indexes_and_a_shared_document_counts_once_per_index(client) -> None:
    results = retrieve(client, ["pumps", "lamps"], "What warranty do the products carry?", retrieval_mode="dense")
    shared = [n for n in results if n["doc_id"] == "warranty"]
    assert {n["index_name"] for n in shared} == {"pumps", "lamps"}  # the same node id, kept once in each index
    assert shared[0]["score"] == pytest.approx(shared[1]["score"], abs=1e-5)
    alone = retrieve(client, "lamps", "What warranty do the products carry?", retrieval_mode="dense")
    assert alone[0]["doc_id"] == "warranty"
    assert alone[0]["score"] == pytest.approx(shared[0]["score"], abs=1e-5)  # the same score as in one index


@pytest.mark.parametrize("mode", ["hybrid", "dense", "lexical"])
def test_a_filter_applies_in_every_index(client, mode: str) -> None:
    results = retrieve(client, ["pumps", "lamps"], "Zephyr Lumen", metadata_filter={"lang": "de"}, retrieval_mode=mode)
    assert {(n["index_name"], n["doc_id"]) for n in results} == {("pumps", "zephyr-de"), ("lamps", "lumen-de")}


def test_a_missing_index_is_a_404_naming_it_on_every_route(client) -> None:
    names = ["pumps", "nowhere", "lamps"]
    for path, body in (
        ("/retrieve", {"query": "pump"}),
        ("/query", {"query": "pump"}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "pump?"}]}),
    ):
        r = client.post(path, json={"index_name": names, **body})
        assert r.status_code == 404, (path, r.text)
        assert "'nowhere'" in r.text


def test_a_scoped_key_must_reach_every_index_named(client) -> None:
    both = {"index_name": ["pumps", "lamps"], "query": "pump"}
    r = client.post("/retrieve", json=both, headers=bearer(PUMPS_ONLY))
    assert r.status_code == 403 and "'lamps'" in r.text, r.text
    assert client.post("/retrieve", json=both, headers=bearer(READER)).status_code == 200
    for path, body in (
        ("/query", {"query": "pump"}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "pump?"}]}),
    ):
        r = client.post(path, json={"index_name": ["pumps", "lamps"], **body}, headers=bearer(PUMPS_ONLY))
        assert r.status_code == 403 and "'lamps'" in r.text, (path, r.text)
    # a forbidden index is refused before its existence is told
    r = client.post("/retrieve", json={"index_name": ["pumps", "secret"], "query": "x"}, headers=bearer(READER))
    assert r.status_code == 403 and "'secret'" in r.text


@pytest.mark.parametrize(
    ("index_name", "says"),
    [
        ([], "at least one index"),
        (["pumps", "bad name"], "invalid index name"),
        ([f"ix{i}" for i in range(MAX_QUERY_INDEXES + 1)], f"at most {MAX_QUERY_INDEXES}"),
        ([["pumps"]], "index_name"),
        ([None], "index_name"),
        ({"pumps": 1}, "index_name"),
    ],
)
def test_a_malformed_list_is_a_4xx_that_says_what_to_fix(client, index_name: Any, says: str) -> None:
    for path, extra in (
        ("/retrieve", {"query": "x"}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
    ):
        r = client.post(path, json={"index_name": index_name, **extra})
        assert r.status_code == (400 if path.startswith("/v1/") else 422), (path, r.text)  # each API's shape
        assert says in r.text, r.text


def test_a_name_repeated_is_searched_once(client) -> None:
    twice = retrieve(client, ["pumps", "pumps", "lamps"])
    once = retrieve(client, ["pumps", "lamps"])
    assert [(n["index_name"], n["node_id"]) for n in twice] == [(n["index_name"], n["node_id"]) for n in once]


def test_a_rag_chat_over_two_indexes_answers_from_both_within_one_budget(client, fake: FakeOpenAI) -> None:
    fake.requests.clear()
    r = client.post(
        "/v1/chat/completions",
        json={"index_name": ["pumps", "lamps"], "top_k": 4, "messages": [{"role": "user", "content": SPANNING}]},
    )
    assert r.status_code == 200, r.text
    assert r.headers["X-RAG-Mode"] == "rag"
    body = r.json()
    sources = {(n["index_name"], n["doc_id"]) for n in body["source_nodes"]}
    assert {("pumps", "zephyr"), ("lamps", "lumen")} <= sources
    assert len(body["source_nodes"]) <= 4  # top_k across the indexes, not per index
    prompt = " ".join(str(m["content"]) for m in fake.requests[-1]["messages"])
    assert "Zephyr X200" in prompt and "Lumen" in prompt
    cited = {(c["index_name"], c["doc_id"]) for c in body["citations"]}  # [1] [2]: each names its index
    assert cited == {(n["index_name"], n["doc_id"]) for n in body["source_nodes"][:2]}
    q = client.post("/query", json={"index_name": ["pumps", "lamps"], "query": SPANNING, "top_k": 4})
    assert q.status_code == 200, q.text
    assert {n["index_name"] for n in q.json()["source_nodes"]} == {"pumps", "lamps"}
    # metadata by index/node_id: the same node id in two indexes keeps both
    assert set(q.json()["metadata"]) == {f"{n['index_name']}/{n['node_id']}" for n in q.json()["source_nodes"]}
    one = client.post("/query", json={"index_name": "pumps", "query": SPANNING, "top_k": 2}).json()
    assert set(one["metadata"]) == {n["node_id"] for n in one["source_nodes"]}  # one index: KAITO's keys


def test_a_streamed_chat_over_two_indexes_names_each_sources_index(client) -> None:
    body = {"index_name": ["pumps", "lamps"], "top_k": 4, "stream": True}
    with client.stream(
        "POST", "/v1/chat/completions", json={**body, "messages": [{"role": "user", "content": SPANNING}]}
    ) as r:
        assert r.status_code == 200
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    sources = next(e["source_nodes"] for e in events if e.get("source_nodes"))
    assert {("pumps", "zephyr"), ("lamps", "lumen")} <= {(n["index_name"], n["doc_id"]) for n in sources}


def test_one_document_by_id(client) -> None:
    r = client.get("/indexes/pumps/documents/zephyr")
    assert r.status_code == 200, r.text
    assert r.json()["text"] == PUMPS[0]["text"] and r.json()["metadata"]["path"] == "pumps/zephyr.md"
    cut = client.get("/indexes/pumps/documents/zephyr", params={"max_text_length": 10}).json()
    assert cut["text"] == PUMPS[0]["text"][:10] and cut["is_truncated"] is True
    slashed = {"doc_id": "docs/a b/c.md", "text": "A document whose id is a path."}
    assert client.post("/index", json={"index_name": "pumps", "documents": [slashed]}).status_code == 200
    assert client.get("/indexes/pumps/documents/docs%2Fa%20b%2Fc.md").json()["text"] == slashed["text"]
    missing = client.get("/indexes/pumps/documents/nope")
    assert missing.status_code == 404 and "'nope'" in missing.text
    assert client.get("/indexes/nowhere/documents/zephyr").status_code == 404
    assert client.get("/indexes/pumps/documents/zephyr", params={"max_text_length": 0}).status_code in (400, 422)
    forbidden = client.get("/indexes/lamps/documents/lumen", headers=bearer(PUMPS_ONLY))
    assert forbidden.status_code == 403 and "'lamps'" in forbidden.text
