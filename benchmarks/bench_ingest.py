#!/usr/bin/env python3
"""Ingestion throughput through the HTTP API (``POST /index``: ingress → chunker → embedder
deployment → shard actors, durable on SQLite) against raw encoding of the same chunks with the
same model (``LocalEmbeddingModel.encode``) in this process (the baseline, measured in the same run).

    python -m benchmarks.bench_ingest [--docs 2000] [--embedding-workers auto,1] [--smoke] [--out docs/img/ingest.png]

``--embedding-workers`` deploys one application per value (``embedding_workers``: ``auto`` is the
default, a worker per core) in the same Ray and measures each in every round, after the raw baseline.

The chunks are made by the application's own chunker, so both sides embed exactly the same texts.
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common import (
    bar_plot,
    cpu_delta,
    cpu_snapshot,
    deploy_ragserve,
    machine,
    make_texts,
    ray_serve,
    table,
    write_json,
)
from ragserve.testing.fake_openai import FakeOpenAI


def chunk_texts(texts: list[str], model: Any) -> list[str]:
    from ragserve.ingest import DocumentChunker, hf_token_counter

    chunker = DocumentChunker(hf_token_counter(model.tokenizer), 256, 32)
    out: list[str] = []
    for t in texts:
        out += [c.text for c in chunker.chunk(t, {})]
    return out


def raw_rate(model: Any, chunks: list[str], batch: int) -> float:
    model.encode(chunks[:batch], batch_size=batch)  # warm-up
    t0 = time.perf_counter()
    model.encode(chunks, batch_size=batch)
    return len(chunks) / (time.perf_counter() - t0)


def served_rate(base: str, texts: list[str], per_request: int, concurrency: int, index: str) -> float:
    batches = [texts[i : i + per_request] for i in range(0, len(texts), per_request)]

    def send(batch: list[str]) -> None:
        with httpx.Client(base_url=base, timeout=600) as c:
            r = c.post("/index", json={"index_name": index, "documents": [{"text": t} for t in batch]})
            r.raise_for_status()

    send(["warm-up document for the embedder and the shards."])
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(send, batches))
    return len(texts) / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=2000)
    ap.add_argument("--per-request", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--embedding-workers", default="auto", help="comma-separated: auto or a number, one app each")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    n = 48 if args.smoke else args.docs

    from ragserve.models.embeddings import LocalEmbeddingModel

    model = LocalEmbeddingModel(None, device="cpu")
    texts = make_texts(n, sentences=6, seed=1)
    chunks = chunk_texts(texts, model)
    rows, results = [], []
    variants = args.embedding_workers.split(",")
    with FakeOpenAI(answer="ok", model="fake-model", max_model_len=4096) as fake, ray_serve() as port:
        bases = {}
        for v in variants:
            storage = Path(f"/tmp/ragserve-bench-ingest-{port}-{v}")
            settings = {"storage_dir": str(storage), "num_shards": 2, "llm_engine": "openai", "llm_url": fake.url}
            if v != "auto":
                settings["embedding_workers"] = int(v)
            bases[v] = deploy_ragserve(port, f"ingest-{v}", settings)
        # alternate the measurements so load drift on the machine hits all alike
        cpu: dict[str, float] = {}
        rounds = 1 if args.smoke else 2
        for rnd in range(rounds):
            raw = raw_rate(model, chunks, 32)
            for v, base in bases.items():
                t0, before = time.perf_counter(), cpu_snapshot()
                served_docs = served_rate(base, texts, args.per_request, args.concurrency, f"bench-{rnd}")
                wall = time.perf_counter() - t0
                if v == variants[0]:
                    for role, secs in cpu_delta(before, cpu_snapshot()).items():
                        cpu[role] = cpu.get(role, 0.0) + secs / wall / rounds
                served = served_docs * len(chunks) / len(texts)
                label = f"round {rnd + 1}" + (f", embedding_workers={v}" if len(variants) > 1 else "")
                rows.append([label, len(texts), len(chunks), raw, served, served / raw])
                results.append(
                    {
                        "round": rnd + 1,
                        "embedding_workers": v,
                        "raw_chunks_per_s": raw,
                        "served_chunks_per_s": served,
                        "ratio": served / raw,
                    }
                )
    print(f"\n### Ingestion throughput ({machine()})\n")
    print(table(["run", "documents", "chunks", "raw encode chunks/s", "POST /index chunks/s", "ratio"], rows))
    for v in variants:
        best = max(r["ratio"] for r in results if r["embedding_workers"] == v)
        print(
            f"\nPOST /index (embedding_workers={v}) reaches {best:.2f}x raw encode of the same chunks "
            "in-process (goal: >= 0.9x)"
        )
    print(
        f"\n#### Where the cores went while POST /index ran (embedding_workers={variants[0]}; "
        "CPU seconds per wall second, 2.0 = both cores)\n"
    )
    print(
        table(
            ["process", "cores busy"],
            [[k, v] for k, v in sorted(cpu.items(), key=lambda kv: -kv[1])] + [["total", sum(cpu.values())]],
        )
    )
    bar_plot(
        args.out,
        "Ingestion throughput (chunks/s)",
        [f"round {r['round']} ({r['embedding_workers']})" for r in results],
        {
            "raw encode": [r["raw_chunks_per_s"] for r in results],
            "POST /index": [r["served_chunks_per_s"] for r in results],
        },
        "chunks/s",
    )
    payload = {
        "benchmark": "ingest",
        "machine": machine(),
        "documents": n,
        "chunks": len(chunks),
        "results": results,
        "cores_busy_while_serving": cpu,
    }
    write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
