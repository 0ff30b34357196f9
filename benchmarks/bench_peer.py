#!/usr/bin/env python3
"""Side by side with a peer: the same corpus, queries and measurements against any server that
speaks KAITO RAGEngine's HTTP API (``/index``, ``/retrieve``, ``/query``,
``/indexes/{name}/documents``), ragserve included.

    python -m benchmarks.bench_peer --base-url http://127.0.0.1:8000 [--base-url http://kaito:80 ...]
        [--docs 2000] [--queries 200] [--label ragserve --label kaito] [--out plot.png] [--json out.json]

It starts nothing: run each server first (docs/benchmarks.md, "ragserve beside KAITO RAGEngine"),
then give their URLs. Servers are measured one after another in one sitting, each on a fresh
index of the same deterministic corpus (``make_texts``: ~100-word documents), so the rows compare.
Per server: ingestion docs/s (``POST /index``, 64 documents a call, 4 clients); cold ``/retrieve``
p50/p99 (every query different, so no cache helps; sequential); ``/query`` p50 (retrieve + the
server's LLM; sequential); and, where the server has it, RAG chat (``/v1/chat/completions`` with
``index_name``) p50. A route the server lacks (404/405) is reported as n/a, not as an error.
The index is deleted afterwards unless ``--keep``.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from benchmarks.common import bar_plot, machine, make_queries, make_texts, pct, table, write_json

BATCH = 64
CLIENTS = 4
SENTENCES = 8  # ~100 words a document, as in the side-by-side measurement


class Missing(Exception):
    """The server does not have this route."""


def _post(client: httpx.Client, path: str, body: dict[str, Any]) -> httpx.Response:
    r = client.post(path, json=body)
    # a 404 that does not name the index is the route's absence, not a missing index
    if r.status_code == 405 or (r.status_code == 404 and str(body.get("index_name")) not in r.text):
        raise Missing(path)
    r.raise_for_status()
    return r


def ingest(base: str, index: str, texts: list[str], headers: dict[str, str]) -> float:
    """Documents per second over ``POST /index`` (batches of 64, 4 clients)."""
    batches = [texts[i : i + BATCH] for i in range(0, len(texts), BATCH)]
    with httpx.Client(base_url=base, timeout=600, headers=headers) as client:

        def send(batch: list[str]) -> None:
            _post(client, "/index", {"index_name": index, "documents": [{"text": t} for t in batch]})

        t0 = time.perf_counter()
        with ThreadPoolExecutor(CLIENTS) as pool:
            list(pool.map(send, batches))
        return len(texts) / (time.perf_counter() - t0)


def timed(base: str, path: str, bodies: list[dict[str, Any]], headers: dict[str, str]) -> list[float] | None:
    """Seconds per request, sequential; None when the server lacks ``path``."""
    out: list[float] = []
    with httpx.Client(base_url=base, timeout=300, headers=headers) as client:
        try:
            _post(client, path, bodies[0])  # warm-up of the route (not of the queries: they all differ)
            for body in bodies[1:]:
                t0 = time.perf_counter()
                _post(client, path, body)
                out.append(time.perf_counter() - t0)
        except Missing:
            return None
    return out


def measure(base: str, docs: int, queries: int, max_tokens: int, headers: dict[str, str], keep: bool) -> dict[str, Any]:
    index = f"bench-peer-{uuid.uuid4().hex[:8]}"
    texts = make_texts(docs, sentences=SENTENCES)
    # one query set per route, so each route's queries are cold (no query cache on any server helps)
    n_gen = max(2, queries // 4)
    qs, qs_query, qs_chat = make_queries(queries + 1, seed=7), make_queries(n_gen, seed=8), make_queries(n_gen, seed=9)
    result: dict[str, Any] = {"base_url": base, "index": index, "documents": docs}
    result["ingest_docs_per_s"] = ingest(base, index, texts, headers)
    with httpx.Client(base_url=base, timeout=60, headers=headers) as client:
        listed = client.get(f"/indexes/{index}/documents", params={"limit": 1})
        result["listed_total"] = listed.json().get("total_items") if listed.status_code == 200 else None
    retrieve = timed(base, "/retrieve", [{"index_name": index, "query": q, "max_node_count": 5} for q in qs], headers)
    query = timed(
        base,
        "/query",
        [{"index_name": index, "query": q, "top_k": 5, "llm_params": {"max_tokens": max_tokens}} for q in qs_query],
        headers,
    )
    chat = timed(
        base,
        "/v1/chat/completions",
        [
            {"index_name": index, "max_tokens": max_tokens, "messages": [{"role": "user", "content": q}]}
            for q in qs_chat
        ],
        headers,
    )
    for name, xs in (("retrieve", retrieve), ("query", query), ("chat", chat)):
        ms = [x * 1000 for x in xs] if xs else []
        result[name] = (
            {"n": len(ms), "p50": pct(ms, 50), "p99": pct(ms, 99), "mean": statistics.fmean(ms)} if ms else None
        )
    if not keep:
        with httpx.Client(base_url=base, timeout=120, headers=headers) as client:
            client.delete(f"/indexes/{index}")
    return result


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base-url", action="append", required=True, help="a server's base URL (repeat for more)")
    ap.add_argument("--label", action="append", default=[], help="a name for each --base-url, in order")
    ap.add_argument("--docs", type=int, default=2000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--max-tokens", type=int, default=16, help="completion tokens asked of the LLM per /query")
    ap.add_argument("--api-key", default=None, help="sent as a Bearer token")
    ap.add_argument("--keep", action="store_true", help="keep the benchmark's index")
    ap.add_argument("--smoke", action="store_true", help="a few documents and queries (CI)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    docs, queries = (40, 10) if args.smoke else (args.docs, args.queries)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    labels = args.label + [u for u in args.base_url[len(args.label) :]]

    results = {
        label: measure(url.rstrip("/"), docs, queries, args.max_tokens, headers, args.keep)
        for label, url in zip(labels, args.base_url, strict=True)
    }

    def cell(r: dict[str, Any], route: str, key: str) -> Any:
        return r[route][key] if r[route] else "n/a"

    rows = [
        [
            label,
            r["ingest_docs_per_s"],
            cell(r, "retrieve", "p50"),
            cell(r, "retrieve", "p99"),
            cell(r, "query", "p50"),
            cell(r, "chat", "p50"),
        ]
        for label, r in results.items()
    ]
    print(f"\n### Side by side: {docs} documents, {queries} cold queries ({machine()})\n")
    print(
        table(
            ["server", "ingest docs/s", "/retrieve p50 ms", "/retrieve p99 ms", "/query p50 ms", "RAG chat p50 ms"],
            rows,
        )
    )
    bar_plot(
        args.out,
        "Side by side (KAITO RAGEngine API)",
        list(results),
        {
            "/retrieve p50 ms": [r["retrieve"]["p50"] if r["retrieve"] else 0.0 for r in results.values()],
            "/query p50 ms": [r["query"]["p50"] if r["query"] else 0.0 for r in results.values()],
        },
        "ms",
    )
    payload = {"benchmark": "peer", "machine": machine(), "documents": docs, "queries": queries, "servers": results}
    write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
