#!/usr/bin/env python3
"""CPU a request of ragserve's own pipeline, without Ray: what one RAG chat or retrieval costs the
process that serves it, beside a passthrough chat of the same application (its floor here: the
same FastAPI app, middleware and upstream call, no retrieval).

    python -m benchmarks.bench_chat_cpu [--docs 500] [--requests 600] [--rounds 2]
        [--paths chat-warm,chat,chat-cached,retrieve-warm,passthrough] [--json out.json] [--out plot.png] [--smoke]

The server is the in-process application (``ragserve.testing.inprocess``: real shards, MiniLM
behind the ingress's own query embedder with its query-vector cache, production chunking, the
OpenAI engine against the fake upstream, which answers at once in a thread of this process), driven
over ``httpx.ASGITransport`` by one client, one request at a time: each request's CPU (the
process's, every thread: the client and the fake upstream included alike for every path) and its
latency. ``--docs`` synthetic documents (``make_texts``, 8 sentences) on 2 shards; warm paths
repeat 32 questions (the query-vector cache, the search memo and the evidence's memos warm), cold
ones ask each question once. RAG chats send ``cache: false`` (the pipeline, not the answer cache),
except ``chat-cached``: the warm questions with the answer cache on (its hits). Paths alternate
within each of ``--rounds`` rounds, so drift hits them alike. This is where a change to the core is
measured before Serve (``bench_load``) is: no process boundary, no scheduling between replicas
(docs/benchmarks.md, issue 28).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common import bar_plot, machine, make_queries, make_texts, pct, table, write_json
from ragserve.models.embeddings import LocalEmbeddingModel
from ragserve.service.query_embedding import InProcessQueryEmbedder
from ragserve.testing.embedder import InProcessEmbedder
from ragserve.testing.fake_openai import FakeOpenAI
from ragserve.testing.inprocess import inprocess_app

INDEX = "kb"
WARM_QUERIES = 32
PATHS = ("chat-warm", "chat", "chat-cached", "retrieve-warm", "retrieve", "passthrough")


def repeats(path: str) -> bool:
    """Whether ``path`` asks the same ``WARM_QUERIES`` questions again and again."""
    return path.endswith(("-warm", "-cached"))


def request(path: str, query: str) -> tuple[str, dict[str, Any]]:
    """The route and body of one request of ``path``."""
    if path.startswith("retrieve"):
        return "/retrieve", {"index_name": INDEX, "query": query, "max_node_count": 5}
    body: dict[str, Any] = {"max_tokens": 16, "messages": [{"role": "user", "content": query}]}
    if path != "passthrough":
        body.update(index_name=INDEX, cache=path == "chat-cached")
    return "/v1/chat/completions", body


async def run_path(client: httpx.AsyncClient, path: str, queries: list[str]) -> dict[str, Any]:
    """Each query once, one at a time: CPU ms and latency ms a request, and the RAG mode seen."""
    cpu: list[float] = []
    wall: list[float] = []
    for q in queries:
        route, body = request(path, q)
        c0, t0 = time.process_time(), time.perf_counter()
        r = await client.post(route, json=body)
        cpu.append((time.process_time() - c0) * 1e3)
        wall.append((time.perf_counter() - t0) * 1e3)
        if r.status_code != 200:
            raise RuntimeError(f"{path}: {r.status_code} {r.text[:300]}")
        if path.startswith("chat") and r.headers.get("x-rag-mode") != "rag":
            raise RuntimeError(f"{path}: answered as {r.headers.get('x-rag-mode')}, not rag")
        if path == "chat-cached" and len(cpu) > WARM_QUERIES and r.headers.get("x-rag-cache") != "hit":
            raise RuntimeError(f"{path}: the answer cache said {r.headers.get('x-rag-cache')}, not hit")
    return {"cpu_ms": cpu, "wall_ms": wall}


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    paths = [p for p in args.paths.split(",") if p]
    unknown = sorted(set(paths) - set(PATHS))
    if unknown:
        raise SystemExit(f"unknown paths {unknown}; known: {list(PATHS)}")
    texts = make_texts(args.docs, sentences=8)
    cold = iter(make_queries(WARM_QUERIES + args.requests * args.rounds * len(paths) + 64))
    warm = [next(cold) for _ in range(WARM_QUERIES)]
    model = LocalEmbeddingModel(None, device="cpu")
    embedder = InProcessQueryEmbedder(model, InProcessEmbedder(model))
    samples: dict[str, dict[str, list[float]]] = {p: {"cpu_ms": [], "wall_ms": []} for p in paths}
    with (
        FakeOpenAI(answer="The pump is serviced every 30 minutes [1].", model="fake-model", max_model_len=8192) as fake,
        tempfile.TemporaryDirectory(prefix="bench-chat-cpu-") as tmp,
        inprocess_app(Path(tmp), embedder, fake.url, num_shards=2, similarity_threshold=0.0) as (app, _),
    ):
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://bench", timeout=120) as client,
        ):
            for i in range(0, len(texts), 64):
                docs = [{"text": t, "doc_id": f"doc-{i + j}"} for j, t in enumerate(texts[i : i + 64])]
                (await client.post("/index", json={"index_name": INDEX, "documents": docs})).raise_for_status()
            for path in paths:  # warm-up: the model, the memos of the warm questions, the connections
                await run_path(client, path, warm if repeats(path) else [next(cold) for _ in range(4)])
            for _ in range(args.rounds):
                for path in paths:
                    asked = (
                        [warm[i % WARM_QUERIES] for i in range(args.requests)]
                        if repeats(path)
                        else [next(cold) for _ in range(args.requests)]
                    )
                    got = await run_path(client, path, asked)
                    for key in samples[path]:
                        samples[path][key].extend(got[key])
    floor = statistics.mean(samples["passthrough"]["cpu_ms"]) if "passthrough" in samples else None
    result: dict[str, Any] = {}
    for path, s in samples.items():
        mean_cpu = statistics.mean(s["cpu_ms"])
        result[path] = {
            "requests": len(s["cpu_ms"]),
            "cpu_ms_mean": mean_cpu,
            "cpu_ms_p50": pct(s["cpu_ms"], 50),
            "wall_ms_p50": pct(s["wall_ms"], 50),
            "wall_ms_p99": pct(s["wall_ms"], 99),
            "cpu_ms_over_passthrough": None if floor is None else mean_cpu - floor,
        }
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=500)
    ap.add_argument("--requests", type=int, default=600, help="requests of each path in each round")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--paths", default="chat-warm,chat,chat-cached,retrieve-warm,passthrough")
    ap.add_argument("--json", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)
    if args.smoke:
        args.docs, args.requests, args.rounds = 40, 6, 1
    print(f"# bench_chat_cpu on {machine()}", flush=True)
    result = asyncio.run(measure(args))
    rows = [
        [
            path,
            r["requests"],
            r["cpu_ms_mean"],
            r["cpu_ms_p50"],
            "" if r["cpu_ms_over_passthrough"] is None else r["cpu_ms_over_passthrough"],
            r["wall_ms_p50"],
            r["wall_ms_p99"],
        ]
        for path, r in result.items()
    ]
    print()
    print(
        table(
            ["path", "requests", "CPU ms mean", "CPU ms p50", "CPU ms over passthrough", "p50 ms", "p99 ms"],
            rows,
        )
    )
    bar_plot(
        args.out,
        "CPU a request, one process, one at a time",
        list(result),
        {"CPU ms mean": [r["cpu_ms_mean"] for r in result.values()]},
        "ms of CPU",
    )
    write_json(args.json, {"machine": machine(), "args": vars(args), "paths": result})
    return result


if __name__ == "__main__":
    main()
