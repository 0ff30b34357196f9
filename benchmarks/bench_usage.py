#!/usr/bin/env python3
"""What usage metering and per-key limits cost a request (issue 27), in-process: the whole ASGI
stack (authentication, metering, counting, the route) over ``httpx.ASGITransport``, for the
cheapest authenticated route (``GET /v1/models``, no model call) so the difference is the
middleware's. Interleaved in rounds, so drift falls on every variant alike:

- ``no keys``: an open server (usage metered as ``anonymous``, never admitted);
- ``key, no limits``: a named key; its usage is buffered in the replica and flushed in the
  background, so it never waits on the ledger's owner;
- ``key with limits``: ``requests_per_minute`` and ``tokens_per_day`` set high enough never to
  refuse: every request waits for one admission (a SQLite transaction on a worker thread, here in
  process; under Ray one call to the Ingestion replica more);
- ``ledger.admit``: the admission's SQLite transaction alone, called directly.

    python -m benchmarks.bench_usage [--requests 400] [--smoke] [--json out.json] [--out usage.png]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common import bar_plot, machine, pct, table, write_json
from ragserve.models.embeddings import LocalEmbeddingModel
from ragserve.service.usage import KeyLimits, UsageLedger
from ragserve.testing.embedder import InProcessEmbedder
from ragserve.testing.fake_openai import FakeOpenAI
from ragserve.testing.inprocess import inprocess_app

FREE, LIMITED = "sk-bench-free-0123456789", "sk-bench-limited-0123456789"
KEYS: list[Any] = [
    {"key": FREE, "name": "free"},
    {"key": LIMITED, "name": "limited", "requests_per_minute": 10**9, "tokens_per_day": 10**12},
]
VARIANTS = ("no keys", "key, no limits", "key with limits")


async def timed_gets(client: httpx.AsyncClient, key: str | None, n: int) -> list[float]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        r = await client.get("/v1/models", headers=headers)
        out.append(time.perf_counter() - t0)
        if r.status_code != 200:
            raise RuntimeError(f"{r.status_code}: {r.text}")
    return out


async def measure(requests: int, rounds: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {v: [] for v in (*VARIANTS, "ledger.admit")}
    embedder = InProcessEmbedder(LocalEmbeddingModel(None))
    with FakeOpenAI() as fake, tempfile.TemporaryDirectory() as root:
        # one application at a time (the open one, then the keyed one with its two keys interleaved)
        for folder, keys, plan in (
            ("open", None, ((VARIANTS[0], None),)),
            ("keyed", KEYS, ((VARIANTS[1], FREE), (VARIANTS[2], LIMITED))),
        ):
            extra: dict[str, Any] = {"api_keys": keys} if keys else {}
            with inprocess_app(Path(root, folder), embedder, fake.url, **extra) as (app, _):
                async with (
                    app.router.lifespan_context(app),
                    httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://bench") as client,
                ):
                    for _, key in plan:  # warm-up
                        await timed_gets(client, key, 30)
                    for _ in range(rounds):
                        for name, key in plan:
                            times[name] += await timed_gets(client, key, max(1, requests // rounds))
        ledger = UsageLedger(Path(root, "ledger.sqlite3"))
        limits = KeyLimits(10**9, 10**12)
        for _ in range(requests):
            t0 = time.perf_counter()
            ledger.admit("k", limits)
            times["ledger.admit"].append(time.perf_counter() - t0)
        ledger.close()
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=400, help="requests per variant")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--smoke", action="store_true", help="a few requests, to check the benchmark runs")
    ap.add_argument("--json", default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    requests = 20 if args.smoke else args.requests
    times = asyncio.run(measure(requests, 2 if args.smoke else args.rounds))
    base = pct([x * 1000 for x in times[VARIANTS[0]]], 50)
    names = list(times)
    ms = {name: [x * 1000 for x in xs] for name, xs in times.items()}
    p50 = [pct(ms[n], 50) for n in names]
    p95 = [pct(ms[n], 95) for n in names]
    rows: list[list[Any]] = [
        [n, len(ms[n]), a, b, a - base if n in VARIANTS else ""] for n, a, b in zip(names, p50, p95, strict=True)
    ]
    print(f"machine: {machine()}")
    print(table(["variant", "requests", "p50 ms", "p95 ms", "p50 - no keys ms"], rows))
    summary = {n: {"requests": len(ms[n]), "p50_ms": a, "p95_ms": b} for n, a, b in zip(names, p50, p95, strict=True)}
    write_json(args.json, {"machine": machine(), "variants": summary})
    bar_plot(args.out, "GET /v1/models in-process: metering and admission", names, {"p50": p50, "p95": p95}, "ms")


if __name__ == "__main__":
    main()
