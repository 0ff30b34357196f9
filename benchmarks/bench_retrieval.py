#!/usr/bin/env python3
"""Retrieval latency (``POST /retrieve``: embed the query + search every shard + fetch the chunks)
at 10k and 100k chunks, against bare FAISS search over the same vectors in this process and raw
query encoding in this process (the baselines, measured in the same run).

    python -m benchmarks.bench_retrieval [--sizes 10000,100000] [--modes dense,hybrid] [--smoke]
                                         [--out docs/img/retrieval.png]

The chunks are deterministic sentence-like texts, embedded once with MiniLM and cached under
``data/bench-cache`` (the first 100k run spends several minutes there); the storage_dir is written
through the application's own ``DocumentService`` and then served by the real Serve application.
Cold queries are all different (the query-embedding cache misses); warm ones repeat (it hits).
Each retrieval mode is measured against the same deployment in the same run, so hybrid's cost over
dense (the lexical search and the fusion; goal: p50 within 3 ms at 100k chunks) is read off one table.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from app.http.server_timing import parse_server_timing
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
from tests.fakes.fake_openai import FakeOpenAI


def query_http(base: str, index: str, queries: list[str], k: int = 5,
               mode: str | None = None) -> tuple[list[float], dict[str, list[float]]]:
    lat: list[float] = []
    stages: dict[str, list[float]] = {}
    extra = {"retrieval_mode": mode} if mode else {}
    with httpx.Client(base_url=base, timeout=60) as c:
        for q in queries:
            t0 = time.perf_counter()
            r = c.post("/retrieve", json={"index_name": index, "query": q, "max_node_count": k, **extra})
            lat.append(time.perf_counter() - t0)
            r.raise_for_status()
            for name, ms in parse_server_timing(r.headers.get("server-timing", "")).items():
                stages.setdefault(name, []).append(ms / 1000)
    return lat, stages


def bare_faiss(vectors: np.ndarray, queries: np.ndarray, k: int = 5) -> list[float]:
    import faiss

    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors)
    out = []
    for q in queries:
        t0 = time.perf_counter()
        index.search(q[None, :], k)
        out.append(time.perf_counter() - t0)
    return out


def raw_encode(model: Any, queries: list[str]) -> list[float]:
    out = []
    for q in queries:
        t0 = time.perf_counter()
        model.encode([q], batch_size=1)
        out.append(time.perf_counter() - t0)
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="10000,100000")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--kinds", default="flat,hnsw", help="FAISS index kinds to serve the same data with")
    ap.add_argument("--modes", default="dense,hybrid", help="retrieval modes to measure (hybrid, dense, lexical)")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    sizes = [500] if args.smoke else [int(s) for s in args.sizes.split(",")]
    nq = 20 if args.smoke else args.queries

    from app.embeddings import LocalEmbeddingModel

    model = LocalEmbeddingModel(None, device="cpu")
    texts_all = make_texts(max(sizes), sentences=3, seed=7)
    vectors_all = cached_embeddings(texts_all, "retrieval-s7x3")
    cold = make_queries(nq)
    warm = cold[: max(5, nq // 10)] * 10
    query_vecs = model.encode(cold, batch_size=32)
    kinds = args.kinds.split(",")
    modes = [m for m in args.modes.split(",") if m]
    rows, results = [], []
    with FakeOpenAI(answer="ok", model="fake-model", max_model_len=4096) as fake, ray_serve() as port:
        from ray import serve

        from benchmarks.bench_passthrough import deploy_floor, timed_posts

        floor_p50 = summary_ms(timed_posts(f"{deploy_floor(port)}/v1/chat/completions", nq))["p50"]
        for n, kind in [(n, k) for n in sizes for k in kinds]:
            storage = Path(f"/tmp/ragserve-bench-retrieval-{n}-{args.shards}")
            if not (storage / f".built-{n}").exists():
                shutil.rmtree(storage, ignore_errors=True)
                t0 = time.perf_counter()
                build_storage(storage, args.shards, "bench", texts_all[:n], vectors_all[:n])
                (storage / f".built-{n}").touch()
                print(f"built {n:,} chunks in {time.perf_counter() - t0:.0f} s", flush=True)
            base = deploy_ragserve(port, f"r{n}{kind}", {"storage_dir": str(storage), "num_shards": args.shards,
                                                         "llm_engine": "openai", "llm_url": fake.url,
                                                         "faiss_index_kind": kind})
            faiss_lat = bare_faiss(vectors_all[:n], query_vecs)
            enc_lat = raw_encode(model, cold)
            f, e = summary_ms(faiss_lat), summary_ms(enc_lat)
            for mode in modes:
                query_http(base, "bench", ["warm-up query"] * 5, mode=mode)
                cold_lat, stages = query_http(base, "bench", cold, mode=mode)
                warm_lat, warm_stages = query_http(base, "bench", warm, mode=mode)
                c, w = summary_ms(cold_lat), summary_ms(warm_lat)
                st = {k: summary_ms(v)["p50"] for k, v in stages.items()}
                wst = {k: summary_ms(v)["p50"] for k, v in warm_stages.items()}
                rows.append([f"{n:,}", kind, mode, c["p50"], c["p99"], w["p50"], w["p99"], st.get("embed", 0),
                             wst.get("embed", 0), wst.get("search", 0), f["p50"], e["p50"], floor_p50])
                results.append({"chunks": n, "kind": kind, "mode": mode, "cold": c, "warm": w, "stages_p50_ms": st,
                                "warm_stages_p50_ms": wst, "bare_faiss": f, "raw_encode": e,
                                "serve_floor_p50": floor_p50})
            serve.delete(f"r{n}{kind}")
    print(f"\n### Retrieval latency, {args.shards} shards, top 5, sequential ({machine()})\n")
    print(table(["chunks", "index", "mode", "cold p50 ms", "cold p99", "warm p50", "warm p99",
                 "embed p50 cold (server)", "embed p50 warm (server)", "search p50 warm (server)",
                 "bare flat FAISS p50", "raw encode p50", "Serve floor p50"], rows))
    for r in results:
        if r["chunks"] == max(sizes):
            print(f"at {r['chunks']:,} chunks, {r['kind']}, {r['mode']}: /retrieve p50 {r['cold']['p50']:.1f} ms cold, "
                  f"{r['warm']['p50']:.1f} ms warm (goal: p50 <= 15 ms)")
    for n, kind in [(n, k) for n in sizes for k in kinds]:
        by_mode = {r["mode"]: r for r in results if r["chunks"] == n and r["kind"] == kind}
        if "dense" in by_mode and "hybrid" in by_mode:
            gap = by_mode["hybrid"]["warm"]["p50"] - by_mode["dense"]["warm"]["p50"]
            print(f"at {n:,} chunks, {kind}: hybrid p50 is {gap:+.1f} ms from dense, warm (goal: within 3 ms)")
    bar_plot(args.out, "Retrieval latency p50", [f"{r['chunks']:,} {r['kind']} {r['mode']}" for r in results],
             {"/retrieve cold": [r["cold"]["p50"] for r in results],
              "/retrieve warm": [r["warm"]["p50"] for r in results],
              "bare flat FAISS": [r["bare_faiss"]["p50"] for r in results],
              "raw encode": [r["raw_encode"]["p50"] for r in results]}, "ms")
    payload = {"benchmark": "retrieval", "machine": machine(), "shards": args.shards, "results": results}
    write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
