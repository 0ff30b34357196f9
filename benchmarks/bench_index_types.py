#!/usr/bin/env python3
"""FAISS index kinds of a shard: recall@10 against exact (flat) search, query latency and build
time, at up to 1M vectors. The baseline is the flat index over the same vectors in the same run.

    python -m benchmarks.bench_index_types [--n 1000000] [--smoke] [--out docs/img/index_types.png]

It builds each kind with the shard's own ``ragserve.store.faiss_index.VectorIndex`` (IVF trained the
way a shard trains it, on a sample). The vectors are synthetic 384-d unit vectors drawn around
cluster centres, like sentence embeddings: embedding a million real texts with MiniLM would take
hours on 2 cores. Queries are held-out points from the same distribution. Synthetic clusters are
kinder to IVF than real text is, so ``--vectors FILE.npy`` runs the same table on real embeddings
(the retrieval benchmark's cached MiniLM vectors, with its questions embedded as queries).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import bar_plot, machine, summary_ms, table, write_json
from ragserve.api.index_spec import IndexSpec
from ragserve.store.faiss_index import VectorIndex

DIM = 384


def clustered(n: int, seed: int, centres: int = 2000, spread: float = 0.6) -> np.ndarray:
    rng = np.random.default_rng(seed)
    c = np.random.default_rng(1).normal(size=(centres, DIM)).astype(np.float32)
    out = np.empty((n, DIM), dtype=np.float32)
    for s in range(0, n, 100_000):  # in slices, to keep the peak memory near the result's size
        m = min(100_000, n - s)
        v = c[rng.integers(0, centres, m)] + spread * rng.standard_normal((m, DIM), dtype=np.float32)
        out[s : s + m] = v / np.linalg.norm(v, axis=1, keepdims=True)
    return out


def build(kind: str, params: dict, vectors: np.ndarray) -> tuple[VectorIndex, float]:
    t0 = time.perf_counter()
    spec = IndexSpec.parse(kind, params)
    vi = VectorIndex(DIM, spec)
    n = len(vectors)
    if vi.wants_training(n):
        rng = np.random.default_rng(5)
        size = min(n, max(spec.training_threshold(), 64 * spec.lists_for(n)))
        vi.train(vectors[rng.choice(n, size, replace=False)], n)
    ids = np.arange(n, dtype=np.int64)
    for s in range(0, n, 100_000):
        vi.add(vectors[s : s + 100_000], ids[s : s + 100_000])
    return vi, time.perf_counter() - t0


def measure(vi: VectorIndex, queries: np.ndarray, truth: np.ndarray | None, k: int = 10) -> dict:
    vi.search(queries[:5], k)  # warm-up
    lat, found = [], []
    for q in queries:
        t0 = time.perf_counter()
        _, ids = vi.search(q[None, :], k)
        lat.append(time.perf_counter() - t0)
        found.append(ids[0])
    found_arr = np.stack(found)
    recall = (
        1.0
        if truth is None
        else float(np.mean([len(set(a) & set(b)) / k for a, b in zip(found_arr, truth, strict=True)]))
    )
    return {**summary_ms(lat), "recall": recall, "ids": found_arr}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--smoke", action="store_true", help="seconds-long run for CI")
    ap.add_argument("--kinds", default="flat,ivf,hnsw")
    ap.add_argument("--out", default=None, help="PNG plot")
    ap.add_argument("--json", default=None)
    ap.add_argument("--nlist", type=int, default=None, help="IVF lists (default 1024; 32 with --smoke)")
    ap.add_argument("--vectors", default=None, help="real embeddings (.npy, unit rows) instead of synthetic ones")
    args = ap.parse_args(argv)
    n, nq = (4000, 20) if args.smoke else (args.n, args.queries)
    source = "synthetic clustered"
    nlist = args.nlist or (32 if args.smoke else 1024)
    configs: list[tuple[str, dict[str, Any], str]] = [("flat", {}, "flat (exact)")]
    if "ivf" in args.kinds:
        configs += [
            ("ivf", {"nlist": nlist, "nprobe": p, "train_min": 1000}, f"ivf nlist={nlist} nprobe={p}") for p in (8, 32)
        ]
    if "hnsw" in args.kinds:
        configs += [
            ("hnsw", {"m": 16, "ef_construction": 40, "ef_search": ef}, f"hnsw M=16 efC=40 ef={ef}") for ef in (32, 128)
        ]
    # what a shard builds when the setting names only the kind
    if "ivf" in args.kinds:
        configs.append(("ivf", {"train_min": 1000}, "ivf defaults (nlist=4·√n, nprobe=nlist/8)"))
    if "hnsw" in args.kinds:
        configs.append(("hnsw", {}, "hnsw defaults (M=32 efC=200 ef=64)"))

    t0 = time.perf_counter()
    if args.vectors:
        from benchmarks.common import make_queries
        from ragserve.models.embeddings import LocalEmbeddingModel

        vectors = np.ascontiguousarray(np.load(args.vectors)[:n], dtype=np.float32)
        n = len(vectors)
        queries = LocalEmbeddingModel(None, device="cpu").encode(make_queries(nq), batch_size=32)
        source = f"real MiniLM embeddings from {Path(args.vectors).name}"
    else:
        vectors = clustered(n, seed=2)
        queries = clustered(nq, seed=3)
    print(
        f"{source}: {n:,} vectors x {DIM} dims ready in {time.perf_counter() - t0:.1f} s; {nq} queries; {machine()}",
        flush=True,
    )

    built: dict[tuple[str, str], tuple[VectorIndex, float]] = {}
    rows, results = [], []
    truth = None
    for kind, params, label in configs:
        build_key = (kind, str({k: v for k, v in params.items() if k not in ("nprobe", "ef_search")}))
        if build_key not in built:
            built[build_key] = build(kind, params, vectors)
            print(f"built {kind} in {built[build_key][1]:.1f} s", flush=True)
        vi, build_s = built[build_key]
        vi.spec = IndexSpec.parse(kind, params)  # search-time parameters only; the build is shared
        m = measure(vi, queries, truth)
        if truth is None:
            truth = m["ids"]
            flat_p50 = m["p50"]
        rows.append([label, f"{m['recall']:.3f}", m["p50"], m["p99"], flat_p50 / m["p50"], build_s])
        results.append(
            {
                "index": label,
                "recall_at_10": m["recall"],
                "p50_ms": m["p50"],
                "p99_ms": m["p99"],
                "speedup_vs_flat": flat_p50 / m["p50"],
                "build_s": build_s,
            }
        )
        print(f"  {label}: recall {m['recall']:.3f}, p50 {m['p50']:.2f} ms", flush=True)

    print(f"\n### Index types at {n:,} vectors (384-d, {source}), 1 query at a time, top 10\n")
    print(table(["index", "recall@10 vs flat", "p50 ms", "p99 ms", "speed-up vs flat p50", "build s"], rows))
    bar_plot(
        args.out,
        f"Query latency p50 at {n:,} vectors (recall@10 in labels)",
        [f"{r['index']}\nR={r['recall_at_10']:.2f}" for r in results],
        {"p50 ms": [r["p50_ms"] for r in results]},
        "ms",
        log=True,
    )
    payload = {
        "benchmark": "index_types",
        "n": n,
        "dim": DIM,
        "vectors": source,
        "machine": machine(),
        "results": results,
    }
    write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
