"""Usage and rate limits on Ray Serve with the Ingress at two replicas: a key's
``requests_per_minute`` is counted once for the server (by the ``Ingestion`` deployment's ledger),
not per replica; usage from both replicas adds up in ``GET /usage``; and it is kept when the
application is deleted and deployed again over the same ``storage_dir``."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from ragserve.testing.fake_openai import FakeOpenAI
from tests.integration.conftest import deploy

pytestmark = pytest.mark.slow

ADMIN = "sk-replicas-admin-0123456789"
LIMITED = "sk-replicas-limited-0123456789"
RPM = 6
NAME = "usage2"


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(answer="An answer.", model="upstream-model", max_model_len=2048) as fake:
        yield fake


def settings_args(storage: Path, upstream: FakeOpenAI) -> dict[str, Any]:
    return {
        "storage_dir": str(storage),
        "num_shards": 1,
        "llm_engine": "openai",
        "llm_url": upstream.url,
        "shard_num_cpus": 0.1,
        "api_keys": [
            {"key": ADMIN, "name": "ops", "role": "admin"},
            {"key": LIMITED, "name": "limited", "role": "read", "requests_per_minute": RPM},
        ],
    }


def deploy_two_ingress_replicas(args: dict[str, Any], port: int) -> str:
    """``build_app``'s graph with the Ingress at two replicas (a config file says it with
    ``deployments: [{name: Ingress, num_replicas: 2}]``)."""

    from ragserve.config import Settings
    from ragserve.deployments.builder import as_deployment
    from ragserve.deployments.embedder import Embedder
    from ragserve.deployments.ingestion import Ingestion
    from ragserve.deployments.ingress import Ingress

    settings = Settings(**args)
    embedder = as_deployment(Embedder).bind(settings)
    ingestion = as_deployment(Ingestion).bind(embedder, settings)
    app = as_deployment(Ingress).options(num_replicas=2).bind(embedder, None, settings, ingestion)
    return deploy({}, NAME, port, application=app)


@pytest.fixture(scope="module")
def storage(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("usage-replicas")


@pytest.fixture(scope="module")
def base(ray_cluster: int, upstream: FakeOpenAI, storage: Path) -> Iterator[str]:
    yield deploy_two_ingress_replicas(settings_args(storage, upstream), ray_cluster)
    from ray import serve

    serve.delete(NAME)


def usage_rows(base: str) -> dict[tuple[str, str], dict[str, Any]]:
    r = httpx.get(f"{base}/usage", headers=bearer(ADMIN), timeout=30)
    assert r.status_code == 200, r.text
    return {(row["key"], row["index"]): row for row in r.json()["data"]}


def wait_for(base: str, row: tuple[str, str], requests: int, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        got = usage_rows(base).get(row)
        if (got is not None and got["requests"] >= requests) or time.monotonic() > deadline:
            assert got is not None
            return got
        time.sleep(0.5)


def ingress_replicas_that_served(base: str, timeout: float = 60) -> set[str]:
    """The Ingress replicas Serve's own request counter names (its metrics are pushed every few seconds)."""
    deadline = time.monotonic() + timeout
    found: set[str] = set()
    while time.monotonic() < deadline:
        text = httpx.get(f"{base}/metrics", headers=bearer(ADMIN), timeout=30).text
        for line in text.splitlines():
            if line.startswith("ray_serve_deployment_request_counter") and 'deployment="Ingress"' in line:
                m = re.search(r'replica="([^"]+)"', line)
                if m and f'application="{NAME}"' in line:
                    found.add(m.group(1))
        if len(found) >= 2:
            break
        time.sleep(1)
    return found


def test_a_rate_limit_is_counted_across_both_replicas(base: str) -> None:
    while time.gmtime().tm_sec > 40:  # one fixed minute window for the whole burst
        time.sleep(1)
    with ThreadPoolExecutor(max_workers=4) as pool:
        responses = list(
            pool.map(lambda _: httpx.get(f"{base}/v1/models", headers=bearer(LIMITED), timeout=30), range(RPM + 6))
        )
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [200] * RPM + [429] * 6, statuses
    refused = next(r for r in responses if r.status_code == 429)
    assert refused.json()["error"]["code"] == "rate_limit_exceeded" and refused.json()["error"]["type"] == "requests"
    assert refused.headers["x-ratelimit-limit-requests"] == str(RPM)
    assert refused.headers["x-ratelimit-remaining-requests"] == "0" and int(refused.headers["retry-after"]) >= 1
    remaining = sorted(int(r.headers["x-ratelimit-remaining-requests"]) for r in responses if r.status_code == 200)
    assert remaining == list(range(RPM))  # each admitted request saw the one shared count
    assert wait_for(base, ("limited", ""), RPM)["requests"] == RPM  # the refused ones are not counted


def test_usage_of_both_replicas_adds_up_and_both_served(base: str) -> None:
    before = usage_rows(base).get(("ops", "")) or {"embedding_tokens": 0, "requests": 0}
    n = 12
    with ThreadPoolExecutor(max_workers=4) as pool:
        responses = list(
            pool.map(
                lambda i: httpx.post(
                    f"{base}/v1/embeddings", json={"input": f"text number {i}"}, headers=bearer(ADMIN), timeout=60
                ),
                range(n),
            )
        )
    assert all(r.status_code == 200 for r in responses)
    tokens = sum(r.json()["usage"]["prompt_tokens"] for r in responses)
    # GET /usage is itself a request of the admin key: wait for the n embeddings' tokens
    deadline = time.monotonic() + 30
    while True:
        row = usage_rows(base)[("ops", "")]
        if row["embedding_tokens"] - before["embedding_tokens"] >= tokens or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert row["embedding_tokens"] - before["embedding_tokens"] == tokens
    assert len(ingress_replicas_that_served(base)) == 2


def test_usage_is_kept_when_the_application_is_deployed_again(
    base: str, ray_cluster: int, upstream: FakeOpenAI, storage: Path
) -> None:
    from ray import serve

    assert httpx.get(f"{base}/v1/models", headers=bearer(ADMIN), timeout=30).status_code == 200
    time.sleep(2)  # a flush (every second) has sent it
    before = usage_rows(base)
    assert before[("limited", "")]["requests"] == RPM
    serve.delete(NAME)
    again = deploy_two_ingress_replicas(settings_args(storage, upstream), ray_cluster)
    after = usage_rows(again)
    assert after[("limited", "")] == before[("limited", "")]
    assert after[("ops", "")]["embedding_tokens"] == before[("ops", "")]["embedding_tokens"]
    assert after[("ops", "")]["requests"] >= before[("ops", "")]["requests"]
