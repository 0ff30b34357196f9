"""Every response the server sends is a declared model: each operation of the OpenAPI document has a
2xx schema and lists its error responses in the shape of its surface."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from ragserve.testing.fake_openai import FakeOpenAI
from ragserve.testing.inprocess import inprocess_app


@pytest.fixture(scope="module")
def schema(tmp_path_factory, embedding_model) -> dict[str, Any]:
    from ragserve.testing.embedder import InProcessEmbedder

    with (
        FakeOpenAI() as fake,
        inprocess_app(tmp_path_factory.mktemp("schema"), InProcessEmbedder(embedding_model), fake.url) as (app, _),
        TestClient(app) as client,
    ):
        return client.get("/openapi.json").json()


def operations(schema: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(method.upper(), path, op) for path, item in schema["paths"].items() for method, op in item.items()]


def test_every_operation_declares_a_2xx_body(schema: dict[str, Any]) -> None:
    ops = operations(schema)
    assert len(ops) >= 15
    for method, path, op in ops:
        ok = {code: r for code, r in op["responses"].items() if code.startswith("2")}
        assert ok, f"{method} {path} declares no 2xx response"
        for code, response in ok.items():
            content = response.get("content") or {}
            assert content, f"{method} {path} {code} has no body schema"
            for media, body in content.items():
                s = body.get("schema") or {}
                assert s.get("$ref") or s.get("type") or s.get("anyOf"), f"{method} {path} {code} {media}: {s}"


def test_errors_are_declared_in_the_shape_of_each_surface(schema: dict[str, Any]) -> None:
    for method, path, op in operations(schema):
        if path in {"/health", "/metrics"}:
            continue
        expected = "ErrorResponse" if path.startswith("/v1/") else "DetailResponse"
        for code in ("400", "401", "500"):
            ref = op["responses"][code]["content"]["application/json"]["schema"]["$ref"]
            assert ref.endswith("/" + expected), f"{method} {path} {code}: {ref}"


def test_chat_completions_documents_its_stream_and_its_models(schema: dict[str, Any]) -> None:
    op = schema["paths"]["/v1/chat/completions"]["post"]["responses"]["200"]["content"]
    assert op["application/json"]["schema"]["$ref"].endswith("/ChatCompletionResponse")
    assert op["text/event-stream"]["schema"]["$ref"].endswith("/ChatCompletionChunk")
    names = schema["components"]["schemas"]
    assert {
        "ChatCompletionResponse",
        "ChatCompletionChunk",
        "NodeWithScore",
        "ErrorResponse",
        "DetailResponse",
    } <= names.keys()
    chunk = names["ChatCompletionChunk"]["properties"]
    assert chunk["choices"]["items"]["$ref"] in {f"#/components/schemas/{n}" for n in names}
