"""End to end on Ray Serve with engine ``openai`` in front of a fake OpenAI-compatible upstream
started by the test: what reaches the upstream is asserted exactly."""

from __future__ import annotations

import json

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
