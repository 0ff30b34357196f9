#!/usr/bin/env python3
"""Several indexes in one query, and the MCP round trip: ``/retrieve`` p50 over 1, 4 and 16
indexes (one call, one ranking) beside the same indexes asked one after another (the round trips a
client makes without multi-index queries), and the MCP ``search`` tool's p50 beside ``/retrieve``
of the same indexes, all in one run against one server.

    python -m benchmarks.bench_multi_index [--indexes 16] [--docs-per-index 250] [--queries 40]
        [--shards 2] [--json out.json] [--out plot.png] [--smoke]

The server is the in-process application (``ragserve.testing.serve_process``: real shards,
MiniLM, production chunking) in a process of its own. Each index holds ``--docs-per-index``
synthetic documents (``make_texts``, ~120 words, one chunk each). For every query, in turn: one
``/retrieve`` over the first 1, 4 and 16 indexes; the same indexes asked one at a time (4 and 16
calls); the MCP ``search`` tool over 1 and 16 indexes through one ``mcp`` client session (streamable
HTTP, the official SDK). Interleaving the variants query by query keeps drift on a shared host out
of the comparison. Every call encodes its query again (the in-process app caches no query vectors).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from benchmarks.bench_jobs import start_server, stop_server
from benchmarks.common import bar_plot, machine, make_queries, make_texts, pct, table, write_json

SENTENCES = 12
TOP_K = 5


def load(base: str, indexes: list[str], per_index: int) -> float:
    """Index ``per_index`` documents into each index; the seconds it took."""
    t0 = time.perf_counter()
    with httpx.Client(base_url=base, timeout=600) as http:
        for n, name in enumerate(indexes):
            texts = make_texts(per_index, SENTENCES, seed=n)
            docs = [{"doc_id": f"{name}-{i}", "text": t} for i, t in enumerate(texts)]
            for i in range(0, len(docs), 64):
                http.post("/index", json={"index_name": name, "documents": docs[i : i + 64]}).raise_for_status()
    return time.perf_counter() - t0


async def measure(base: str, indexes: list[str], queries: list[str], sizes: list[int]) -> dict[str, list[float]]:
    """Seconds per call of each variant, query by query."""
    times: dict[str, list[float]] = {}

    async def timed(name: str, call: Callable[..., Awaitable[Any]], *args: Any) -> None:
        t0 = time.perf_counter()
        await call(*args)
        times.setdefault(name, []).append(time.perf_counter() - t0)

    async with (
        httpx.AsyncClient(base_url=base, timeout=120) as http,
        httpx2.AsyncClient(timeout=120) as mcp_http,
        Client(streamable_http_client(f"{base}/mcp", http_client=mcp_http)) as mcp,
    ):

        async def retrieve(names: list[str] | str, q: str) -> None:
            r = await http.post("/retrieve", json={"index_name": names, "query": q, "max_node_count": TOP_K})
            r.raise_for_status()
            if not r.json()["results"]:
                raise RuntimeError(f"no results for {q!r}")

        async def one_by_one(names: list[str], q: str) -> None:
            for name in names:
                await retrieve(name, q)

        async def search(names: list[str], q: str) -> None:
            result = await mcp.call_tool("search", {"query": q, "index_names": names, "top_k": TOP_K})
            if result.is_error or not (result.structured_content or {}).get("results"):
                raise RuntimeError(f"MCP search failed: {result.content}")

        await retrieve(indexes[0], queries[0])  # warm: the first call pays for lazy imports
        await search(indexes[:1], queries[0])
        for q in queries:
            for k in sizes:
                names = indexes[:k]
                await timed(f"retrieve x{k}", retrieve, names, q)
                if k > 1:
                    await timed(f"one by one x{k}", one_by_one, names, q)
            for k in (1, sizes[-1]):
                names = indexes[:k]
                await timed(f"mcp search x{k}", search, names, q)
    return times


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--indexes", type=int, default=16)
    ap.add_argument("--docs-per-index", type=int, default=250)
    ap.add_argument("--queries", type=int, default=40)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--out", help="write a bar plot of the p50s here (PNG)")
    ap.add_argument("--smoke", action="store_true", help="4 tiny indexes, 3 queries: does it run")
    args = ap.parse_args(argv)
    if args.smoke:
        args.indexes, args.docs_per_index, args.queries = 4, 5, 3
    sizes = sorted({1, min(4, args.indexes), args.indexes})
    indexes = [f"kb{n:02d}" for n in range(args.indexes)]
    queries = make_queries(args.queries)
    settings = {"num_shards": args.shards, "chunk_size": 256, "chunk_overlap": 32}
    with tempfile.TemporaryDirectory(prefix="bench-multi-") as tmp:
        proc, base = start_server(Path(tmp), settings)
        try:
            loaded = load(base, indexes, args.docs_per_index)
            times = asyncio.run(measure(base, indexes, queries, sizes))
        finally:
            stop_server(proc)
    base_p50 = pct(times["retrieve x1"], 50) * 1000
    rows: list[list[Any]] = []
    for name, xs in times.items():
        ms = [x * 1000 for x in xs]
        rows.append([name, len(ms), pct(ms, 50), pct(ms, 95), pct(ms, 50) / base_p50])
    print(
        f"{machine()}; {args.indexes} indexes x {args.docs_per_index} documents on {args.shards} shards "
        f"(loaded in {loaded:.0f} s); {args.queries} queries, top {TOP_K}, hybrid"
    )
    print(table(["variant", "calls", "p50 ms", "p95 ms", "p50 / retrieve x1"], rows))
    bar_plot(
        args.out,
        f"/retrieve and MCP search over several indexes ({args.docs_per_index} documents each, {args.shards} shards)",
        [r[0] for r in rows],
        {"p50": [r[2] for r in rows], "p95": [r[3] for r in rows]},
        "ms",
    )
    write_json(
        args.json,
        {
            "indexes": args.indexes,
            "docs_per_index": args.docs_per_index,
            "shards": args.shards,
            "queries": args.queries,
            "ms": {k: [x * 1000 for x in v] for k, v in times.items()},
        },
    )


if __name__ == "__main__":
    main()
