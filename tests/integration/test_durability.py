"""Durability on Ray Serve: nothing acknowledged is lost when a shard actor dies during sustained
ingestion, when writers and readers share an index, or when the whole application restarts.

The LLM is a fake upstream (generation is not what is tested); embeddings and shards are real.
``RAGSERVE_DURABILITY_DOCS`` raises the document count for a manual run (CI: 2,000).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from ragserve.testing.fake_openai import FakeOpenAI
from tests.integration.conftest import deploy, free_port

pytestmark = pytest.mark.slow
N_DOCS = int(os.environ.get("RAGSERVE_DURABILITY_DOCS", "2000"))
BATCH = 25
TOPICS = ["pump", "valve", "turbine", "boiler", "compressor", "conveyor", "generator", "chiller"]


def doc(i: int) -> dict:
    topic = TOPICS[i % len(TOPICS)]
    return {
        "doc_id": f"d-{i}",
        "text": f"Maintenance record {i}: the {topic} on line {i % 13} was inspected, "
        f"its seals replaced and its pressure logged at {100 + i % 50} kPa.",
        "metadata": {"topic": topic},
    }


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(answer="ok", model="fake-model", max_model_len=4096) as fake:
        yield fake


@pytest.fixture(scope="module")
def storage(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("durable")


def settings(storage: Path, upstream: FakeOpenAI) -> dict:
    return {
        "storage_dir": str(storage),
        "num_shards": 2,
        "llm_engine": "openai",
        "llm_url": upstream.url,
        "shard_num_cpus": 0.1,
    }


@pytest.fixture(scope="module")
def app_url(ray_cluster: int, storage: Path, upstream: FakeOpenAI) -> str:
    return deploy(settings(storage, upstream), "durable", ray_cluster)


def total(client: httpx.Client, index: str) -> int:
    r = client.get(f"/indexes/{index}/documents", params={"limit": 1})
    assert r.status_code == 200, r.text
    return r.json()["total_items"]


def all_doc_ids(client: httpx.Client, index: str) -> set[str]:
    ids: set[str] = set()
    offset = 0
    while True:
        page = client.get(
            f"/indexes/{index}/documents", params={"limit": 100, "offset": offset, "max_text_length": 1}
        ).json()
        ids |= {d["doc_id"] for d in page["documents"]}
        offset += 100
        if offset >= page["total_items"]:
            return ids


def shard_actors() -> list:
    import ray

    from ragserve.deployments.vector_index import SHARD_NAMESPACE

    names = sorted(
        a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == SHARD_NAMESPACE
    )
    return [ray.get_actor(n, namespace=SHARD_NAMESPACE) for n in names]


def test_shard_killed_during_ingestion_loses_no_acknowledged_document(app_url: str) -> None:
    import ray

    acknowledged: set[str] = set()
    failures: list[str] = []
    killed_at: list[int] = []
    lock = threading.Lock()
    kills = {N_DOCS // 4: 0, N_DOCS * 3 // 5: 1}  # kill shard 0, later shard 1, while writes stream in

    def send(batch: list[dict]) -> None:
        with httpx.Client(base_url=app_url, timeout=120) as c:
            for attempt in range(6):  # a client retries what was not acknowledged; writes are idempotent
                r = c.post("/index", json={"index_name": "kb", "documents": batch})
                if r.status_code == 200:
                    with lock:
                        acknowledged.update(d["doc_id"] for d in r.json())
                    return
                with lock:
                    failures.append(f"{r.status_code}: {r.text[:200]}")
                time.sleep(0.5 * (attempt + 1))

    def killer() -> None:
        for threshold, shard in kills.items():
            while True:
                with lock:
                    if len(acknowledged) >= threshold:
                        break
                time.sleep(0.05)
            ray.kill(shard_actors()[shard], no_restart=False)
            with lock:
                killed_at.append(len(acknowledged))

    batches = [[doc(i) for i in range(s, min(s + BATCH, N_DOCS))] for s in range(0, N_DOCS, BATCH)]
    k = threading.Thread(target=killer, daemon=True)
    k.start()
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(send, batches))
    k.join(timeout=60)
    assert not k.is_alive(), "the shards were not killed: ingestion ended before the thresholds"
    assert len(killed_at) == 2 and all(n < N_DOCS for n in killed_at), f"kills at {killed_at}: not during ingestion"

    with httpx.Client(base_url=app_url, timeout=60) as c:
        present = all_doc_ids(c, "kb")
        print(
            f"\ndurability: {len(acknowledged)} acknowledged, {len(present)} present, "
            f"{len(failures)} failed attempts (retried), shards killed at {killed_at} acknowledged"
        )
        assert len(acknowledged) == N_DOCS
        assert present == acknowledged
        assert total(c, "kb") == N_DOCS
        for i in (0, N_DOCS // 4, N_DOCS - 1):
            hit = c.post("/retrieve", json={"index_name": "kb", "query": doc(i)["text"], "top_k": 1}).json()
            assert hit["results"][0]["doc_id"] == f"d-{i}"


def test_parallel_writers_readers_updaters_and_deleters(app_url: str) -> None:
    seed = [{"doc_id": f"s-{i}", "text": f"Seed note {i} about the {TOPICS[i % 8]} schedule."} for i in range(100)]
    with httpx.Client(base_url=app_url, timeout=120) as c:
        assert c.post("/index", json={"index_name": "shared", "documents": seed}).status_code == 200
    errors: list[str] = []
    stop = threading.Event()

    def check(r: httpx.Response, what: str) -> None:
        if r.status_code != 200:
            errors.append(f"{what}: {r.status_code} {r.text[:200]}")

    def writer(w: int) -> None:
        with httpx.Client(base_url=app_url, timeout=120) as c:
            for b in range(10):
                docs = [
                    {"doc_id": f"w{w}-{b}-{j}", "text": f"Writer {w} batch {b} item {j}: {TOPICS[j % 8]} log."}
                    for j in range(10)
                ]
                check(c.post("/index", json={"index_name": "shared", "documents": docs}), "write")

    def updater() -> None:
        with httpx.Client(base_url=app_url, timeout=120) as c:
            for i in range(0, 50, 5):
                docs = [{"doc_id": f"s-{j}", "text": f"Updated seed note {j}."} for j in range(i, i + 5)]
                check(c.post("/indexes/shared/documents", json={"documents": docs}), "update")

    def deleter() -> None:
        with httpx.Client(base_url=app_url, timeout=120) as c:
            for i in range(50, 100, 10):
                check(
                    c.post("/indexes/shared/documents/delete", json={"doc_ids": [f"s-{j}" for j in range(i, i + 10)]}),
                    "delete",
                )

    def reader() -> None:
        with httpx.Client(base_url=app_url, timeout=120) as c:
            while not stop.is_set():
                check(
                    c.post("/retrieve", json={"index_name": "shared", "query": "pump schedule", "top_k": 5}), "retrieve"
                )
                check(c.get("/indexes/shared/documents", params={"limit": 50, "offset": 20}), "list")

    readers = [threading.Thread(target=reader) for _ in range(2)]
    for t in readers:
        t.start()
    with ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(writer, w) for w in range(4)] + [pool.submit(updater), pool.submit(deleter)]
        for f in futures:
            f.result()
    stop.set()
    for t in readers:
        t.join()
    assert errors == []
    with httpx.Client(base_url=app_url, timeout=60) as c:
        ids = all_doc_ids(c, "shared")
        assert len(ids) == 100 - 50 + 4 * 10 * 10 == total(c, "shared")
        assert not any(f"s-{j}" in ids for j in range(50, 100))
        page = c.get("/indexes/shared/documents", params={"limit": 100, "metadata_filter": "{}"}).json()
        texts = {d["doc_id"]: d["text"] for d in page["documents"]}
        assert all(texts[k].startswith("Updated") for k in texts if k.startswith("s-"))


def test_full_restart_brings_every_index_back_without_load(app_url: str, storage: Path, upstream: FakeOpenAI) -> None:
    import ray
    from ray import serve

    from ragserve.deployments.platform import init_local_ray

    with httpx.Client(base_url=app_url, timeout=60) as c:
        before = {name: total(c, name) for name in c.get("/indexes").json()}
    assert before.get("kb") == N_DOCS and before.get("shared") == 450

    # the whole application goes away: Serve, the detached shard actors, the Ray cluster itself
    serve.shutdown()
    ray.shutdown()
    init_local_ray(num_cpus=4)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    url = deploy(settings(storage, upstream), "durable", port)

    with httpx.Client(base_url=url, timeout=60) as c:
        after = {name: total(c, name) for name in c.get("/indexes").json()}
        print(f"\nfull restart: before {before}, after {after}")
        assert after == before
        hit = c.post("/retrieve", json={"index_name": "kb", "query": doc(7)["text"], "top_k": 1}).json()
        assert hit["results"][0]["doc_id"] == "d-7"
