"""End to end on Ray Serve with engine ``openai`` in front of a fake OpenAI-compatible upstream
started by the test: what reaches the upstream is asserted exactly."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from ragserve.testing.fake_openai import FakeOpenAI
from tests.integration.conftest import deploy

pytestmark = pytest.mark.slow
WINDOW = 2048


@pytest.fixture(scope="module")
def upstream():
    with FakeOpenAI(answer="Grounded answer [1].", model="upstream-model", max_model_len=WINDOW) as fake:
        yield fake


@pytest.fixture(scope="module")
def client(ray_cluster: int, upstream: FakeOpenAI, tmp_path_factory: pytest.TempPathFactory):
    storage = tmp_path_factory.mktemp("remote-storage")
    base = deploy(
        {
            "storage_dir": str(storage),
            "num_shards": 2,
            "llm_engine": "openai",
            "llm_url": upstream.url,
            "shard_num_cpus": 0.1,
        },
        "remote",
        ray_cluster,
    )
    with httpx.Client(base_url=base, timeout=60) as c:
        r = c.post(
            "/index",
            json={
                "index_name": "kb",
                "documents": [
                    {
                        "text": "The warranty covers parts and labour for two years from the date of purchase.",
                        "metadata": {"kind": "policy"},
                    },
                    {
                        "text": "Returns are accepted within thirty days with the original receipt.",
                        "metadata": {"kind": "policy"},
                    },
                ],
            },
        )
        assert r.status_code == 200, r.text
        yield c
    from ray import serve

    serve.delete("remote")


def test_models_come_from_upstream(client: httpx.Client) -> None:
    card = client.get("/v1/models").json()["data"][0]
    assert card["id"] == "upstream-model" and card["max_model_len"] == WINDOW


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        ({}, "no_index"),
        (
            {"index_name": "kb", "tools": [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]},
            "tools",
        ),
        (
            {
                "index_name": "kb",
                "messages": [{"role": "function", "name": "f", "content": "{}"}, {"role": "user", "content": "ok"}],
            },
            "unsupported_role",
        ),
        (
            {
                "index_name": "kb",
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "see"},
                            {"type": "image_url", "image_url": {"url": "http://h/i.png"}},
                        ],
                    }
                ],
            },
            "non_text_content",
        ),
        (
            {"index_name": "kb", "messages": [{"role": "user", "content": "Who won the 1998 football world cup?"}]},
            "no_context",
        ),
    ],
)
def test_passthrough_cases(client: httpx.Client, upstream: FakeOpenAI, extra: dict, reason: str) -> None:
    body = {
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 50_000,
        "top_k": 4,
        "context_token_ratio": 0.3,
        "similarity_threshold": 0.5,
        "metadata_filter": {"kind": "policy"},
        "user": "u-1",
        **extra,
    }
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    assert (r.headers["x-rag-mode"], r.headers["x-rag-reason"]) == ("passthrough", reason)
    sent = upstream.requests[-1]
    assert not {"index_name", "top_k", "context_token_ratio", "similarity_threshold", "metadata_filter"} & set(sent)
    assert sent["user"] == "u-1"
    assert sent["messages"] == body["messages"]
    assert isinstance(sent["max_tokens"], int) and 0 < sent["max_tokens"] < WINDOW


def test_rag_request_reaches_upstream_with_context(client: httpx.Client, upstream: FakeOpenAI) -> None:
    r = client.post(
        "/v1/chat/completions",
        json={
            "index_name": "kb",
            "max_tokens": 100,
            "messages": [{"role": "user", "content": "How long does the warranty last?"}],
        },
    )
    assert r.status_code == 200 and r.headers["x-rag-mode"] == "rag"
    assert "two years" in r.json()["source_nodes"][0]["text"]
    sent = upstream.requests[-1]
    assert "two years" in sent["messages"][0]["content"] and sent["max_tokens"] == 100


def test_streaming_passthrough_over_serve(client: httpx.Client) -> None:
    with client.stream(
        "POST", "/v1/chat/completions", json={"stream": True, "messages": [{"role": "user", "content": "hi"}]}
    ) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    text = "".join(
        json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
        for line in lines[:-1]
        if json.loads(line[6:]).get("choices")
    )
    assert text == "Grounded answer [1]."


def test_upstream_failure_keeps_status(client: httpx.Client, upstream: FakeOpenAI) -> None:
    upstream.fail_next(status=500, message="upstream exploded")
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 500 and "upstream exploded" in r.json()["error"]["message"]


def test_files_vector_stores_and_jobs_run_through_the_ingestion_deployment(client: httpx.Client) -> None:
    """On Ray the files, jobs and vector stores live in the one Ingestion replica: the SDK's whole
    flow, a job of documents, and a 4xx raised there arriving as the same 4xx here."""
    import io

    from openai import NotFoundError, OpenAI

    sdk = OpenAI(base_url=str(client.base_url).rstrip("/") + "/v1", api_key="unused", max_retries=0)
    store = sdk.vector_stores.create(name="ray")
    done = sdk.vector_stores.files.upload_and_poll(
        vector_store_id=store.id,
        file=("shipping.md", io.BytesIO(b"# Shipping\n\nOrders ship from the Rotterdam warehouse.\n")),
        attributes={"team": "logistics"},
    )
    assert done.status == "completed", done
    hits = sdk.vector_stores.search(
        store.id, query="where do orders ship from", filters={"type": "eq", "key": "team", "value": "logistics"}
    )
    assert hits.data and hits.data[0].filename == "shipping.md"
    with pytest.raises(NotFoundError):
        sdk.vector_stores.retrieve("vs_missing")
    r = client.post("/jobs", json={"index_name": "jobs-ray", "documents": [{"text": f"doc {i}"} for i in range(5)]})
    assert r.status_code == 202, r.text
    job = r.json()
    for _ in range(600):
        job = client.get(f"/jobs/{job['id']}").json()
        if job["finished_at"] is not None:
            break
        time.sleep(0.1)
    assert job["status"] == "completed" and job["documents"]["indexed"] == 5, job


def test_several_indexes_and_the_mcp_tools_through_serve(client: httpx.Client) -> None:
    """On Ray: a query over two indexes fuses the shard actors' answers for each, and /mcp (stateless
    streamable HTTP in the Ingress replica, behind Serve's proxy) answers the official client."""
    import asyncio

    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.types import CallToolResult

    doc = {"doc_id": "ship", "text": "Orders ship from the Rotterdam warehouse within two days."}
    assert client.post("/index", json={"index_name": "logistics", "documents": [doc]}).status_code == 200
    r = client.post(
        "/retrieve",
        json={"index_name": ["kb", "logistics"], "query": "warranty years and where orders ship from", "top_k": 3},
    )
    assert r.status_code == 200, r.text
    assert {n["index_name"] for n in r.json()["results"]} == {"kb", "logistics"}
    missing = client.post("/retrieve", json={"index_name": ["kb", "nowhere"], "query": "warranty"})
    assert missing.status_code == 404 and "'nowhere'" in missing.text

    async def tools() -> list[CallToolResult]:
        async with (
            httpx2.AsyncClient(timeout=60) as http,
            Client(streamable_http_client(f"{str(client.base_url).rstrip('/')}/mcp", http_client=http)) as mcp,
        ):
            return [
                await mcp.call_tool("list_indexes", {}),
                await mcp.call_tool("search", {"query": "where do orders ship from", "index_names": ["logistics"]}),
                await mcp.call_tool("fetch_document", {"index_name": "logistics", "doc_id": "ship"}),
            ]

    listed, found, fetched = asyncio.run(tools())
    assert {"kb", "logistics"} <= set(listed.structured_content["indexes"])
    assert found.structured_content["results"][0]["doc_id"] == "ship"
    assert "Rotterdam" in fetched.structured_content["text"]
