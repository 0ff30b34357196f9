#!/usr/bin/env python3
"""Search latency and throughput against ``num_shards`` (1 / 2 / 4) over the same chunks, with
bare FAISS search in this process over the same vectors as the baseline (same run).

    python -m benchmarks.bench_shards [--chunks 20000] [--smoke] [--out docs/img/shards.png]

Queries repeat, so the query-embedding cache answers and what changes with the shard count
(scatter, per-shard search, gather and merge) is what is measured. Latency is sequential;
throughput uses ``--concurrency`` clients.
"""

from __future__ import annotations

import argparse
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from benchmarks.bench_retrieval import bare_faiss, query_http
from benchmarks.common import (
    bar_plot,
    build_storage,
    cached_embeddings,
    deploy_ragserve,
    machine,
    make_queries,
    make_texts,
    ray_serve,
    summary_ms,
    table,
    write_json,
)
from ragserve.testing.fake_openai import FakeOpenAI


def throughput(base: str, queries: list[str], concurrency: int, seconds: float) -> float:
    deadline = time.monotonic() + seconds
    done = [0] * concurrency

    def client(i: int) -> None:
        with httpx.Client(base_url=base, timeout=60) as c:
            j = i
            while time.monotonic() < deadline:
                c.post(
                    "/retrieve", json={"index_name": "bench", "query": queries[j % len(queries)], "max_node_count": 5}
                ).raise_for_status()
                done[i] += 1
                j += concurrency

    t0 = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(client, range(concurrency)))
    return sum(done) / (time.monotonic() - t0)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--chunks", type=int, default=20000)
    ap.add_argument("--shards", default="1,2,4")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    n = 400 if args.smoke else args.chunks
    shard_counts = [2] if args.smoke else [int(s) for s in args.shards.split(",")]
    nq, seconds = (10, 2.0) if args.smoke else (args.queries, args.seconds)

    from ragserve.models.embeddings import LocalEmbeddingModel

    texts = make_texts(n, sentences=3, seed=7)
    vectors = cached_embeddings(texts, "retrieval-s7x3")
    queries = make_queries(20)
    query_vecs = LocalEmbeddingModel(None, device="cpu").encode(queries)
    rows: list[list[Any]] = []
    results: list[dict[str, Any]] = []
    with FakeOpenAI(answer="ok", model="fake-model", max_model_len=4096) as fake, ray_serve(num_cpus=6) as port:
        from ray import serve

        for shards in shard_counts:
            storage = Path(f"/tmp/ragserve-bench-shards-{n}-{shards}")
            if not (storage / ".built").exists():
                shutil.rmtree(storage, ignore_errors=True)
                build_storage(storage, shards, "bench", texts, vectors)
                (storage / ".built").touch()
            base = deploy_ragserve(
                port,
                f"s{shards}",
                {"storage_dir": str(storage), "num_shards": shards, "llm_engine": "openai", "llm_url": fake.url},
            )
            query_http(base, "bench", queries)  # fills the query-embedding cache
            lat, stages = query_http(base, "bench", (queries * (nq // len(queries) + 1))[:nq])
            qps = throughput(base, queries, args.concurrency, seconds)
            serve.delete(f"s{shards}")
            s = summary_ms(lat)
            search = summary_ms(stages.get("search", [0.0]))
            rows.append([shards, s["p50"], s["p99"], search["p50"], qps])
            results.append({"shards": shards, "latency": s, "search_stage": search, "qps": qps})
    f = summary_ms(bare_faiss(vectors, query_vecs))
    rows.append(["bare FAISS, in-process", f["p50"], f["p99"], f["p50"], 1000 / f["mean"]])
    print(f"\n### Search vs num_shards, {n:,} chunks, top 5 ({machine()})\n")
    print(
        table(
            ["shards", "/retrieve p50 ms", "p99 ms", "search stage p50 ms", f"queries/s ({args.concurrency} clients)"],
            rows,
        )
    )
    bar_plot(
        args.out,
        f"/retrieve at {n:,} chunks by shard count",
        [str(r["shards"]) for r in results],
        {
            "p50 ms": [r["latency"]["p50"] for r in results],
            "search stage p50 ms": [r["search_stage"]["p50"] for r in results],
        },
        "ms",
    )
    payload = {"benchmark": "shards", "machine": machine(), "chunks": n, "results": results, "bare_faiss": f}
    write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
