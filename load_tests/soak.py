#!/usr/bin/env python3
"""Soak: mixed load against a running ragserve for a while, with memory sampled (not run in CI).

    python load_tests/soak.py --url http://127.0.0.1:8000 --minutes 10 [--api-key KEY]

Workers ingest, update, delete, list, retrieve and chat (RAG and passthrough, some streaming) at
once. Every ``--sample-s`` seconds the resident memory of the server's process tree (the
``serve run`` process with raylet, GCS, replicas and shard actors) is summed. At the end it
prints the request counts and errors by kind, latency percentiles, the memory at start, end and
peak, and checks that the document count equals what was acknowledged minus what was deleted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable

import httpx
import psutil

TOPICS = ["pump", "valve", "turbine", "boiler", "compressor", "conveyor", "generator", "chiller"]


def find_server_pid() -> int | None:
    """The ``serve run`` (or ``make run``: ``python -m ragserve.deployments.platform run``) process on this
    machine, whose descendants are the whole Ray application."""
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if "run" in cmd and (any(c.endswith("serve") for c in cmd[:2]) or "ragserve.deployments.platform" in cmd):
            return p.pid
    return None


def server_rss_mib(root_pid: int | None) -> tuple[float, int]:
    """Summed RSS of the server's process tree (raylet, GCS, replicas, shard actors): other Ray
    clusters on the machine are not counted. Without a root, every Ray process on the machine."""
    if root_pid is not None:
        try:
            root = psutil.Process(root_pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            procs = []
    else:
        procs = [
            p
            for p in psutil.process_iter(["cmdline"])
            if any(k in " ".join(p.info["cmdline"] or []) for k in ("ray::", "raylet", "gcs_server"))
        ]
    total, n = 0, 0
    for p in procs:
        try:
            total += p.memory_info().rss
            n += 1
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total / 2**20, n


class Soak:
    def __init__(self, url: str, api_key: str | None, index: str, max_tokens: int, server_pid: int | None):
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.AsyncClient(base_url=url, headers=headers, timeout=300)
        self.index = index
        self.max_tokens = max_tokens
        self.counts: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.latency: dict[str, list[float]] = defaultdict(list)
        self.acknowledged: set[str] = set()
        self.deleted: set[str] = set()
        self.next_id = 0
        self.server_pid = server_pid

    async def timed(self, kind: str, coro: Awaitable[httpx.Response]) -> httpx.Response | None:
        t0 = time.perf_counter()
        try:
            r = await coro
        except httpx.HTTPError as e:
            self.errors[f"{kind}: {type(e).__name__}"] += 1
            return None
        self.latency[kind].append((time.perf_counter() - t0) * 1000)
        self.counts[kind] += 1
        if r.status_code >= 400:
            self.errors[f"{kind}: {r.status_code}"] += 1
        return r

    def new_docs(self, n: int) -> list[dict]:
        docs = []
        for _ in range(n):
            i = self.next_id
            self.next_id += 1
            topic = TOPICS[i % len(TOPICS)]
            docs.append(
                {
                    "doc_id": f"soak-{i}",
                    "metadata": {"topic": topic},
                    "text": f"Soak record {i}: the {topic} on line {i % 17} was serviced; pressure "
                    f"{90 + i % 60} kPa, temperature {20 + i % 30} C, next check in {i % 9 + 1} weeks.",
                }
            )
        return docs

    async def ingest(self) -> None:
        r = await self.timed(
            "index", self.client.post("/index", json={"index_name": self.index, "documents": self.new_docs(10)})
        )
        if r is not None and r.status_code == 200:
            self.acknowledged.update(d["doc_id"] for d in r.json())

    async def update(self) -> None:
        live = sorted(self.acknowledged - self.deleted)
        if live:
            doc_id = random.choice(live)
            await self.timed(
                "update",
                self.client.post(
                    f"/indexes/{self.index}/documents",
                    json={
                        "documents": [{"doc_id": doc_id, "text": f"Updated soak record {doc_id} at {time.time():.0f}."}]
                    },
                ),
            )

    async def delete(self) -> None:
        live = sorted(self.acknowledged - self.deleted)
        if len(live) > 50:
            victims = random.sample(live, 3)
            r = await self.timed(
                "delete", self.client.post(f"/indexes/{self.index}/documents/delete", json={"doc_ids": victims})
            )
            if r is not None and r.status_code == 200:
                self.deleted.update(victims)

    async def retrieve(self) -> None:
        await self.timed(
            "retrieve",
            self.client.post(
                "/retrieve",
                json={"index_name": self.index, "query": f"when is the next {random.choice(TOPICS)} check", "top_k": 5},
            ),
        )

    async def list_docs(self) -> None:
        await self.timed(
            "list",
            self.client.get(
                f"/indexes/{self.index}/documents",
                params={
                    "limit": 20,
                    "offset": random.randint(0, 200),
                    "metadata_filter": json.dumps({"topic": "pump"}),
                },
            ),
        )

    async def chat(self, rag: bool, stream: bool) -> None:
        body: dict = {
            "messages": [{"role": "user", "content": f"What pressure did the {random.choice(TOPICS)} have?"}],
            "max_tokens": self.max_tokens,
        }
        if rag:
            body["index_name"] = self.index
        kind = f"chat_{'rag' if rag else 'pass'}{'_stream' if stream else ''}"
        if not stream:
            await self.timed(kind, self.client.post("/v1/chat/completions", json=body))
            return

        async def consume() -> httpx.Response:
            async with self.client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
                async for line in r.aiter_lines():
                    if line.startswith('data: {"error"'):
                        self.errors[f"{kind}: stream error event"] += 1
                return r

        await self.timed(kind, consume())

    async def worker(self, deadline: float, actions: list) -> None:
        while time.monotonic() < deadline:
            await random.choice(actions)()

    async def run(self, minutes: float, sample_s: float) -> None:
        await self.timed(
            "index", self.client.post("/index", json={"index_name": self.index, "documents": self.new_docs(100)})
        )
        self.acknowledged.update(f"soak-{i}" for i in range(100))
        deadline = time.monotonic() + minutes * 60
        samples: list[tuple[float, float, int]] = []

        async def sampler() -> None:
            t0 = time.monotonic()
            while time.monotonic() < deadline:
                mib, n = server_rss_mib(self.server_pid)
                samples.append((time.monotonic() - t0, mib, n))
                print(
                    f"t={samples[-1][0]:6.0f}s  server rss {mib:8.1f} MiB over {n} processes  "
                    f"requests {sum(self.counts.values())}  errors {sum(self.errors.values())}",
                    flush=True,
                )
                await asyncio.sleep(sample_s)

        fast = [self.ingest, self.update, self.delete, self.retrieve, self.retrieve, self.list_docs]
        chats = [
            lambda: self.chat(True, False),
            lambda: self.chat(True, True),
            lambda: self.chat(False, False),
            lambda: self.chat(False, True),
        ]
        await asyncio.gather(
            sampler(),
            *(self.worker(deadline, fast) for _ in range(4)),
            *(self.worker(deadline, chats) for _ in range(2)),
        )
        samples.append((minutes * 60, *server_rss_mib(self.server_pid)))
        await self.report(samples)

    async def report(self, samples: list[tuple[float, float, int]]) -> None:
        print("\n| request | count | p50 ms | p99 ms |\n|---|---:|---:|---:|")
        for kind in sorted(self.latency):
            xs = sorted(self.latency[kind])
            p99 = xs[min(len(xs) - 1, int(len(xs) * 0.99))]
            print(f"| {kind} | {len(xs)} | {statistics.median(xs):.1f} | {p99:.1f} |")
        print(f"\nerrors: {dict(self.errors) or 'none'}")
        start, end = samples[0][1], samples[-1][1]
        peak = max(s[1] for s in samples)
        print(
            f"memory (server process tree, RSS): start {start:.0f} MiB, end {end:.0f} MiB, peak {peak:.0f} MiB, "
            f"growth {end - start:+.0f} MiB"
        )
        r = await self.client.get(f"/indexes/{self.index}/documents", params={"limit": 1})
        expected = len(self.acknowledged - self.deleted)
        present = r.json().get("total_items") if r.status_code == 200 else None
        print(
            f"documents: acknowledged {len(self.acknowledged)}, deleted {len(self.deleted)}, "
            f"expected {expected}, present {present}"
        )
        await self.client.aclose()
        if present != expected:
            raise SystemExit("document count does not match what was acknowledged")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--sample-s", type=float, default=30.0)
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--index", default=f"soak-{int(time.time())}")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument(
        "--server-pid",
        type=int,
        default=None,
        help="root of the server's process tree (default: the local `serve run` process)",
    )
    args = ap.parse_args(argv)
    random.seed(7)
    pid = args.server_pid or find_server_pid()
    print(f"sampling memory of {'process tree ' + str(pid) if pid else 'every Ray process on this machine'}")
    asyncio.run(Soak(args.url, args.api_key, args.index, args.max_tokens, pid).run(args.minutes, args.sample_s))


if __name__ == "__main__":
    main()
