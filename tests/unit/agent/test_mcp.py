"""The MCP tools through the official ``mcp`` client against the running application (the
in-process app on a real socket): /mcp over streamable HTTP with API keys and their scopes, and
``ragserve mcp`` on stdio reading that server."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult

from tests.live_server import live_app

ADMIN = "sk-admin-key-0123456789"
PUMPS_ONLY = "sk-reader-of-pumps-only"
KEYS: list[Any] = [ADMIN, {"key": PUMPS_ONLY, "indexes": ["pumps"], "role": "read"}]
DOCS = {
    "pumps": [
        {
            "doc_id": "manuals/zephyr.md",
            "text": "The Zephyr X200 is a submersible water pump for garden ponds. Clean its filter monthly.",
            "metadata": {"path": "manuals/zephyr.md", "title": "Zephyr X200 manual", "lang": "en"},
        }
    ],
    "lamps": [
        {
            "doc_id": "lumen",
            "text": "The Lumen desk lamp charges its battery over USB-C in two hours.",
            "metadata": {"url": "https://example.com/lumen", "title": "Lumen lamp", "lang": "en"},
        }
    ],
}


@pytest.fixture(scope="module")
def server(tmp_path_factory, embedding_model) -> Iterator[str]:
    from ragserve.testing.embedder import InProcessEmbedder

    storage: Path = tmp_path_factory.mktemp("mcp")
    with live_app(storage, InProcessEmbedder(embedding_model), api_keys=KEYS) as (url, _):
        for name, docs in DOCS.items():
            r = httpx.post(
                f"{url}/index",
                json={"index_name": name, "documents": docs},
                headers={"Authorization": f"Bearer {ADMIN}"},
            )
            assert r.status_code == 200, r.text
        yield url


def call(url: str, key: str | None, *calls: tuple[str, dict[str, Any]]) -> list[CallToolResult]:
    """Each tool call's result, through one MCP client session over streamable HTTP."""

    async def run() -> list[CallToolResult]:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=60) as http,
            Client(streamable_http_client(f"{url}/mcp", http_client=http)) as client,
        ):
            return [await client.call_tool(name, args) for name, args in calls]

    return asyncio.run(run())


def text_of(result: CallToolResult) -> str:
    return " ".join(getattr(c, "text", "") for c in result.content)


def test_the_tools_are_listed_with_their_arguments(server: str) -> None:
    async def run() -> dict[str, Any]:
        async with (
            httpx2.AsyncClient(headers={"Authorization": f"Bearer {ADMIN}"}) as http,
            Client(streamable_http_client(f"{server}/mcp", http_client=http)) as client,
        ):
            return {t.name: t for t in (await client.list_tools()).tools}

    tools = asyncio.run(run())
    assert set(tools) == {"list_indexes", "search", "fetch_document"}
    search = tools["search"].input_schema["properties"]
    assert {"query", "index_names", "top_k", "metadata_filter", "mode"} <= search.keys()
    assert tools["search"].input_schema["required"] == ["query"]
    assert {"index_name", "doc_id", "max_chars"} <= tools["fetch_document"].input_schema["properties"].keys()


def test_list_search_and_fetch_give_what_an_agent_cites(server: str) -> None:
    listed, searched, fetched = call(
        server,
        ADMIN,
        ("list_indexes", {}),
        ("search", {"query": "How do I look after the pond pump, and how does the lamp charge?", "top_k": 4}),
        ("fetch_document", {"index_name": "pumps", "doc_id": "manuals/zephyr.md"}),
    )
    assert not listed.is_error and listed.structured_content == {"indexes": ["lamps", "pumps"], "count": 2}
    assert not searched.is_error, text_of(searched)
    results = searched.structured_content["results"]
    assert searched.structured_content["indexes"] == ["lamps", "pumps"]  # every index the key reads
    by_index = {r["index_name"]: r for r in results}
    assert by_index["pumps"]["doc_id"] == "manuals/zephyr.md"
    assert by_index["pumps"]["source"] == "manuals/zephyr.md" and by_index["pumps"]["title"] == "Zephyr X200 manual"
    assert by_index["lamps"]["source"] == "https://example.com/lumen" and "USB-C" in by_index["lamps"]["text"]
    assert all(isinstance(r["score"], float) for r in results)
    assert not fetched.is_error
    assert fetched.structured_content["text"] == DOCS["pumps"][0]["text"]
    assert fetched.structured_content["title"] == "Zephyr X200 manual"


def test_search_takes_named_indexes_a_filter_and_a_mode(server: str) -> None:
    (one,), (filtered,), (lexical,) = (
        call(server, ADMIN, ("search", {"query": "pump", "index_names": ["pumps"]})),
        call(server, ADMIN, ("search", {"query": "charge", "metadata_filter": {"lang": "fr"}})),
        call(server, ADMIN, ("search", {"query": "USB-C", "index_names": ["pumps", "lamps"], "mode": "lexical"})),
    )
    assert {r["index_name"] for r in one.structured_content["results"]} == {"pumps"}
    assert filtered.structured_content["results"] == []
    assert [r["doc_id"] for r in lexical.structured_content["results"]] == ["lumen"]


def test_a_scoped_key_lists_and_searches_only_its_indexes(server: str) -> None:
    listed, everything, forbidden, fetch = call(
        server,
        PUMPS_ONLY,
        ("list_indexes", {}),
        ("search", {"query": "lamp charging"}),
        ("search", {"query": "lamp", "index_names": ["pumps", "lamps"]}),
        ("fetch_document", {"index_name": "lamps", "doc_id": "lumen"}),
    )
    assert listed.structured_content == {"indexes": ["pumps"], "count": 1}
    assert {r["index_name"] for r in everything.structured_content["results"]} == {"pumps"}
    for refused in (forbidden, fetch):
        assert refused.is_error and "'lamps'" in text_of(refused) and "403" in text_of(refused)


def test_bad_arguments_and_missing_things_are_tool_errors_that_say_what_to_fix(server: str) -> None:
    results = call(
        server,
        ADMIN,
        ("search", {"query": ""}),
        ("search", {"query": "pump", "top_k": 0}),
        ("search", {"query": "pump", "mode": "fuzzy"}),
        ("search", {"query": "pump", "index_names": []}),
        ("search", {"query": "pump", "index_names": ["bad name"]}),
        ("search", {"query": "pump", "index_names": ["nowhere"]}),
        ("search", {"query": "pump", "metadata_filter": {"lang": {"$in": ["en"]}}}),
        ("fetch_document", {"index_name": "pumps", "doc_id": "nope"}),
        ("fetch_document", {"index_name": "../etc", "doc_id": "x"}),
        ("no_such_tool", {}),
    )
    says = ["query", "top_k", "mode", "index_names", "invalid index name", "'nowhere'", "metadata_filter", "'nope'"]
    says += ["invalid index name", "no_such_tool"]
    for result, said in zip(results, says, strict=True):
        assert result.is_error, said
        assert said in text_of(result), (said, text_of(result))


def test_mcp_needs_a_key_where_keys_are_configured_and_takes_only_posts(server: str) -> None:
    r = httpx.post(
        f"{server}/mcp",
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        headers={"Accept": "application/json, text/event-stream"},
    )
    assert r.status_code == 401
    auth = {"Authorization": f"Bearer {ADMIN}", "Accept": "application/json, text/event-stream"}
    for method in ("GET", "DELETE"):  # stateless: no stream to open, no session to end
        assert httpx.request(method, f"{server}/mcp", headers=auth, timeout=10).status_code == 405


def test_an_mcp_search_counts_in_the_retrieval_latency_metrics(tmp_path: Path, embedding_model) -> None:
    from ragserve.testing.embedder import InProcessEmbedder
    from ragserve.testing.inprocess import RecordingTelemetry

    tel = RecordingTelemetry()
    with live_app(tmp_path, InProcessEmbedder(embedding_model), telemetry=tel) as (url, _):
        assert httpx.post(f"{url}/index", json={"index_name": "pumps", "documents": DOCS["pumps"]}).status_code == 200
        tel.latencies.clear()
        (found,) = call(url, None, ("search", {"query": "pond pump"}))
    assert not found.is_error and {"embed", "search"} <= tel.latencies.keys()


def test_building_the_tools_leaves_the_processs_logging_alone() -> None:
    from ragserve.agent.server import build_mcp_server

    root = logging.getLogger()
    before = (list(root.handlers), root.level)
    build_mcp_server(lambda _request: None)  # type: ignore[arg-type,return-value]
    assert (list(root.handlers), root.level) == before


def test_a_document_id_of_dots_reaches_the_document_route() -> None:
    from ragserve.cli.client import RagClient

    seen: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.raw_path.decode())
        return httpx.Response(200, json={"doc_id": ".", "text": "t", "hash_value": "h"})

    with RagClient("http://ragserve.test", transport=httpx.MockTransport(answer)) as client:
        client.document("kb", ".")
        client.document("kb", "..")
        client.document("kb", "a/./b")
    assert seen == ["/indexes/kb/documents/%2E", "/indexes/kb/documents/%2E%2E", "/indexes/kb/documents/a%2F.%2Fb"]


def test_ragserve_mcp_serves_the_same_tools_on_stdio(server: str) -> None:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "ragserve.cli.main", "mcp", "--url", server],
        env={"RAGSERVE_API_KEY": PUMPS_ONLY, "PYTHONPATH": os.getcwd()},
    )

    async def run() -> list[CallToolResult]:
        async with Client(params) as client:
            assert {t.name for t in (await client.list_tools()).tools} == {"list_indexes", "search", "fetch_document"}
            return [
                await client.call_tool("list_indexes", {}),
                await client.call_tool("search", {"query": "pond pump filter"}),
                await client.call_tool("fetch_document", {"index_name": "lamps", "doc_id": "lumen"}),
            ]

    listed, searched, refused = asyncio.run(run())
    assert listed.structured_content == {"indexes": ["pumps"], "count": 1}  # the key's scope, through HTTP
    assert searched.structured_content["results"][0]["doc_id"] == "manuals/zephyr.md"
    assert refused.is_error and "'lamps'" in text_of(refused)


def test_an_mcp_search_is_metered_on_its_indexes_with_its_query_tokens(server: str) -> None:
    import time

    def lamps_row() -> dict[str, Any]:
        r = httpx.get(f"{server}/usage", headers={"Authorization": f"Bearer {ADMIN}"})
        assert r.status_code == 200, r.text
        return next((row for row in r.json()["data"] if row["index"] == "lamps"), {"requests": 0})

    before = lamps_row()
    (result,) = call(server, ADMIN, ("search", {"query": "how long does the lamp charge", "index_names": ["lamps"]}))
    assert not result.is_error, text_of(result)
    deadline = time.monotonic() + 5
    while (after := lamps_row())["requests"] == before["requests"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert after["requests"] == before["requests"] + 1
    assert after["embedding_tokens"] > before.get("embedding_tokens", 0)


def test_a_request_id_that_is_not_a_string_or_an_integer_is_refused_not_dropped(server: str) -> None:
    """The SDK read a request whose id was an object, an array, a float, a boolean or null as a
    notification and answered 202 with no body: the client waited for an answer that never came.
    It is a 400, JSON-RPC's Invalid Request, saying what to send; string and integer ids are
    answered, and a notification (no id) is still a 202."""
    headers = {"Authorization": f"Bearer {ADMIN}", "Accept": "application/json, text/event-stream"}
    for rid in ({"a": 1}, [1], 1.5, True, None):
        r = httpx.post(f"{server}/mcp", json={"jsonrpc": "2.0", "id": rid, "method": "tools/list"}, headers=headers)
        assert r.status_code == 400, (rid, r.status_code, r.text)
        error = r.json()["error"]
        assert error["code"] == -32600 and "must be a string or an integer" in error["message"], error
    for rid in ("req-1", 7, 2**70):
        r = httpx.post(f"{server}/mcp", json={"jsonrpc": "2.0", "id": rid, "method": "tools/list"}, headers=headers)
        assert r.status_code == 200 and r.json()["id"] == rid, r.text
        assert any(t["name"] == "search" for t in r.json()["result"]["tools"])
    r = httpx.post(f"{server}/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
    assert r.status_code == 202


def test_a_message_nesting_deep_or_holding_many_values_is_refused_before_the_sdk_parses_it(server: str) -> None:
    headers = {
        "Authorization": f"Bearer {ADMIN}",
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
    }
    call = '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"search","arguments":{"query":%s}}}'
    deep = call % ("[" * 100_000 + "]" * 100_000)
    many = call % ("[" + ",".join(["{}"] * 300_000) + "]")
    for body, says in ((deep, "levels deep"), (many, "JSON values")):
        r = httpx.post(f"{server}/mcp", content=body, headers=headers, timeout=60)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["code"] == -32600 and says in r.json()["error"]["message"], r.text
    # a well-formed call is handed on unchanged (its body read here and given again to the SDK)
    r = httpx.post(f"{server}/mcp", content=call % '"Zephyr filter"', headers=headers, timeout=60)
    assert r.status_code == 200 and "zephyr" in r.text.lower(), r.text


def test_an_mcp_message_is_bounded_in_bytes_and_other_content_types_get_the_sdks_answer(server: str) -> None:
    from ragserve.http.routes.mcp import MAX_MCP_BODY_BYTES

    headers = {
        "Authorization": f"Bearer {ADMIN}",
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
    }
    query = "pump " * (MAX_MCP_BODY_BYTES // 5)
    body = '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"search","arguments":{"query":"%s"}}}'
    r = httpx.post(f"{server}/mcp", content=body % query, headers=headers, timeout=60)
    assert r.status_code == 413 and "at most" in r.json()["error"]["message"], r.text
    # not JSON by its content type: the SDK's own refusal, before what the body holds is looked at
    plain = {**headers, "Content-Type": "text/plain"}
    r = httpx.post(f"{server}/mcp", content='{"jsonrpc":"2.0","id":null,"method":"tools/list"}', headers=plain)
    assert r.status_code == 400 and "Content-Type" in r.text, r.text
