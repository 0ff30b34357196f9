#!/usr/bin/env python3
"""One large document beside queries: how long other requests wait while a single ``POST /index`` of
a worst-shaped document (a run of ".", about one embedding token a character) is chunked and
embedded, against the same requests on the idle server, in the same run.

    python -m benchmarks.bench_large_document [--chars 1000000] [--shape . | --words] [--seconds 40]
        [--give-up-s 15] [--smoke] [--out plot.png] [--json out.json]

The in-process application (``ragserve.testing.serve_process``: real shards, MiniLM, production
chunking, no LLM) in a process of its own. A small index is made first; then, for ``--seconds``
each, a prober sends one of each request below in turn, once a second: first on the idle server,
then while another client sends the large document into another index (and gives up after
``--give-up-s``: the server then goes on with it unless it cancels). What a hostile probe found
(docs/benchmarks.md, "One large document beside queries"): every request but ``/health`` waited
for minutes behind the document's embedding batches.

``--words``: the document is prose-shaped instead, words drawn (seeded) from a vocabulary of 5,000,
so its chunks and sentences are all different, as a real document's are; such a document makes the
objects that start the garbage collector's full passes. Besides the probes above, ``GET /health`` is
sent 20 times a second throughout: its worst latency and how often it passed 100 ms are the event
loop's stalls (a full collection holds every request; docs/benchmarks.md, "Full collections").
"""

from __future__ import annotations

import argparse
import contextlib
import random
import string
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from benchmarks.bench_jobs import start_server, stop_server
from benchmarks.common import bar_plot, machine, pct, table, write_json

PROBES: list[tuple[str, Callable[[httpx.Client, int], httpx.Response]]] = [
    ("GET /health", lambda c, i: c.get("/health")),
    ("GET /indexes", lambda c, i: c.get("/indexes")),
    ("POST /retrieve", lambda c, i: c.post("/retrieve", json={"index_name": "small", "query": "What is KAITO?"})),
    (
        "POST /index (small)",
        lambda c, i: c.post(
            "/index", json={"index_name": "small", "documents": [{"text": f"A small note {i} at {time.time()}."}]}
        ),
    ),
    ("GET documents", lambda c, i: c.get("/indexes/small/documents")),
]


def probe(base: str, seconds: float) -> dict[str, list[float]]:
    """Each probe in turn, once a second for ``seconds``: their latencies in ms."""
    out: dict[str, list[float]] = {name: [] for name, _ in PROBES}
    with httpx.Client(base_url=base, timeout=300) as c:
        end, i = time.monotonic() + seconds, 0
        while time.monotonic() < end:
            for name, send in PROBES:
                t0 = time.perf_counter()
                with contextlib.suppress(httpx.HTTPError):  # a failure counts as the time it took
                    send(c, i)
                out[name].append((time.perf_counter() - t0) * 1000)
            i += 1
            time.sleep(1.0)
    return out


def watch_health(base: str, stop: threading.Event, out: list[float]) -> None:
    """``GET /health`` 20 times a second until ``stop``: latencies in ms."""
    with httpx.Client(base_url=base, timeout=300) as c:
        while not stop.is_set():
            t0 = time.perf_counter()
            with contextlib.suppress(httpx.HTTPError):
                c.get("/health")
            out.append((time.perf_counter() - t0) * 1000)
            stop.wait(0.05)


def prose(chars: int, seed: int = 7) -> str:
    """Words from a seeded vocabulary of 5,000 (3-10 letters), sentences of 8-24 words."""
    rng = random.Random(seed)
    vocabulary = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(3, 10))) for _ in range(5_000)]
    parts: list[str] = []
    size = 0
    while size < chars:
        sentence = " ".join(rng.choices(vocabulary, k=rng.randint(8, 24))).capitalize() + ". "
        parts.append(sentence)
        size += len(sentence)
    return "".join(parts)[:chars]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--chars", type=int, default=1_000_000, help="characters of the large document")
    ap.add_argument("--shape", default=".", help="the text repeated to make it")
    ap.add_argument("--words", action="store_true", help="prose of seeded random words instead of --shape")
    ap.add_argument("--seconds", type=float, default=40.0, help="probing time, idle and beside the document")
    ap.add_argument("--give-up-s", type=float, default=15.0, help="when the large document's client leaves")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.smoke:
        args.chars, args.seconds, args.give_up_s = 20_000, 3.0, 2.0
    text = prose(args.chars) if args.words else (args.shape * (args.chars // max(1, len(args.shape)) + 1))[: args.chars]
    shape = "random words" if args.words else repr(args.shape)
    proc, base = start_server(Path(tempfile.mkdtemp(prefix="bench-large-")), {})
    try:
        httpx.post(
            f"{base}/index",
            json={"index_name": "small", "documents": [{"text": "KAITO is a Kubernetes operator for AI models."}]},
            timeout=120,
        ).raise_for_status()
        stop_watch, health_idle, health_beside = threading.Event(), list[float](), list[float]()
        watcher = threading.Thread(target=watch_health, args=(base, stop_watch, health_idle))
        watcher.start()
        idle = probe(base, args.seconds)
        stop_watch.set()
        watcher.join()
        outcome: dict[str, Any] = {}

        def send_large() -> None:
            t0 = time.perf_counter()
            try:
                r = httpx.post(
                    f"{base}/index",
                    json={"index_name": "large", "documents": [{"text": text}]},
                    timeout=args.give_up_s,
                )
                outcome["status"] = r.status_code
            except httpx.TimeoutException:
                outcome["status"] = f"client left after {args.give_up_s:g} s"
            outcome["seconds"] = time.perf_counter() - t0

        sender = threading.Thread(target=send_large)
        sender.start()
        stop_watch.clear()
        watcher = threading.Thread(target=watch_health, args=(base, stop_watch, health_beside))
        watcher.start()
        time.sleep(min(1.0, args.give_up_s / 2))
        beside = probe(base, args.seconds)
        sender.join()
        stop_watch.set()
        watcher.join()
    finally:
        stop_server(proc)

    print(f"\n### Requests beside one {args.chars:,}-character document of {shape} ({machine()})\n")
    print(f"The large document: {outcome.get('status')} after {outcome.get('seconds', 0):.1f} s.\n")
    stalls = [
        [when, len(ms), pct(ms, 50), pct(ms, 99), max(ms), sum(m > 100 for m in ms)]
        for when, ms in (("idle", health_idle), ("beside, until its response", health_beside))
        if ms
    ]
    print(table(["GET /health at 20 Hz", "n", "p50 ms", "p99 ms", "max ms", "over 100 ms"], stalls) + "\n")
    rows = []
    for name, _ in PROBES:
        rows.append(
            [
                name,
                len(beside[name]),
                pct(idle[name], 50),
                max(idle[name]),
                pct(beside[name], 50),
                max(beside[name]),
            ]
        )
    print(table(["request", "n beside", "idle p50 ms", "idle max ms", "beside p50 ms", "beside max ms"], rows))
    bar_plot(
        args.out,
        "worst latency beside one large document (ms)",
        [name for name, _ in PROBES],
        {"idle": [max(idle[n]) for n, _ in PROBES], "beside": [max(beside[n]) for n, _ in PROBES]},
        "ms",
        log=True,
    )
    payload = {
        "benchmark": "large_document",
        "machine": machine(),
        "chars": args.chars,
        "shape": shape,
        "health_idle_ms": health_idle,
        "health_beside_ms": health_beside,
        "large_document": outcome,
        "idle_ms": idle,
        "beside_ms": beside,
    }
    write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
