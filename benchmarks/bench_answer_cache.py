#!/usr/bin/env python3
"""What the answer cache does for FAQ-shaped traffic (issue 28): RAG chat with the answer cache off
and on, the same corpus, questions and clients, back to back in one run
(docs/architecture.md §4, "Answer cache").

    python -m benchmarks.bench_answer_cache [--questions 2000] [--requests 600] [--clients 8]
        [--latency-ms 100] [--zipf 1.1] [--json out.json] [--out plot.png] [--smoke]

The server is the in-process application (``ragserve.testing.inprocess``: real shards, MiniLM behind
the ingress's own query embedder and its query-vector cache, production chunking, the OpenAI
engine) driven over ``httpx.ASGITransport`` by ``--clients`` closed-loop clients (each sends its
next request when the last one is answered). The model is the fake upstream, answering every
completion after ``--latency-ms`` (a small model's time to answer; it costs no CPU here, which a
real one on this machine would). The corpus is ``--questions / 4`` documents of four sentences;
each question is made from one sentence and its document's number, so every question has a source
that holds all its terms and is answered by the model (not "not covered"). Requests draw questions
by a Zipf law (rank ``k`` with weight ``k**-s``, ranks shuffled over the questions), the same
sequence in both variants. Cache off sends ``cache: false`` (the request neither reads nor keeps an
answer: the path of a server without the cache); cache on starts empty, so its hit ratio includes
the warm-up. Both run on one application, so nothing but the cache differs.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from benchmarks.common import bar_plot, machine, pct, table, write_json
from ragserve.http.server_timing import parse_server_timing
from ragserve.models.embeddings import LocalEmbeddingModel
from ragserve.service.query_embedding import InProcessQueryEmbedder
from ragserve.testing.embedder import InProcessEmbedder
from ragserve.testing.fake_openai import FakeOpenAI
from ragserve.testing.inprocess import inprocess_app

SENTENCES_PER_DOC = 4
_WHO = ["The pump", "The operator", "A shard", "The ingress", "The scheduler", "The tokenizer", "A replica"]
_DOES = ["restarts", "reports", "indexes", "balances", "throttles", "caches", "retries", "compacts", "validates"]
_WHAT = ["the request queue", "the nightly backup", "the model weights", "the failed batch", "the metadata filter"]
_WHEN = [
    "after a node failure",
    "within {n} seconds",
    "on line {n}",
    "at {n} kPa",
    "every {n} minutes",
    "for tenant {n}",
]


def corpus(questions: int, seed: int = 5) -> tuple[list[dict[str, Any]], list[str]]:
    """Documents of four sentences each and ``questions`` distinct questions, one per sentence:
    "What restarts the nightly backup on line 42 in record 17?" for record 17's sentence "The
    pump restarts the nightly backup on line 42." (every term of the question is in its source)."""
    rng = random.Random(seed)
    docs: list[dict[str, Any]] = []
    asked: list[str] = []
    seen: set[str] = set()
    while len(asked) < questions:
        i = len(docs)
        sentences = []
        for _ in range(SENTENCES_PER_DOC):
            does, what, when = rng.choice(_DOES), rng.choice(_WHAT), rng.choice(_WHEN).format(n=rng.randint(1, 999))
            sentences.append(f"{rng.choice(_WHO)} {does} {what} {when}.")
            question = f"What {does} {what} {when} in record {i}?"
            if question not in seen and len(asked) < questions:
                seen.add(question)
                asked.append(question)
        docs.append({"doc_id": f"record-{i}", "text": f"Record {i}. " + " ".join(sentences)})
    return docs, asked


def zipf_sequence(n_questions: int, n_requests: int, s: float, seed: int = 11) -> list[int]:
    """``n_requests`` question numbers drawn by a Zipf law of exponent ``s`` over ``n_questions``
    (which question is how popular is shuffled, so popular ones are spread over the documents)."""
    rng = np.random.default_rng(seed)
    weights = np.arange(1, n_questions + 1, dtype=np.float64) ** -s
    ranks = rng.choice(n_questions, size=n_requests, p=weights / weights.sum())
    popularity = rng.permutation(n_questions)
    return [int(popularity[r]) for r in ranks]


async def run_phase(
    client: httpx.AsyncClient, questions: list[str], sequence: list[int], clients: int, cache: bool
) -> dict[str, Any]:
    """Closed-loop clients asking ``sequence`` in order; the latency and ``X-RAG-Cache`` of each."""
    todo = iter(sequence)
    latencies: list[float] = []
    outcomes: list[str] = []
    lookups: list[float] = []  # the cache stage of Server-Timing (ms): key, version read, lookup

    async def one_client() -> None:
        for q in todo:  # a shared iterator: each client takes the next question when it is free
            body: dict[str, Any] = {
                "index_name": "kb",
                "messages": [{"role": "user", "content": questions[q]}],
                "max_tokens": 32,
            }
            if not cache:
                body["cache"] = False
            t0 = time.perf_counter()
            r = await client.post("/v1/chat/completions", json=body)
            latencies.append(time.perf_counter() - t0)
            if r.status_code != 200 or r.headers.get("x-rag-mode") != "rag":
                raise RuntimeError(f"{r.status_code} {r.headers.get('x-rag-mode')}: {r.text[:300]}")
            outcomes.append(r.headers.get("x-rag-cache", "none"))
            lookups.append(parse_server_timing(r.headers.get("server-timing", "")).get("cache", float("nan")))

    t0 = time.perf_counter()
    await asyncio.gather(*(one_client() for _ in range(clients)))
    wall = time.perf_counter() - t0
    return {"latencies": latencies, "outcomes": outcomes, "lookups": lookups, "wall_s": wall}


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    docs, questions = corpus(args.questions)
    sequence = zipf_sequence(len(questions), args.requests, args.zipf)
    warm = zipf_sequence(len(questions), max(4, args.clients), args.zipf, seed=3)
    model = LocalEmbeddingModel(None, device="cpu")
    # the ingress's query embedder (MiniLM in this process, its query-vector cache): what a deployed
    # replica asks; documents go through the plain in-process embedder
    embedder = InProcessQueryEmbedder(model, InProcessEmbedder(model))
    results: dict[str, Any] = {}
    with (
        FakeOpenAI(answer="It is in the sources [1].", model="fake-model", max_model_len=8192) as fake,
        tempfile.TemporaryDirectory(prefix="bench-answer-cache-") as tmp,
        inprocess_app(Path(tmp), embedder, fake.url, num_shards=args.shards, chunk_size=256) as (app, _),
    ):
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://bench", timeout=120) as client,
        ):
            t0 = time.perf_counter()
            for i in range(0, len(docs), 64):
                r = await client.post("/index", json={"index_name": "kb", "documents": docs[i : i + 64]})
                r.raise_for_status()
            indexed_s = time.perf_counter() - t0
            await run_phase(client, questions, warm, args.clients, cache=False)  # lazy imports, first calls
            fake.latency_s = args.latency_ms / 1000
            for name, cache in (("cache off", False), ("cache on", True)):
                before = len(fake.requests)
                results[name] = await run_phase(client, questions, sequence, args.clients, cache)
                results[name]["model_calls"] = len(fake.requests) - before
    embedder.close()
    results["indexed_s"] = indexed_s
    results["docs"] = len(docs)
    return results


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--questions", type=int, default=2000, help="distinct questions (documents: a quarter of it)")
    ap.add_argument("--requests", type=int, default=600, help="requests in each variant")
    ap.add_argument("--clients", type=int, default=8, help="concurrent closed-loop clients")
    ap.add_argument("--latency-ms", type=float, default=100.0, help="the fake model's time per completion")
    ap.add_argument("--zipf", type=float, default=1.1, help="the Zipf exponent s of question popularity")
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--out", help="write a bar plot of throughput and latency here (PNG)")
    ap.add_argument("--smoke", action="store_true", help="a few documents and requests: does it run")
    args = ap.parse_args(argv)
    if args.smoke:
        args.questions, args.requests, args.clients, args.latency_ms = 24, 16, 4, 20.0
    results = asyncio.run(measure(args))
    rows: list[list[Any]] = []
    summary: dict[str, Any] = {}
    for name in ("cache off", "cache on"):
        r = results[name]
        ms = [x * 1000 for x in r["latencies"]]
        hits = sum(o == "hit" for o in r["outcomes"])
        row = {
            "requests": len(ms),
            "hit_ratio": hits / len(ms),
            "model_calls": r["model_calls"],
            "req_per_s": len(ms) / r["wall_s"],
            "p50_ms": pct(ms, 50),
            "p99_ms": pct(ms, 99),
        }
        summary[name] = row
        rows.append(
            [
                name,
                row["requests"],
                f"{row['hit_ratio']:.0%}",
                row["model_calls"],
                row["req_per_s"],
                row["p50_ms"],
                row["p99_ms"],
            ]
        )
        if name == "cache on":  # the same requests split by what the cache did
            for outcome, label in (("hit", "hits"), ("miss", "misses")):
                part = [x for x, o in zip(ms, r["outcomes"], strict=True) if o == outcome]
                if part:
                    rows.append([f"  of which {label}", len(part), "", "", "", pct(part, 50), pct(part, 99)])
                    summary[f"cache on, {label}"] = {
                        "requests": len(part),
                        "p50_ms": pct(part, 50),
                        "p99_ms": pct(part, 99),
                    }
    on_run = results["cache on"]
    stage = {
        outcome: [ms for ms, o in zip(on_run["lookups"], on_run["outcomes"], strict=True) if o == outcome]
        for outcome in ("hit", "miss")
    }
    stage = {"hits": stage["hit"], "misses": stage["miss"]}
    summary["cache stage ms"] = {o: {"p50": pct(xs, 50), "p99": pct(xs, 99)} for o, xs in stage.items() if xs}
    off, on = summary["cache off"], summary["cache on"]
    print(
        f"{machine()}; RAG chat, in-process app, {results['docs']} documents ({args.questions} questions) on "
        f"{args.shards} shards (indexed in {results['indexed_s']:.1f} s), MiniLM, fake model answering after "
        f"{args.latency_ms:.0f} ms; {args.clients} closed-loop clients, {args.requests} requests a variant, "
        f"Zipf s={args.zipf}; cache off, then on (starting empty), on one application"
    )
    print(table(["variant", "requests", "hit ratio", "model calls", "req/s", "p50 ms", "p99 ms"], rows))
    print(
        f"cache on vs off: throughput x{on['req_per_s'] / off['req_per_s']:.2f}, "
        f"p50 x{on['p50_ms'] / off['p50_ms']:.2f}, p99 x{on['p99_ms'] / off['p99_ms']:.2f}; the cache stage "
        "(key, version read, lookup) p50/p99: "
        + ", ".join(f"{v['p50']:.1f}/{v['p99']:.1f} ms on {k}" for k, v in summary["cache stage ms"].items())
    )
    bar_plot(
        args.out,
        f"RAG chat, Zipf s={args.zipf} over {args.questions} questions, {args.clients} clients",
        ["req/s", "p50 ms", "p99 ms"],
        {
            name: [summary[name]["req_per_s"], summary[name]["p50_ms"], summary[name]["p99_ms"]]
            for name in ("cache off", "cache on")
        },
        "",
    )
    write_json(
        args.json,
        {
            "machine": machine(),
            "questions": args.questions,
            "documents": results["docs"],
            "requests": args.requests,
            "clients": args.clients,
            "latency_ms": args.latency_ms,
            "zipf": args.zipf,
            "shards": args.shards,
            "variants": summary,
            "ms": {name: [x * 1000 for x in results[name]["latencies"]] for name in ("cache off", "cache on")},
        },
    )


if __name__ == "__main__":
    main()
