#!/usr/bin/env python3
"""Measure a running ragserve against baselines taken in the same run, and print markdown tables.

    python load_tests/measure_app.py --url http://127.0.0.1:8000 [--texts 512] [--chats 5]

1. Embedding throughput: ``POST /v1/embeddings`` (HTTP → ingress → embedder deployment) vs raw
   ``SentenceTransformer.encode`` of the same texts in this process (the baseline).
2. RAG chat latency split into embed / search / generate, from the ``Server-Timing`` header.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import httpx

from ragserve.http.server_timing import parse_server_timing

WORDS = [
    "retrieval",
    "index",
    "shard",
    "vector",
    "cluster",
    "kubernetes",
    "operator",
    "token",
    "budget",
    "window",
    "context",
    "history",
    "latency",
    "throughput",
    "replica",
    "batch",
    "cache",
    "embedding",
    "model",
    "search",
    "answer",
    "source",
    "document",
    "chunk",
]


def make_texts(n: int, words: int = 40) -> list[str]:
    """Deterministic, realistic-length texts (no randomness: the same run to run)."""
    return [" ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(words)) + f" item {i}." for i in range(n)]


def raw_encode_rate(texts: list[str], batch: int) -> float:
    from ragserve.models.embeddings import LocalEmbeddingModel

    model = LocalEmbeddingModel(None, device="cpu")
    model.encode(texts[:batch], batch_size=batch)  # warm-up
    t0 = time.perf_counter()
    model.encode(texts, batch_size=batch)
    return len(texts) / (time.perf_counter() - t0)


async def served_encode_rate(url: str, texts: list[str], batch: int, concurrency: int) -> float:
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        await client.post("/v1/embeddings", json={"input": texts[:batch]})  # warm-up
        batches = [texts[i : i + batch] for i in range(0, len(texts), batch)]
        sem = asyncio.Semaphore(concurrency)

        async def one(b: list[str]) -> None:
            async with sem:
                r = await client.post("/v1/embeddings", json={"input": b})
                r.raise_for_status()

        t0 = time.perf_counter()
        await asyncio.gather(*(one(b) for b in batches))
        return len(texts) / (time.perf_counter() - t0)


def rag_latency(url: str, chats: int, max_tokens: int) -> list[dict[str, float]]:
    docs = [{"text": t} for t in make_texts(200)] + [
        {
            "text": "The ragserve embedder batches queries with serve.batch and caches query vectors for a day.",
            "metadata": {"topic": "embedder"},
        }
    ]
    rows = []
    with httpx.Client(base_url=url, timeout=600) as client:
        client.post("/index", json={"index_name": "bench", "documents": docs}).raise_for_status()
        for i in range(chats):
            t0 = time.perf_counter()
            r = client.post(
                "/v1/chat/completions",
                json={
                    "index_name": "bench",
                    "max_tokens": max_tokens,
                    "similarity_threshold": 0.3,
                    "messages": [{"role": "user", "content": f"How does the ragserve embedder batch queries? ({i})"}],
                },
            )
            r.raise_for_status()
            timing = parse_server_timing(r.headers.get("server-timing", ""))
            timing["total_client"] = (time.perf_counter() - t0) * 1000
            timing["completion_tokens"] = r.json()["usage"]["completion_tokens"]
            rows.append(timing)
        client.delete("/indexes/bench")
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--texts", type=int, default=512)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--chats", type=int, default=5)
    p.add_argument("--max-tokens", type=int, default=32)
    a = p.parse_args()

    texts = make_texts(a.texts)
    served = asyncio.run(served_encode_rate(a.url, texts, a.batch, a.concurrency))
    raw = raw_encode_rate(texts, a.batch)
    print("| embedding path | texts/s | ratio to raw |\n|---|---:|---:|")
    print(f"| raw SentenceTransformer.encode (in-process, batch {a.batch}) | {raw:.1f} | 1.00 |")
    print(f"| POST /v1/embeddings (batch {a.batch}, {a.concurrency} in flight) | {served:.1f} | {served / raw:.2f} |")

    rows = rag_latency(a.url, a.chats, a.max_tokens)
    print("\n| RAG chat stage | median ms | min ms | max ms |\n|---|---:|---:|---:|")
    for stage in ("embed", "search", "generate", "total_client"):
        vals = [r[stage] for r in rows if stage in r]
        if vals:
            print(f"| {stage} | {statistics.median(vals):.1f} | {min(vals):.1f} | {max(vals):.1f} |")
    toks = statistics.median(r["completion_tokens"] for r in rows)
    print(f"\n(median completion tokens: {toks:.0f}; chats: {len(rows)})")


if __name__ == "__main__":
    main()
