"""End to end on Ray Serve with the embedded models (MiniLM + Gemma 3 270M), over HTTP.

Asserts on retrieval and plumbing, never on the wording of the small model's answers.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.integration.conftest import MODEL_CACHE, deploy

pytestmark = pytest.mark.slow

DOCS = [
    {
        "text": "KAITO is a Kubernetes operator that automates AI model inference and fine-tuning on GPU nodes.",
        "metadata": {"topic": "kaito", "team": "infra"},
    },
    {
        "text": "Retrieval Augmented Generation grounds a language model's answers in documents found by search.",
        "metadata": {"topic": "rag", "team": "ml"},
    },
    {
        "text": "FAISS is a library for efficient similarity search and clustering of dense vectors.",
        "metadata": {"topic": "faiss", "team": "ml"},
    },
    {
        "text": "To bake sourdough bread, feed the starter, mix flour and water, and let the dough rise overnight.",
        "metadata": {"topic": "bread", "team": "kitchen"},
    },
]


@pytest.fixture(scope="module")
def app_url(ray_cluster: int, tmp_path_factory: pytest.TempPathFactory) -> str:
    storage = tmp_path_factory.mktemp("embedded-storage")
    args = {
        "storage_dir": str(storage),
        "num_shards": 2,
        "model_cache_dir": str(MODEL_CACHE),
        "default_max_tokens": 12,
        "shard_num_cpus": 0.1,
    }
    yield deploy(args, "embedded", ray_cluster)
    from ray import serve

    serve.delete("embedded")


@pytest.fixture(scope="module")
def client(app_url: str) -> httpx.Client:
    with httpx.Client(base_url=app_url, timeout=300) as c:
        yield c


@pytest.fixture(scope="module")
def indexed(client: httpx.Client) -> dict[str, str]:
    r = client.post("/index", json={"index_name": "kb", "documents": DOCS})
    assert r.status_code == 200, r.text
    return {d["metadata"]["topic"]: d["doc_id"] for d in r.json()}


def test_index_list_filter(client: httpx.Client, indexed: dict[str, str]) -> None:
    assert client.get("/indexes").json() == ["kb"]
    page = client.get("/indexes/kb/documents", params={"limit": 2}).json()
    assert page["total_items"] == 4 and page["count"] == 2
    ml = client.get("/indexes/kb/documents", params={"metadata_filter": json.dumps({"team": "ml"})}).json()
    assert {d["metadata"]["topic"] for d in ml["documents"]} == {"rag", "faiss"}
    bad = client.get("/indexes/kb/documents", params={"metadata_filter": "{not json"})
    assert bad.status_code == 400 and "metadata_filter" in bad.json()["detail"]
    assert client.get("/indexes/nope/documents").status_code == 404


def test_update_and_delete(client: httpx.Client, indexed: dict[str, str]) -> None:
    extra = client.post("/index", json={"index_name": "kb", "documents": [{"text": "A temporary note about tea."}]})
    tmp_id = extra.json()[0]["doc_id"]
    r = client.post(
        "/indexes/kb/documents",
        json={
            "documents": [
                {"doc_id": tmp_id, "text": "A temporary note about green tea."},
                {"doc_id": indexed["kaito"], "text": DOCS[0]["text"], "metadata": DOCS[0]["metadata"]},
                {"doc_id": "ghost", "text": "x"},
            ]
        },
    ).json()
    assert [d["doc_id"] for d in r["updated_documents"]] == [tmp_id]
    assert [d["doc_id"] for d in r["unchanged_documents"]] == [indexed["kaito"]]
    assert [d["doc_id"] for d in r["not_found_documents"]] == ["ghost"]
    d = client.post("/indexes/kb/documents/delete", json={"doc_ids": [tmp_id, "ghost"]}).json()
    assert d == {"deleted_doc_ids": [tmp_id], "not_found_doc_ids": ["ghost"]}
    assert client.get("/indexes/kb/documents").json()["total_items"] == 4


def test_retrieve_and_embeddings(client: httpx.Client, indexed: dict[str, str]) -> None:
    r = client.post(
        "/retrieve", json={"index_name": "kb", "query": "Which Kubernetes operator runs AI inference?", "top_k": 2}
    ).json()
    assert r["count"] == 2 and r["results"][0]["doc_id"] == indexed["kaito"]
    assert r["results"][0]["score"] >= r["results"][1]["score"]
    e = client.post("/v1/embeddings", json={"input": ["hello", "world"]}).json()
    assert len(e["data"]) == 2 and len(e["data"][0]["embedding"]) == 384
    assert e["usage"]["prompt_tokens"] > 0


def test_rag_chat_completion(client: httpx.Client, indexed: dict[str, str]) -> None:
    r = client.post(
        "/v1/chat/completions",
        json={
            "index_name": "kb",
            "max_tokens": 8,
            "messages": [
                {"role": "system", "content": "Answer briefly."},
                {"role": "user", "content": "What does the KAITO Kubernetes operator automate?"},
            ],
        },
    )
    assert r.status_code == 200, r.text
    assert r.headers["x-rag-mode"] == "rag"
    body = r.json()
    assert body["source_nodes"][0]["doc_id"] == indexed["kaito"]
    assert all(n["doc_id"] != indexed["bread"] for n in body["source_nodes"])
    assert body["usage"]["completion_tokens"] <= 8
    assert isinstance(body["choices"][0]["message"]["content"], str)
    assert "embed;dur=" in r.headers["server-timing"] and "generate;dur=" in r.headers["server-timing"]


def test_rag_streaming_with_openai_client(app_url: str, indexed: dict[str, str]) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=f"{app_url}/v1", api_key="unused", timeout=300)
    stream = client.chat.completions.create(
        model="gemma",
        messages=[{"role": "user", "content": "Explain what FAISS does with dense vectors."}],
        max_tokens=10,
        stream=True,
        extra_body={"index_name": "kb"},
    )
    chunks, arrivals = [], []
    for chunk in stream:
        chunks.append(chunk)
        arrivals.append(time.perf_counter())
    first = chunks[0].model_extra["source_nodes"]
    assert first[0]["doc_id"] == indexed["faiss"]
    deltas = [c.choices[0].delta.content for c in chunks[1:] if c.choices and c.choices[0].delta.content]
    assert len(deltas) >= 2  # tokens arrive one by one, not as one block
    assert arrivals[-1] - arrivals[1] > 0.01
    assert chunks[-1].choices[0].finish_reason in {"stop", "length"}


def test_passthrough_without_index_on_embedded_engine(client: httpx.Client) -> None:
    r = client.post("/v1/chat/completions", json={"max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]})
    assert r.status_code == 200 and r.headers["x-rag-mode"] == "passthrough"
    assert r.headers["x-rag-reason"] == "no_index"
    tools = client.post(
        "/v1/chat/completions",
        json={
            "index_name": "kb",
            "messages": [{"role": "user", "content": "weather?"}],
            "tools": [{"type": "function", "function": {"name": "get_weather"}}],
        },
    )
    assert tools.status_code == 400 and "not supported" in tools.json()["error"]["message"]


def test_models_and_query(client: httpx.Client, indexed: dict[str, str]) -> None:
    models = client.get("/v1/models").json()
    assert models["data"][0]["max_model_len"] >= 8192
    q = client.post(
        "/query",
        json={
            "index_name": "kb",
            "query": "How do I bake sourdough bread?",
            "top_k": 2,
            "llm_params": {"max_tokens": 6, "temperature": 0},
        },
    ).json()
    assert q["source_nodes"][0]["doc_id"] == indexed["bread"]
    assert q["metadata"][q["source_nodes"][0]["node_id"]]["topic"] == "bread"


def test_persist_delete_load(client: httpx.Client, indexed: dict[str, str]) -> None:
    r = client.post("/persist/kb", params={"path": "backups/kb"})
    assert r.status_code == 200 and "backups/kb" in r.json()["message"]
    assert client.post("/persist/kb", params={"path": "../escape"}).status_code == 400
    assert client.delete("/indexes/kb").json() == {"message": "Successfully deleted index kb."}
    assert client.get("/indexes").json() == []
    assert client.post("/load/kb", params={"path": "backups/kb/kb"}).status_code == 200  # KAITO: <path>/<name>
    assert client.post("/load/kb", params={"path": "backups/kb/kb"}).status_code == 409
    assert client.get("/indexes/kb/documents").json()["total_items"] == 4
    r = client.post("/retrieve", json={"index_name": "kb", "query": "sourdough starter", "top_k": 1}).json()
    assert r["results"][0]["doc_id"] == indexed["bread"]


def test_killed_shard_restarts_with_every_acknowledged_document(client: httpx.Client, indexed: dict[str, str]) -> None:
    import ray

    from ragserve.deployments.vector_index import SHARD_NAMESPACE

    more = [
        {"text": f"Maintenance log entry {i}: replaced filter on pump {i}.", "doc_id": f"log-{i}"} for i in range(40)
    ]
    assert client.post("/index", json={"index_name": "logs", "documents": more}).status_code == 200
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == SHARD_NAMESPACE]
    victim = ray.get_actor(sorted(names)[0], namespace=SHARD_NAMESPACE)
    ray.kill(victim, no_restart=False)
    deadline = time.monotonic() + 60
    total = None
    while time.monotonic() < deadline:
        r = client.get("/indexes/logs/documents", params={"limit": 1})
        if r.status_code == 200:
            total = r.json()["total_items"]
            if total == 40:
                break
        time.sleep(0.5)
    assert total == 40
    for i in (0, 17, 39):
        hit = client.post(
            "/retrieve",
            json={
                "index_name": "logs",
                "query": f"Maintenance log entry {i}: replaced filter on pump {i}.",
                "top_k": 1,
            },
        ).json()
        assert hit["results"][0]["doc_id"] == f"log-{i}"


def _ragserve_samples(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("ray_ragserve_")]


def test_prometheus_metrics_are_exported(client: httpx.Client) -> None:
    """Metrics are exported every few seconds: wait for samples (HELP lines come first)."""
    # query-cache misses are counted where queries are embedded: the ingress (query_embedding
    # ingress, the default for this small model) or the Embedder deployment
    misses = ("ray_ragserve_ingress_query_cache_misses", "ray_ragserve_embedding_cache_misses")

    def ready(samples: list[str]) -> bool:
        return any(
            s.startswith("ray_ragserve_requests") and "chat/completions" in s and 'mode="rag"' in s for s in samples
        ) and any(s.startswith(misses) for s in samples)

    deadline = time.monotonic() + 90
    samples: list[str] = []
    while time.monotonic() < deadline:
        samples = _ragserve_samples(client.get("/metrics").text)
        if ready(samples):
            break
        time.sleep(2)
    assert ready(samples), "\n".join(samples)[:2000]
    assert any(s.startswith("ray_ragserve_stage_latency_ms_bucket") for s in samples)
