#!/usr/bin/env python3
"""How big an embedding part should be on the CPU: ingestion's rate, and how long a small call
waits beside it, with parts bounded by ``EncodeWorkers.PART_TOKENS`` against unbounded parts
(``batch_size`` texts each, as before), alternated in the same run.

    python -m benchmarks.bench_encode_parts [--docs 600] [--rounds 2] [--smoke] [--out plot.png] [--json out.json]

The Embedder deployment's own encoders (``document_workers``: a worker per core, one torch thread
each, MiniLM) are called as a ``POST /index`` calls them under Serve: the chunks of ``--docs``
CISI documents (the application's chunker) in calls of 128 texts, four in flight, as ``bulk`` work.
While that runs, another caller sends a call of two chunks (a small ``/index``) every half second:
its latency is what one request waits behind a large one. The baseline is ``model.encode`` of the
same chunks on one thread in this process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

from benchmarks.bench_ingest import chunk_texts
from benchmarks.common import bar_plot, machine, make_texts, pct, table, write_json
from ragserve.models.embeddings import EncodeWorkers, LocalEmbeddingModel, document_workers

CISI = Path(__file__).resolve().parents[2] / "shared" / "data" / "cisi-beir" / "corpus.jsonl"
CALL, IN_FLIGHT, BATCH = 128, 4, 32
UNBOUNDED = 10**9


def documents(n: int) -> list[str]:
    if CISI.is_file():
        with CISI.open() as f:
            return [json.loads(line)["text"] for line, _ in zip(f, range(n), strict=False)]
    return make_texts(n)


async def ingest(pool: Any, chunks: list[str]) -> float:
    """Chunks a second, in calls of ``CALL`` texts, ``IN_FLIGHT`` at a time, as bulk work."""
    calls = [chunks[i : i + CALL] for i in range(0, len(chunks), CALL)]
    turns = asyncio.Semaphore(IN_FLIGHT)

    async def one(texts: list[str]) -> None:
        async with turns:
            await pool.encode(texts, BATCH, bulk=True)

    t0 = time.perf_counter()
    await asyncio.gather(*(one(c) for c in calls))
    return len(chunks) / (time.perf_counter() - t0)


async def beside(pool: Any, chunks: list[str], small: list[str], lead_s: float) -> tuple[float, list[float]]:
    """The ingestion's rate, and the small call's latencies (ms) while it runs, from ``lead_s`` on."""
    big = asyncio.ensure_future(ingest(pool, chunks))
    waits: list[float] = []
    await asyncio.sleep(lead_s)
    while not big.done():
        t0 = time.perf_counter()
        await pool.encode(small, BATCH, bulk=True)
        waits.append((time.perf_counter() - t0) * 1000)
        await asyncio.sleep(0.5)
    return await big, waits


async def run(args: argparse.Namespace) -> dict[str, Any]:
    model = LocalEmbeddingModel()
    chunks = chunk_texts(documents(args.docs), model)
    pool = document_workers(model)
    try:
        model.encode(chunks[:BATCH], BATCH)  # warm-up
        t0 = time.perf_counter()
        model.encode(chunks, BATCH)
        raw_rate = len(chunks) / (time.perf_counter() - t0)
        results: dict[str, dict[str, list[float]]] = {}
        for _ in range(args.rounds):
            for name, budget in (("unbounded", UNBOUNDED), ("bounded", EncodeWorkers.PART_TOKENS)):
                pool.PART_TOKENS = budget
                rate = await ingest(pool, chunks)
                _, waits = await beside(pool, chunks, chunks[:2], 0.05 if args.smoke else 1.0)
                got = results.setdefault(name, {"rate": [], "waits": []})
                got["rate"].append(rate)
                got["waits"] += waits
    finally:
        pool.close()
    return {"chunks": len(chunks), "raw_rate": raw_rate, "workers": pool.workers, "results": results}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--docs", type=int, default=600)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", default=None, help="a plot of the small call's latency")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.smoke:
        args.docs, args.rounds = 12, 1
    out = asyncio.run(run(args))
    print(
        f"\n### Embedding parts on the CPU: {out['chunks']} chunks, {out['workers']} workers ({machine()})\n"
        f"\nRaw `model.encode` on one thread, same chunks: {out['raw_rate']:.1f} chunks/s.\n"
    )
    rows = []
    for name, got in out["results"].items():
        waits = got["waits"] or [0.0]
        rows.append(
            [
                name,
                " / ".join(f"{r:.1f}" for r in got["rate"]),
                len(got["waits"]),
                pct(waits, 50),
                max(waits),
            ]
        )
    print(table(["parts", "ingest chunks/s (each round)", "small calls", "small p50 ms", "small max ms"], rows))
    names = list(out["results"])
    waits = [out["results"][n]["waits"] or [0.0] for n in names]
    bar_plot(
        args.out,
        "a small call beside an ingestion (ms)",
        names,
        {"p50": [pct(w, 50) for w in waits], "worst": [max(w) for w in waits]},
        "ms",
    )
    write_json(args.json, {"benchmark": "encode_parts", "machine": machine(), **out})
    return out


if __name__ == "__main__":
    main()
