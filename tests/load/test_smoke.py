"""Seconds-long smoke runs of the Locust file and of every benchmark, so none of them can rot.

They check plumbing (the scripts run, talk to a real server and print their tables), never speed.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn

from benchmarks.common import free_port
from ragserve.testing.fake_openai import FakeOpenAI
from ragserve.testing.inprocess import inprocess_app

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory, embedding_model) -> Iterator[str]:
    """The in-process application (real shards and embedder, fake upstream LLM) on a real socket."""
    from ragserve.testing.embedder import InProcessEmbedder

    embedder = InProcessEmbedder(embedding_model)
    with (
        FakeOpenAI(answer="Line 3's pump was serviced in week 22 [1].", model="fake-model", max_model_len=4096) as fake,
        inprocess_app(tmp_path_factory.mktemp("locust"), embedder, fake.url, similarity_threshold=0.0) as (app, _),
    ):
        port = free_port()
        srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        thread = threading.Thread(target=srv.run, daemon=True)
        thread.start()
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{base}/health").status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        yield base
        srv.should_exit = True
        thread.join(timeout=10)


@pytest.mark.parametrize("shape", ["none", "step"])
def test_locustfile_runs_headless_with_every_user_and_writes_reports(server: str, tmp_path: Path, shape: str) -> None:
    prefix = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "locust",
        "-f",
        str(REPO / "load_tests" / "locustfile.py"),
        "--host",
        server,
        "--headless",
        "--csv",
        str(prefix),
        "--html",
        str(tmp_path / "report.html"),
        "--only-summary",
        "--max-tokens",
        "16",
        "--exit-code-on-error",
        "1",
    ]
    cmd += (
        ["-u", "5", "-r", "5", "-t", "8s"]
        if shape == "none"
        else ["--peak-users", "10", "--step-users", "5", "--step-s", "3"]
    )
    env = {**os.environ, "RAGSERVE_SHAPE": shape}
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with open(f"{prefix}_stats.csv") as f:
        rows = {r["Name"]: r for r in csv.DictReader(f)}
    for name in ("chat rag", "chat rag stream", "chat passthrough", "index", "retrieve", "ttft_ms"):
        assert name in rows, sorted(rows)
        assert int(rows[name]["Request Count"]) > 0 and int(rows[name]["Failure Count"]) == 0, rows[name]
    assert "99.9%" in rows["ttft_ms"] and float(rows["ttft_ms"]["50%"]) > 0
    assert (tmp_path / "report.html").stat().st_size > 10_000


@pytest.mark.parametrize(
    "script",
    [
        "bench_index_types",
        "bench_ingest",
        "bench_retrieval",
        "bench_passthrough",
        "bench_shards",
        "bench_memory",
        "bench_jobs",
        "bench_multi_index",
        "bench_tracing",
        "bench_usage",
        "bench_load",
        "bench_answer_cache",
        "bench_batching",
        "bench_faiss_threads",
        "bench_large_document",
        "bench_encode_parts",
        "bench_gc_pause",
        "bench_chat_cpu",
        "bench_detokenize",
    ],
)
def test_benchmark_smoke_prints_its_table(script: str, tmp_path: Path) -> None:
    env = {**os.environ, "RAGSERVE_BENCH_CACHE": str(tmp_path / "cache")}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            f"benchmarks.{script}",
            "--smoke",
            "--json",
            str(tmp_path / "out.json"),
            "--out",
            str(tmp_path / "plot.png"),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    table = [line for line in done.stdout.splitlines() if line.startswith("|")]
    assert len(table) >= 3 and table[1].startswith("|---"), done.stdout[-2000:]
    assert (tmp_path / "out.json").stat().st_size > 0 and (tmp_path / "plot.png").stat().st_size > 1000


def test_peer_benchmark_smoke_against_the_in_process_server(server: str, tmp_path: Path) -> None:
    """bench_peer starts nothing: it measures whatever speaks KAITO's API, here the in-process ragserve."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.bench_peer",
            "--smoke",
            "--base-url",
            server,
            "--label",
            "ragserve",
            "--json",
            str(tmp_path / "out.json"),
            "--out",
            str(tmp_path / "plot.png"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    table = [line for line in done.stdout.splitlines() if line.startswith("|")]
    assert len(table) == 3 and table[2].startswith("| ragserve |") and "n/a" not in table[2], done.stdout[-2000:]
    result = json.loads((tmp_path / "out.json").read_text())["servers"]["ragserve"]
    assert result["listed_total"] == 40 and result["retrieve"]["n"] == 10
    assert (tmp_path / "plot.png").stat().st_size > 1000


def test_doc_quality_smoke_asks_through_the_sdk_and_judges(embedding_model, tmp_path: Path) -> None:
    """benchmarks.doc_quality over two of the set's documents and two questions, against the
    in-process application with the fake upstream: it uploads the files, asks through the openai
    SDK and judges the answer, the sources and the not-covered question."""
    from ragserve.testing.embedder import InProcessEmbedder
    from ragserve.testing.live import serve

    embedder = InProcessEmbedder(embedding_model)
    with (
        FakeOpenAI(answer="waitress-serve listens on port 8080 [1].", model="fake-model", max_model_len=4096) as fake,
        inprocess_app(tmp_path / "storage", embedder, fake.url, similarity_threshold=0.0) as (app, _),
        serve(app) as url,
    ):
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "benchmarks.doc_quality",
                "--smoke",
                "--url",
                url,
                "--json",
                str(tmp_path / "out.json"),
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        asked = [str(r["messages"]) for r in fake.requests]
    table = [line for line in done.stdout.splitlines() if line.startswith("|")]
    assert len(table) >= 7 and table[1].startswith("|---"), done.stdout[-2000:]
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["index"]["files"] == 2 and out["index"]["documents"] == 2 and out["top_k"] is None
    results = {r["id"]: r for r in out["results"]}
    assert set(results) == {"waitress-port", "kubernetes"}
    assert any("waitress-serve listen" in a for a in asked)  # the question reached the model, with its sources
    port = results["waitress-port"]
    assert port["correct"] is True and port["source_top3"] is True and port["error"] is None
    assert port["evidence_has_fact"] in (True, False, None)  # None (n/a) until the server sends evidence
    assert results["kubernetes"]["not_covered"] in (True, False, None)
    assert out["summary"]["correct"] == {"yes": 1, "of": 1} and out["summary"]["p50_s"] > 0


def test_gpu_check_times_a_streamed_rag_chat_and_rebuilds_the_prompt_it_sent(tmp_path: Path, embedding_model) -> None:
    """What `make gpu-check` measures a RAG chat with, against the real application on the CPU (the
    fake upstream in vLLM's place): the client-side timings, the sources the stream carries, and,
    under the check's settings (``RAG_AS_BUILT``), ``build_rag_messages`` of those sources is exactly
    what the model was sent, which is what vLLM alone is given."""
    from benchmarks.gpu_check import RAG_AS_BUILT, chat_body, stream_rag_chat
    from ragserve.api.documents import NodeWithScore
    from ragserve.cli.client import RagClient
    from ragserve.rag.prompt import build_rag_messages
    from ragserve.testing.embedder import InProcessEmbedder
    from ragserve.testing.live import serve

    docs = [f"Pump {i} on line {i % 4} was serviced in week {20 + i}; its seals were replaced." for i in range(12)]
    with (
        FakeOpenAI(answer="Pump 3 was serviced in week 23 [1].", model="fake-model", max_model_len=4096) as fake,
        inprocess_app(tmp_path, InProcessEmbedder(embedding_model), fake.url, **RAG_AS_BUILT) as (app, _),
        serve(app) as base,
        RagClient(url=base, timeout=60) as client,
    ):
        client.request("POST", "/index", json={"index_name": "kb", "documents": [{"text": t} for t in docs]})
        question = "When was pump 3 serviced?"
        gen, sources = stream_rag_chat(client, chat_body(question, 32, index="kb", top_k=3))
        sent = fake.requests[-1]["messages"]
    assert 0 < gen.ttft_s <= gen.last_s and gen.completion_tokens > 0 and gen.prompt_tokens > 0
    assert len(sources) == 3 and all(s["text"] in docs for s in sources)
    assert build_rag_messages([], [], question, [NodeWithScore.model_validate(s) for s in sources]) == sent


def test_gpu_check_parts_runs_the_services_in_process_on_the_cpu(tmp_path: Path) -> None:
    """``gpu_check run --parts`` (the check where vLLM, faiss-gpu and Ray cannot be installed) runs
    end to end here on the CPU (``--device cpu``): ingest through ``DocumentService`` and retrieval
    through the ``Retriever`` in process, each beside its baseline, and its encode agrees with
    sentence-transformers'."""
    env = {**os.environ, "RAGSERVE_BENCH_CACHE": str(tmp_path / "cache")}
    cmd = [sys.executable, "-m", "benchmarks.gpu_check", "run", "--parts", "--device", "cpu"]
    cmd += ["--chunks", "200", "--docs", "24", "--queries", "5", "--json", str(tmp_path / "out.json")]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["mode"] == "parts" and "error" not in out
    assert out["ingest"]["documents"] == 24 and out["ingest"]["served_docs_per_s"] > 0
    assert out["ingest"]["free_embedder_docs_per_s"] > 0 and out["tokenizers_parallelism"] == "false"
    assert out["retrieve"]["faiss"] == "cpu" and out["baselines"]["bare_faiss_cpu_shard_one_thread"]["p50"] > 0
    for mode in ("dense", "hybrid"):
        assert out["retrieve"][mode]["cold"]["p50"] > 0 and out["retrieve"][mode]["warm"]["p50"] > 0
    assert out["baselines"]["min_cosine_vs_sentence_transformers"] > 0.999
    assert "not measured (--parts)" in done.stdout  # the chats, which need vLLM
    assert "ingest, DocumentService in process" in done.stdout
