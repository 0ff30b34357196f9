"""Retrieval quality over HTTP, in-process (real shards, chunker, MiniLM; a fake upstream): the modes,
follow-up questions, chat's candidate count, citations and the "Sources:" text."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ragserve.testing.fake_openai import FakeOpenAI
from ragserve.testing.inprocess import inprocess_app

DOCS = [
    {
        "doc_id": "zephyr",
        "text": "The Zephyr X200 is a quiet submersible water pump for garden ponds and fountains, "
        "moving up to 2000 litres per hour.",
        "metadata": {"title": "Zephyr X200 overview", "product": "zephyr"},
    },
    {
        "doc_id": "zephyr-install",
        "text": "Installing the Zephyr X200: place the Zephyr X200 pump on a flat stone at "
        "the bottom of the pond, connect the hose to the outlet and plug it into a grounded outdoor socket.",
        "metadata": {"title": "Zephyr X200 installation", "product": "zephyr"},
    },
    {
        "doc_id": "lumen",
        "text": "The Lumen desk lamp has three brightness levels and a USB-C charging port in its base.",
        "metadata": {"title": "Lumen lamp overview", "product": "lumen"},
    },
    {
        "doc_id": "lumen-install",
        "text": "Installing the Lumen lamp: screw the arm into the base and connect the USB-C cable.",
        "metadata": {"title": "Lumen lamp installation", "product": "lumen"},
    },
    {
        "doc_id": "part",
        "text": "Replacement seal kit, part number QK-4471-B, fits the housing of older fountain models.",
        "metadata": {"title": "Seal kit", "product": "parts"},
    },
]
FIRST_TURN = "What is the Zephyr X200?"


def answer(body: dict[str, Any]) -> str:
    """The fake model: a rewrite request gets a standalone question; a RAG request cites [1] and a
    source that does not exist ([9])."""
    system = body["messages"][0]["content"] if body["messages"][0]["role"] == "system" else ""
    if system.startswith("Rewrite the user's last question"):
        return "How do I install the Zephyr X200 pump?"
    return "Place it on a flat stone [1]. It is quiet.[9]"


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(answer=answer, model="fake-model", max_model_len=4096) as f:
        yield f


@pytest.fixture
def client(tmp_path, embedder, fake: FakeOpenAI) -> Iterator[TestClient]:
    with inprocess_app(tmp_path, embedder, fake.url, llm_timeout_s=10.0) as (app, _), TestClient(app) as c:
        assert c.post("/index", json={"index_name": "kb", "documents": DOCS}).status_code == 200
        fake.requests.clear()
        yield c


def retrieve(client: TestClient, query: str, **kw: Any) -> list[dict[str, Any]]:
    r = client.post("/retrieve", json={"index_name": "kb", "query": query, "max_node_count": 5, **kw})
    assert r.status_code == 200, r.text
    return r.json()["results"]


def test_a_part_number_is_found_lexically_and_passes_the_threshold_on_its_own(client: TestClient) -> None:
    dense = retrieve(client, "QK-4471-B", retrieval_mode="dense")
    lexical = retrieve(client, "QK-4471-B", retrieval_mode="lexical")
    hybrid = retrieve(client, "QK-4471-B")  # the server's default mode: hybrid
    assert [n["doc_id"] for n in lexical] == ["part"]
    assert hybrid[0]["doc_id"] == "part"
    top = hybrid[0]
    assert top["sources"] == ["dense", "lexical"] or top["sources"] == ["lexical"]
    assert top["fused_score"] > 0 and -1.0 <= top["score"] <= 1.0
    assert top["score"] == pytest.approx(next(n["score"] for n in dense if n["doc_id"] == "part"), abs=1e-5)
    assert all(n["sources"] == ["dense"] for n in dense)
    # "qk", "4471", "b": every term of a three-term query matched, so the node passes any threshold
    strict = retrieve(client, "QK-4471-B", similarity_threshold=0.99)
    assert [n["doc_id"] for n in strict] == ["part"] and strict[0]["keyword_match"] is True
    assert strict[0]["score"] < 0.99
    assert retrieve(client, "QK-4471-B", similarity_threshold=0.99, retrieval_mode="dense") == []


def test_a_paraphrase_is_found_densely(client: TestClient) -> None:
    assert retrieve(client, "a light for my writing table", retrieval_mode="dense")[0]["doc_id"] == "lumen"
    assert retrieve(client, "a light for my writing table", retrieval_mode="lexical") == []  # no shared word
    assert retrieve(client, "a light for my writing table")[0]["doc_id"] == "lumen"


def test_metadata_filters_apply_in_every_mode(client: TestClient) -> None:
    for mode in ("hybrid", "dense", "lexical"):
        nodes = retrieve(client, "installing", retrieval_mode=mode, metadata_filter={"product": "lumen"})
        assert nodes and {n["metadata"]["product"] for n in nodes} == {"lumen"}, mode


@pytest.mark.parametrize(
    "route,body",
    [
        ("/retrieve", {"index_name": "kb", "query": "x", "retrieval_mode": "bm25"}),
        ("/query", {"index_name": "kb", "query": "x", "retrieval_mode": "sparse"}),
        (
            "/v1/chat/completions",
            {"index_name": "kb", "messages": [{"role": "user", "content": "x"}], "retrieval_mode": "fuzzy"},
        ),
        (
            "/v1/chat/completions",
            {"index_name": "kb", "messages": [{"role": "user", "content": "x"}], "query_rewrite": "always"},
        ),
        (
            "/v1/chat/completions",
            {"index_name": "kb", "messages": [{"role": "user", "content": "x"}], "sources_in_content": "maybe"},
        ),
    ],
)
def test_a_bad_retrieval_field_is_a_4xx_naming_it(client: TestClient, route: str, body: dict[str, Any]) -> None:
    r = client.post(route, json=body)
    assert 400 <= r.status_code < 500
    field = next(k for k in ("retrieval_mode", "query_rewrite", "sources_in_content") if k in body)
    assert field in r.text


def chat(client: TestClient, messages: list[dict[str, str]], **kw: Any):
    return client.post("/v1/chat/completions", json={"index_name": "kb", "messages": messages, "max_tokens": 32, **kw})


FOLLOW_UP = [
    {"role": "user", "content": FIRST_TURN},
    {"role": "assistant", "content": "A submersible pond pump."},
    {"role": "user", "content": "How do I install it?"},
]


def test_a_follow_up_retrieves_with_the_subject_of_the_previous_turn_and_says_so(
    client: TestClient, fake: FakeOpenAI
) -> None:
    alone = retrieve(client, "How do I install it?", similarity_threshold=0.5)
    assert alone == []  # the newest turn alone finds nothing relevant
    r = chat(client, FOLLOW_UP)
    assert r.status_code == 200, r.text
    assert r.headers["x-rag-mode"] == "rag"
    used = "How do I install it? (Zephyr X200)"  # the earlier turn's names, not its whole text
    assert r.headers["x-rag-query"] == used  # readable: ASCII as it is
    body = r.json()
    rag = body["rag"]
    assert (rag["query"], rag["query_source"], rag["retrieval_mode"], rag["answerable"]) == (
        used,
        "followup",
        "hybrid",
        True,
    )
    used_ids = [n["doc_id"] for n in body["source_nodes"]]
    assert used_ids[rag["evidence"][0]["source"] - 1] == "zephyr-install"  # the follow-up query's evidence
    # the subject's install guide first; the other product's (which "install" also matches) after its sources
    assert used_ids[:2] == ["zephyr-install", "zephyr"], used_ids
    assert "Installing the Zephyr X200" in fake.requests[-1]["messages"][0]["content"]
    assert fake.requests[-1]["messages"][-1] == {"role": "user", "content": "How do I install it?"}
    assert len(fake.requests) == 1  # deterministic: no model call besides the answer


def test_a_first_question_retrieves_with_itself(client: TestClient) -> None:
    r = chat(client, [{"role": "user", "content": "How do I install the Zephyr X200?"}])
    assert r.headers["x-rag-query"] == "How do I install the Zephyr X200?"
    assert r.json()["rag"]["query_source"] == "message"


def test_a_new_subject_in_a_conversation_retrieves_with_itself(client: TestClient) -> None:
    # the newest turn finds its sources itself; joined to the turn before it, it would find them less well
    switch = [*FOLLOW_UP[:2], {"role": "user", "content": "How many brightness levels does the Lumen desk lamp have?"}]
    r = chat(client, switch)
    assert r.status_code == 200, r.text
    rag = r.json()["rag"]
    assert rag["query_source"] == "message" and r.json()["source_nodes"][0]["doc_id"] == "lumen"


def test_query_rewrite_llm_asks_the_generator_first(client: TestClient, fake: FakeOpenAI) -> None:
    r = chat(client, FOLLOW_UP, query_rewrite="llm")
    assert r.status_code == 200, r.text
    assert r.json()["rag"]["query"] == "How do I install the Zephyr X200 pump?"
    assert r.json()["rag"]["query_source"] == "rewritten"
    assert r.json()["source_nodes"][0]["doc_id"] == "zephyr-install"  # the rewrite names the install question
    rewrite, final = fake.requests[-2:]
    assert rewrite["max_tokens"] == 64 and "Last question: How do I install it?" in rewrite["messages"][-1]["content"]
    assert "query_rewrite" not in final  # a RAG field: never forwarded upstream


def test_query_rewrite_llm_leaves_a_new_subject_alone(client: TestClient, fake: FakeOpenAI) -> None:
    switch = [*FOLLOW_UP[:2], {"role": "user", "content": "How many brightness levels does the Lumen desk lamp have?"}]
    r = chat(client, switch, query_rewrite="llm")
    assert r.status_code == 200, r.text
    assert r.json()["rag"]["query_source"] == "message" and r.json()["source_nodes"][0]["doc_id"] == "lumen"
    assert len(fake.requests) == 1  # the answer only: a turn that does not refer back is not rewritten


def test_nothing_relevant_anywhere_is_still_the_no_context_passthrough(client: TestClient, fake: FakeOpenAI) -> None:
    for mode in ("hybrid", "dense", "lexical"):
        r = chat(client, [{"role": "user", "content": "Who won the 1954 chess olympiad?"}], retrieval_mode=mode)
        assert r.status_code == 200
        assert (r.headers["x-rag-mode"], r.headers["x-rag-reason"]) == ("passthrough", "no_context"), mode
        assert "x-rag-query" in r.headers
        assert "retrieval_mode" not in fake.requests[-1]


def test_citations_name_the_supplied_sources_and_report_invented_ones(client: TestClient) -> None:
    r = chat(client, [{"role": "user", "content": "How do I install the Zephyr X200?"}])
    body = r.json()
    text = body["choices"][0]["message"]["content"]
    assert text == "Place it on a flat stone [1]. It is quiet.[9]"
    first = body["source_nodes"][0]
    assert body["citations"] == [
        {
            "marker": 1,
            "node_id": first["node_id"],
            "doc_id": first["doc_id"],
            "index_name": "kb",
            "start": 0,
            "end": len("Place it on a flat stone [1]"),
        }
    ]
    assert body["invalid_citations"] == [{"marker": 9, "start": text.index("It is"), "end": len(text)}]


def test_sources_in_content_appends_a_plain_list(client: TestClient) -> None:
    r = chat(client, [{"role": "user", "content": "How do I install the Zephyr X200?"}], sources_in_content=True)
    text = r.json()["choices"][0]["message"]["content"]
    assert text.endswith("\n\nSources:\n[1] Zephyr X200 installation (zephyr-install)")


def stream_events(client: TestClient, messages: list[dict[str, str]], **kw: Any) -> list[dict[str, Any]]:
    with client.stream(
        "POST",
        "/v1/chat/completions",
        json={"index_name": "kb", "messages": messages, "max_tokens": 32, "stream": True, **kw},
    ) as r:
        assert r.status_code == 200
        assert "x-rag-query" in r.headers
        lines = [ln[6:] for ln in r.iter_lines() if ln.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(x) for x in lines[:-1]]


def test_a_stream_sends_rag_first_and_citations_in_its_final_chunk(client: TestClient) -> None:
    events = stream_events(client, FOLLOW_UP, sources_in_content=True)
    assert events[0]["rag"]["query_source"] == "followup" and events[0]["source_nodes"]
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
    assert text.startswith("Place it on a flat stone [1]. It is quiet.[9]\n\nSources:\n[1] ")
    last = events[-1]
    assert last["choices"][0]["finish_reason"] == "stop"
    assert [c["marker"] for c in last["citations"]] == [1]
    assert [c["marker"] for c in last["invalid_citations"]] == [9]
    assert all("citations" not in e for e in events[:-1])


def test_chat_without_top_k_retrieves_enough_candidates_for_its_budget(
    client: TestClient, fake: FakeOpenAI, monkeypatch
) -> None:
    from ragserve.service.documents import DocumentService

    seen: list[int] = []
    original = DocumentService.retrieve

    async def spy(self, index, query, k, *args, **kwargs):
        seen.append(k)
        return await original(self, index, query, k, *args, **kwargs)

    monkeypatch.setattr(DocumentService, "retrieve", spy)
    chat(client, [{"role": "user", "content": "How do I install the Zephyr X200?"}])
    # window 4096, 32 reserved, ratio 0.5, chunks of 128 tokens: 15 candidates
    assert seen == [(4096 - 32) * 0.5 // 128]
    chat(client, [{"role": "user", "content": "How do I install the Zephyr X200?"}], top_k=2)
    assert seen[-1] == 2
