"""``GET /metrics`` is open (Prometheus scrapes it without the clients' keys), and index names are
data: without a key that reaches every index, series labelled with an index are summed over it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from ragserve.http.telemetry import without_data_labels
from ragserve.testing.fake_openai import FakeOpenAI
from ragserve.testing.inprocess import inprocess_app

ADMIN, TEAM, READER = "sk-metrics-admin", "sk-metrics-team", "sk-metrics-reader"
SECRET = "secret-merger-plans"
TEAM_NAME = "acquisitions-team"  # an API key's name: usage series carry it


def node_metrics() -> str:
    """Prometheus text as the node's metrics agent writes it: shard gauges by shard and index, and
    series without an index."""
    registry = CollectorRegistry()
    docs = Gauge("ray_ragserve_shard_documents", "Documents per shard, index.", ["shard", "index"], registry=registry)
    chunks = Gauge("ray_ragserve_shard_chunks", "Chunks per shard and index.", ["shard", "index"], registry=registry)
    for shard, index, n in (("0", SECRET, 5), ("0", "team-a-docs", 2), ("1", SECRET, 3), ("1", 'odd"name\\', 1)):
        docs.labels(shard, index).set(n)
        chunks.labels(shard, index).set(10 * n)
    requests = Counter("ray_ragserve_requests", "HTTP requests.", ["route", "status"], registry=registry)
    requests.labels("/indexes/{index_name}/documents", "200").inc(7)
    latency = Histogram("ray_ragserve_stage_latency_ms", "Latency.", ["stage"], buckets=[1, 10], registry=registry)
    latency.labels("embed").observe(4)
    tokens = Counter("ray_ragserve_usage_tokens", "Tokens.", ["key", "index", "kind"], registry=registry)
    tokens.labels(TEAM_NAME, SECRET, "prompt").inc(30)
    tokens.labels(TEAM_NAME, "team-a-docs", "prompt").inc(5)
    tokens.labels("ops", "team-a-docs", "completion").inc(7)
    limited = Counter("ray_ragserve_rate_limited", "429s.", ["key", "limit"], registry=registry)
    limited.labels(TEAM_NAME, "requests").inc(2)
    return generate_latest(registry).decode()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not s.name.endswith("_created")
    }


def test_index_series_are_summed_over_the_index_and_the_rest_is_kept() -> None:
    text = node_metrics()
    out = without_data_labels(text)
    assert SECRET not in out and "team-a-docs" not in out and "odd" not in out and 'index="' not in out
    got = samples(out)
    assert got[("ray_ragserve_shard_documents", (("shard", "0"),))] == 7
    assert got[("ray_ragserve_shard_documents", (("shard", "1"),))] == 4
    assert got[("ray_ragserve_shard_chunks", (("shard", "0"),))] == 70
    unindexed = {k: v for k, v in samples(text).items() if not any(d in k[0] for d in ("shard_", "usage_", "rate_"))}
    assert unindexed and all(got[k] == v for k, v in unindexed.items())  # everything else as it was
    assert "# TYPE ray_ragserve_shard_documents gauge" in out
    assert without_data_labels(out) == out  # nothing left to sum: the text comes back as it is


def test_a_large_scrape_is_filtered_quickly() -> None:
    import time

    registry = CollectorRegistry()
    gauge = Gauge("ray_ragserve_shard_documents", "Documents.", ["shard", "index"], registry=registry)
    for i in range(5000):
        gauge.labels(str(i % 4), f"index-{i}").set(i)
    text = generate_latest(registry).decode()
    t0 = time.thread_time()  # CPU time: the shared machine's load does not count
    out = without_data_labels(text)
    assert time.thread_time() - t0 < 2.0
    assert len(samples(out)) == 4


@pytest.fixture(scope="module")
def client(tmp_path_factory, embedding_model) -> Iterator[TestClient]:
    from ragserve.testing.embedder import InProcessEmbedder

    async def metrics_text() -> str:
        return node_metrics()

    keys = [ADMIN, {"key": TEAM, "indexes": ["team-a*"], "role": "admin"}, {"key": READER, "role": "read"}]
    with (
        FakeOpenAI(answer="ok", model="fake-model", max_model_len=4096) as fake,
        inprocess_app(
            tmp_path_factory.mktemp("metrics"),
            InProcessEmbedder(embedding_model),
            fake.url,
            metrics_text=metrics_text,
            api_keys=keys,
        ) as (app, _),
        TestClient(app) as c,
    ):
        yield c


@pytest.mark.parametrize(
    ("key", "per_index"),
    [(None, False), ("sk-wrong", False), (TEAM, False), (READER, True), (ADMIN, True)],
)
def test_metrics_name_indexes_only_to_a_key_that_reaches_every_index(
    client: TestClient, key: str | None, per_index: bool
) -> None:
    r = client.get("/metrics", headers={"Authorization": f"Bearer {key}"} if key else {})
    assert r.status_code == 200 and "ray_ragserve_shard_documents" in r.text
    assert (SECRET in r.text) is per_index
    assert ('index="team-a-docs"' in r.text) is per_index
    assert 'route="/indexes/{index_name}/documents"' in r.text  # route templates name no index
    # key names (usage series) only to an admin key that reaches every index; summed for the rest
    assert (TEAM_NAME in r.text) is (key == ADMIN)
    got = samples(r.text)
    if key != ADMIN:
        assert 'key="' not in r.text
        assert got[("ray_ragserve_rate_limited_total", (("limit", "requests"),))] == 2
        if not per_index:
            assert got[("ray_ragserve_usage_tokens_total", (("kind", "prompt"),))] == 35
        else:
            assert got[("ray_ragserve_usage_tokens_total", (("index", SECRET), ("kind", "prompt")))] == 30


def test_key_labels_are_summed_like_index_labels() -> None:
    text = node_metrics()
    only_keys = without_data_labels(text, ("key",))
    assert TEAM_NAME not in only_keys and SECRET in only_keys
    got = samples(only_keys)
    assert got[("ray_ragserve_usage_tokens_total", (("index", "team-a-docs"), ("kind", "prompt")))] == 5
    assert got[("ray_ragserve_usage_tokens_total", (("index", "team-a-docs"), ("kind", "completion")))] == 7
    both = samples(without_data_labels(text))
    assert both[("ray_ragserve_usage_tokens_total", (("kind", "prompt"),))] == 35


def test_metrics_of_a_server_without_keys_are_whole(tmp_path, embedder) -> None:
    async def metrics_text() -> str:
        return node_metrics()

    with (
        FakeOpenAI(answer="ok", model="fake-model", max_model_len=4096) as fake,
        inprocess_app(tmp_path, embedder, fake.url, metrics_text=metrics_text) as (app, _),
        TestClient(app) as c,
    ):
        assert SECRET in c.get("/metrics").text  # no keys: everything is open to whoever reaches it


def test_text_the_parser_cannot_read_still_names_no_index() -> None:
    """A line the Prometheus parser rejects (another exporter's dialect) must not turn /metrics into
    a 500, nor let index names through: every line naming an index is left out instead."""
    text = (
        "# TYPE ragserve_x gauge\n"
        'ragserve_x{index="secret",shard="0"} 1\n'
        'ragserve_x{index="other",shard="1"} 2\n'
        "not a metric line {{{\n"
        'ragserve_y{shard="0"} 3\n'
    )
    out = without_data_labels(text)
    assert "secret" not in out and "other" not in out and 'ragserve_y{shard="0"} 3' in out
