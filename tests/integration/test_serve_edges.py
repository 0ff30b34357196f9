"""The edges of the HTTP path that Serve's mode could change (issue 13), end to end: which
ingress answers, the processes Ray starts, API keys, request size limits, a client that leaves mid-stream, metrics.

Ray runs in the mode ``make run`` uses (``ragserve.deployments.platform``); with
``RAGSERVE_HIGH_THROUGHPUT=0`` the same tests check Serve's default proxy."""

from __future__ import annotations

import os
import time

import httpx
import pytest

from ragserve.deployments.platform import high_throughput_enabled
from ragserve.testing.fake_openai import FakeOpenAI
from tests.integration.conftest import deploy

pytestmark = pytest.mark.slow
KEY = "edge-test-key"


@pytest.fixture(scope="module")
def upstream():
    with FakeOpenAI(
        answer=" ".join(f"word{i}" for i in range(60)), model="upstream-model", max_model_len=4096, chunk_delay_s=0.05
    ) as fake:
        yield fake


@pytest.fixture(scope="module")
def base(ray_cluster: int, upstream: FakeOpenAI, tmp_path_factory: pytest.TempPathFactory):
    storage = tmp_path_factory.mktemp("edges-storage")
    url = deploy(
        {
            "storage_dir": str(storage),
            "num_shards": 1,
            "llm_engine": "openai",
            "llm_url": upstream.url,
            "shard_num_cpus": 0.1,
            "api_keys": [KEY],
            "max_request_bytes": 4096,
        },
        "edges",
        ray_cluster,
    )
    yield url
    from ray import serve

    serve.delete("edges")


def auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {KEY}"}


def test_the_configured_ingress_answers(base: str) -> None:
    """HAProxy's own stats page is up exactly when the mode is on (the port is the cluster's own)."""
    port = os.environ.get("RAY_SERVE_HAPROXY_STATS_PORT")
    if not high_throughput_enabled():
        assert os.environ["RAY_SERVE_ENABLE_HA_PROXY"] == "0"
        return
    assert port is not None
    assert httpx.get(f"http://127.0.0.1:{port}/stats", timeout=10).status_code == 200


def test_the_local_ray_leaves_out_what_one_machine_does_not_need(ray_cluster: int) -> None:
    """``init_local_ray`` starts no autoscaler monitor (85 MiB, nothing to autoscale on one
    machine), and in the high-throughput mode no log monitor (80 MiB, Serve logs nothing to stderr
    there); the processes Serve relies on run."""
    import ray
    from ray._private import ray_constants

    running = set(ray._private.worker._global_node.all_processes)
    assert ray_constants.PROCESS_TYPE_MONITOR not in running
    assert (ray_constants.PROCESS_TYPE_LOG_MONITOR in running) is not high_throughput_enabled()
    assert {ray_constants.PROCESS_TYPE_RAYLET, ray_constants.PROCESS_TYPE_GCS_SERVER} <= running


def test_api_keys_are_enforced_except_on_health_and_metrics(base: str) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    assert httpx.post(f"{base}/v1/chat/completions", json=body, timeout=30).status_code == 401
    wrong = httpx.post(f"{base}/v1/chat/completions", json=body, headers={"Authorization": "Bearer nope"}, timeout=30)
    assert wrong.status_code == 401
    assert httpx.post(f"{base}/v1/chat/completions", json=body, headers=auth(), timeout=30).status_code == 200
    assert httpx.get(f"{base}/health", timeout=30).status_code == 200
    assert httpx.get(f"{base}/metrics", timeout=30).status_code == 200


def test_request_size_limit_is_a_413(base: str) -> None:
    big = {"index_name": "kb", "documents": [{"text": "x " * 5000}]}
    r = httpx.post(f"{base}/index", json=big, headers=auth(), timeout=30)
    assert r.status_code == 413 and "4096 bytes" in r.json()["detail"], r.text
    chunked = httpx.post(
        f"{base}/index",
        content=iter([b'{"index_name": "kb", "documents": [', b" " * 8000]),
        headers={**auth(), "content-type": "application/json"},
        timeout=30,
    )
    assert chunked.status_code == 413, chunked.text
    chat = httpx.post(
        f"{base}/v1/chat/completions",
        headers=auth(),
        timeout=30,
        json={"messages": [{"role": "user", "content": "y " * 5000}]},
    )
    assert chat.status_code == 413 and chat.json()["error"]["code"] == "request_too_large", chat.text


def test_a_client_that_leaves_mid_stream_stops_the_upstream(base: str, upstream: FakeOpenAI) -> None:
    before = upstream.abandoned_streams
    with (
        httpx.Client(timeout=30) as c,
        c.stream(
            "POST",
            f"{base}/v1/chat/completions",
            headers=auth(),
            json={"stream": True, "messages": [{"role": "user", "content": "talk"}]},
        ) as r,
    ):
        assert r.status_code == 200
        for line in r.iter_lines():
            if '"content": "word' in line or '"content":"word' in line:
                break  # leave after the first words of a 3 s answer
    deadline = time.monotonic() + 20
    while upstream.abandoned_streams == before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert upstream.abandoned_streams == before + 1


def test_streamed_answer_arrives_whole_and_metrics_count_it(base: str) -> None:
    with (
        httpx.Client(timeout=60) as c,
        c.stream(
            "POST",
            f"{base}/v1/chat/completions",
            headers=auth(),
            json={"stream": True, "messages": [{"role": "user", "content": "talk"}]},
        ) as r,
    ):
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]" and len(lines) > 60
    deadline = time.monotonic() + 30  # Serve's metrics are pushed every few seconds
    while time.monotonic() < deadline:
        text = httpx.get(f"{base}/metrics", timeout=30).text
        if "ragserve_requests" in text:
            return
        time.sleep(1)
    pytest.fail("ragserve_requests never appeared in /metrics")


def test_uploads_convert_in_a_process_of_their_own_inside_the_replica(base: str) -> None:
    """The upload route converts in a process from a fork server (``convert_isolated``): it must
    work inside a Serve replica, and a bounded file still be a 4xx there."""
    import io
    import zipfile

    from tests.filemakers import make_docx

    def up(body: bytes, filename: str) -> httpx.Response:
        return httpx.post(
            f"{base}/indexes/files-kb/files", params={"filename": filename}, content=body, headers=auth(), timeout=60
        )

    r = up(make_docx([("Heading1", "Shift plan"), ("", "Night shift starts at ten.")]), "plan.docx")
    assert r.status_code == 200 and r.json()["title"] == "Shift plan", r.text
    assert up(b"# Notes\nValves are checked weekly.", "notes.md").status_code == 200
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("word/document.xml", b"\0" * 2_000_000)  # ~2 KB: fits the 4096-byte body limit
    r = up(buf.getvalue(), "bomb.docx")
    assert r.status_code == 413 and "times its size" in r.json()["detail"], r.text
