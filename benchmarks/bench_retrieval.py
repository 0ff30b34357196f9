#!/usr/bin/env python3
"""Retrieval latency (``POST /retrieve``: embed the query + search every shard + fetch the chunks)
at 10k and 100k chunks, against bare FAISS search over the same vectors in this process and raw
query encoding in this process (the baselines, measured in the same run).

    python -m benchmarks.bench_retrieval [--sizes 10000,100000] [--kinds flat,hnsw]
        [--modes default,high-throughput,default] [--retrieval-modes dense,hybrid] [--query-sentences N] [--smoke]
        [--out docs/img/retrieval.png]

Each Serve mode (``benchmarks.common.MODES``) starts its own Ray and measures its own floor (a
trivial deployment); the default order A-B-A shows drift on a shared machine. Each retrieval mode
(dense, hybrid, lexical) is measured against the same deployment, so hybrid's cost over dense is
read from one run.

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

import httpx
import numpy as np

from benchmarks.common import (
    MODES,
    bar_plot,
    build_storage,
    cached_embeddings,
    deploy_ragserve,
    machine,
    make_queries,
    make_texts,
    parse_mode,
    raw_query_encode,
    ray_serve,
    summary_ms,
    table,
    write_json,
)
from ragserve.testing.fake_openai import FakeOpenAI


def query_http(
    base: str, index: str, queries: list[str], k: int = 5, mode: str | None = None
) -> tuple[list[float], dict[str, list[float]]]:
    # here, not at the top: ragserve.http builds the whole HTTP application, which `gpu_check run
    # --parts` (storage_for, shard_search, bare_faiss on a machine without the full stack) does not need
    from ragserve.http.server_timing import parse_server_timing

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


def bare_faiss(
    vectors: np.ndarray, queries: np.ndarray, k: int = 5, gpu: bool = False, threads: int | None = None
) -> list[float]:
    """Seconds of each query's exact search over ``vectors`` in this process (on GPU 0 with ``gpu``;
    on ``threads`` OpenMP threads, None: FAISS's own count)."""
    import faiss

    from ragserve.store.faiss_index import omp_threads

    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors)
    if gpu:
        resources = faiss.StandardGpuResources()  # kept alive beside the index that uses it
        index = faiss.index_cpu_to_gpu(resources, 0, index)
    out = []
    with omp_threads(threads or faiss.omp_get_max_threads()):
        for q in queries:
            t0 = time.perf_counter()
            index.search(q[None, :], k)
            out.append(time.perf_counter() - t0)
    return out


def storage_for(n: int, shards: int, texts_all: list[str], vectors_all: np.ndarray) -> Path:
    """The storage_dir holding the first ``n`` chunks, built once through the application's own code."""
    storage = Path(f"/tmp/ragserve-bench-retrieval-{n}-{shards}")
    if not (storage / f".built-{n}").exists():
        shutil.rmtree(storage, ignore_errors=True)
        t0 = time.perf_counter()
        build_storage(storage, shards, "bench", texts_all[:n], vectors_all[:n])
        (storage / f".built-{n}").touch()
        print(f"built {n:,} chunks in {time.perf_counter() - t0:.0f} s", flush=True)
    return storage


def shard_search(storage: Path, shards: int, kind: str, queries: np.ndarray, k: int = 5) -> dict[str, float]:
    """p50 ms of one shard's search in this process (``ShardService.search``: vector search, then
    the SQLite fetch of the hits), and of its vector search alone, over shard 0's part."""
    from ragserve.service.shard_service import ShardService

    svc = ShardService(storage, 0, shards, faiss_kind=kind)
    vectors = svc._shard._mirror["bench"]  # the shard's own VectorIndex (a benchmark may look inside)
    total, vector = [], []
    for q in queries:
        t0 = time.perf_counter()
        svc.search("bench", q, k)
        t1 = time.perf_counter()
        vectors.search(q[None, :], k, None)
        total.append(t1 - t0)
        vector.append(time.perf_counter() - t1)
    svc.close()
    v, t = summary_ms(vector)["p50"], summary_ms(total)["p50"]
    return {"total_p50": t, "vector_p50": v, "fetch_p50": max(0.0, t - v)}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="10000,100000")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--kinds", default="flat,hnsw", help="FAISS index kinds to serve the same data with")
    ap.add_argument(
        "--modes",
        default="default,high-throughput,default",
        help=f"MODE[:QUERY_EMBEDDING] in the order run, MODE from {sorted(MODES)} (each starts its Ray)",
    )
    ap.add_argument("--query-embedding", default="auto", choices=["auto", "ingress", "deployment"])
    ap.add_argument(
        "--retrieval-modes",
        default="dense,hybrid",
        help="retrieval modes measured against each deployment (hybrid, dense, lexical)",
    )
    ap.add_argument(
        "--query-sentences",
        type=int,
        default=0,
        help="0: short questions (a few words, the default); N: questions of N sentences in the corpus's own "
        "words (about 8 content words each), the shape of a long natural-language question",
    )
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    sizes = [500] if args.smoke else [int(s) for s in args.sizes.split(",")]
    nq = 20 if args.smoke else args.queries

    from ragserve.models.embeddings import LocalEmbeddingModel

    model = LocalEmbeddingModel(None, device="cpu")
    texts_all = make_texts(max(sizes), sentences=3, seed=7)
    vectors_all = cached_embeddings(texts_all, "retrieval-s7x3")
    cold = make_queries(nq) if not args.query_sentences else make_texts(nq, args.query_sentences, seed=99)
    warm = cold[: max(5, nq // 10)] * 10
    query_vecs = model.encode(cold, batch_size=32)
    kinds = args.kinds.split(",")[:1] if args.smoke else args.kinds.split(",")  # a smoke: one deployment
    modes = ["high-throughput"] if args.smoke else args.modes.split(",")
    retrieval_modes = [m for m in args.retrieval_modes.split(",") if m]
    rows, results = [], []
    with FakeOpenAI(answer="ok", model="fake-model", max_model_len=4096) as fake:
        for run, mode in enumerate(modes, start=1):
            high_throughput, query_embedding = parse_mode(mode, args.query_embedding)
            with ray_serve(high_throughput=high_throughput) as port:
                from ray import serve

                from benchmarks.bench_passthrough import deploy_floor, timed_posts

                floor_p50 = summary_ms(timed_posts(f"{deploy_floor(port)}/v1/chat/completions", nq))["p50"]
                for n, kind in [(n, k) for n in sizes for k in kinds]:
                    storage = storage_for(n, args.shards, texts_all, vectors_all)
                    name = f"r{n}{kind}"
                    base = deploy_ragserve(
                        port,
                        name,
                        {
                            "storage_dir": str(storage),
                            "num_shards": args.shards,
                            "llm_engine": "openai",
                            "llm_url": fake.url,
                            "faiss_index_kind": kind,
                            "query_embedding": query_embedding,
                        },
                    )
                    for retrieval in retrieval_modes:
                        query_http(base, "bench", ["warm-up query"] * 5, mode=retrieval)
                        cold_lat, stages = query_http(base, "bench", cold, mode=retrieval)
                        warm_lat, warm_stages = query_http(base, "bench", warm, mode=retrieval)
                        results.append(
                            {
                                "mode": mode,
                                "run": run,
                                "chunks": n,
                                "kind": kind,
                                "retrieval": retrieval,
                                "cold": summary_ms(cold_lat),
                                "warm": summary_ms(warm_lat),
                                "stages_p50_ms": {k: summary_ms(v)["p50"] for k, v in stages.items()},
                                "warm_stages_p50_ms": {k: summary_ms(v)["p50"] for k, v in warm_stages.items()},
                                "serve_floor_p50": floor_p50,
                            }
                        )
                    serve.delete(name)
            enc = raw_query_encode(model, cold)["best"]  # between the modes, so drift hits it too
            for r in results:
                r.setdefault("raw_encode", enc)
    # The shard's own work, in this process on the same files (Ray is gone): what a search costs
    # before any hop, split into the vector search and the SQLite fetch of the hits' text.
    shard_work = {
        (n, kind): shard_search(storage_for(n, args.shards, texts_all, vectors_all), args.shards, kind, query_vecs)
        for n in sizes
        for kind in kinds
    }
    for r in results:
        r["shard_in_process"] = shard_work[(r["chunks"], r["kind"])]
        r["bare_faiss"] = summary_ms(bare_faiss(vectors_all[: r["chunks"]], query_vecs))
        c, w, st, wst, sw = r["cold"], r["warm"], r["stages_p50_ms"], r["warm_stages_p50_ms"], r["shard_in_process"]
        rows.append(
            [
                f"{r['mode']} ({r['run']})",
                f"{r['chunks']:,}",
                r["kind"],
                r["retrieval"],
                c["p50"],
                c["p99"],
                w["p50"],
                w["p99"],
                st.get("embed", 0),
                st.get("search", 0),
                wst.get("search", 0),
                sw["vector_p50"],
                sw["fetch_p50"],
                r["bare_faiss"]["p50"],
                r["raw_encode"]["p50"],
                r["serve_floor_p50"],
            ]
        )
    shape = f"questions of {args.query_sentences} sentences" if args.query_sentences else "short questions"
    print(f"\n### Retrieval latency, {args.shards} shards, top 5, {shape}, sequential ({machine()})\n")
    print(
        table(
            [
                "mode (run)",
                "chunks",
                "index",
                "retrieval",
                "cold p50 ms",
                "cold p99",
                "warm p50",
                "warm p99",
                "embed p50 cold (server)",
                "search p50 cold (server)",
                "search p50 warm (server)",
                "shard vector search p50 (in-process)",
                "shard SQLite fetch p50 (in-process)",
                "bare flat FAISS p50",
                "raw encode p50",
                "Serve floor p50",
            ],
            rows,
        )
    )
    for r in results:
        if r["chunks"] == max(sizes):
            print(
                f"{r['mode']} ({r['run']}), {r['chunks']:,} chunks, {r['kind']}, {r['retrieval']}: /retrieve p50 "
                f"{r['cold']['p50']:.1f} ms cold, {r['warm']['p50']:.1f} ms warm (goal: p50 <= 15 ms)"
            )
    for mode, run, n, kind in sorted({(r["mode"], r["run"], r["chunks"], r["kind"]) for r in results}):
        by = {
            r["retrieval"]: r for r in results if (r["mode"], r["run"], r["chunks"], r["kind"]) == (mode, run, n, kind)
        }
        if "dense" in by and "hybrid" in by:
            # Warm: the query vectors are cached for every retrieval mode after the first one measured
            # (the same questions), so only warm latencies compare the modes' search work fairly.
            gap = by["hybrid"]["warm"]["p50"] - by["dense"]["warm"]["p50"]
            print(
                f"{mode} ({run}), {n:,} chunks, {kind}: hybrid p50 is {gap:+.1f} ms from dense, warm "
                "(goal: within 3 ms)"
            )
    bar_plot(
        args.out,
        "Retrieval latency p50",
        [f"{r['mode']} ({r['run']})\n{r['chunks']:,} {r['kind']} {r['retrieval']}" for r in results],
        {
            "/retrieve cold": [r["cold"]["p50"] for r in results],
            "/retrieve warm": [r["warm"]["p50"] for r in results],
            "bare flat FAISS": [r["bare_faiss"]["p50"] for r in results],
            "raw encode": [r["raw_encode"]["p50"] for r in results],
        },
        "ms",
    )
    payload = {
        "benchmark": "retrieval",
        "machine": machine(),
        "shards": args.shards,
        "query_sentences": args.query_sentences,
        "results": results,
    }
    write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
