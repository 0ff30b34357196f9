#!/usr/bin/env python3
"""One query a search, many searches at once: FAISS's OpenMP team against one thread a search
(issue 28; ``ragserve.store.faiss_index.SINGLE_THREAD_QUERIES``).

    python -m benchmarks.bench_faiss_threads [--sizes 1000,10000,100000] [--threads 1,2,4]
        [--searches 400] [--busy 1] [--json out.json] [--out plot.png] [--smoke]

A shard searches one query a request, from as many threads as requests are in flight, on cores
that the ingress and the other shards are using too. ``VectorIndex.search`` (the shard's own code,
a flat index of ``--sizes`` random unit vectors, 384-d, top 20) runs single-query searches from
``--threads`` threads at once, in two variants interleaved round by round: ``team`` (FAISS's
default, an OpenMP team for every search, as before issue 28) and ``one`` (each search on its
calling thread, as now). ``--busy N`` starts N processes that spin on a core each meanwhile, as
a loaded server's other processes do (0: an idle machine). Reported: searches/s, p50 and p99
latency and the process's CPU per search.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import threading
import time
from contextlib import contextmanager
from typing import Any

import numpy as np

from benchmarks.common import bar_plot, machine, pct, table, write_json
from ragserve.api.index_spec import IndexSpec
from ragserve.store import faiss_index
from ragserve.store.faiss_index import VectorIndex

DIM = 384
K = 20


def _spin(stop: Any) -> None:
    x = 0
    while not stop.is_set():
        for _ in range(100_000):
            x += 1


@contextmanager
def busy_cores(n: int) -> Any:
    """``n`` processes spinning on a core each while the block runs."""
    stop = mp.get_context("spawn").Event()
    procs = [mp.get_context("spawn").Process(target=_spin, args=(stop,), daemon=True) for _ in range(n)]
    for p in procs:
        p.start()
    try:
        yield
    finally:
        stop.set()
        for p in procs:
            p.join(timeout=5)


@contextmanager
def variant(name: str) -> Any:
    """``team``: every search starts FAISS's OpenMP team (the code before issue 28); ``one``: as now."""
    before = faiss_index.SINGLE_THREAD_QUERIES
    faiss_index.SINGLE_THREAD_QUERIES = -1 if name == "team" else before
    try:
        yield
    finally:
        faiss_index.SINGLE_THREAD_QUERIES = before


def run(index: VectorIndex, queries: np.ndarray, threads: int) -> dict[str, float]:
    """``len(queries)`` single-query searches shared by ``threads`` threads; wall, latencies, CPU."""
    latencies: list[float] = []
    lock = threading.Lock()
    todo = iter(range(len(queries)))

    def worker() -> None:
        mine = []
        for i in todo:  # next() of a shared iterator: each thread takes the next query when free
            t0 = time.perf_counter()
            index.search(queries[i : i + 1], K)
            mine.append(time.perf_counter() - t0)
        with lock:
            latencies.extend(mine)

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    cpu0, t0 = time.process_time(), time.perf_counter()
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    ms = [x * 1000 for x in latencies]
    return {
        "searches_per_s": len(queries) / wall,
        "p50_ms": pct(ms, 50),
        "p99_ms": pct(ms, 99),
        "cpu_ms_per_search": 1000 * cpu / len(queries),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,10000,100000", help="vectors in the index")
    ap.add_argument("--threads", default="1,2,4", help="threads searching at once")
    ap.add_argument("--searches", type=int, default=400, help="searches a measurement")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds; the best of each is kept")
    ap.add_argument("--busy", type=int, default=1, help="processes spinning on a core each meanwhile")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--out", help="write a bar plot of searches/s here (PNG)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes: does it run")
    args = ap.parse_args(argv)
    if args.smoke:
        args.sizes, args.threads, args.searches, args.rounds, args.busy = "500", "1,2", 20, 1, 0
    sizes = [int(x) for x in args.sizes.split(",")]
    thread_counts = [int(x) for x in args.threads.split(",")]
    rng = np.random.default_rng(0)
    best: dict[tuple[int, int, str], dict[str, float]] = {}
    with busy_cores(args.busy):
        for n in sizes:
            vectors = rng.normal(size=(n, DIM)).astype(np.float32)
            vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
            index = VectorIndex(DIM, IndexSpec())
            index.add(vectors, np.arange(n))
            queries = rng.normal(size=(args.searches, DIM)).astype(np.float32)
            for _ in range(args.rounds):
                for threads in thread_counts:
                    for name in ("team", "one"):
                        with variant(name):
                            r = run(index, queries, threads)
                        key = (n, threads, name)
                        if key not in best or r["searches_per_s"] > best[key]["searches_per_s"]:
                            best[key] = r
    rows = []
    for (n, threads, name), r in best.items():
        team = best[(n, threads, "team")]["searches_per_s"]
        rows.append(
            [
                f"{n:,}",
                threads,
                name,
                r["searches_per_s"],
                r["searches_per_s"] / team,
                r["p50_ms"],
                r["p99_ms"],
                r["cpu_ms_per_search"],
            ]
        )
    print(
        f"{machine()}; flat index, {DIM}-d, top {K}, one query a search, {args.searches} searches a "
        f"measurement, best of {args.rounds} interleaved rounds; {args.busy} other process(es) spinning"
    )
    print(table(["vectors", "threads", "variant", "searches/s", "x team", "p50 ms", "p99 ms", "CPU ms/search"], rows))
    groups = sorted({(n, t) for n, t, _ in best})
    bar_plot(
        args.out,
        f"single-query FAISS searches/s, flat {DIM}-d, {args.busy} core(s) busy elsewhere",
        [f"{n:,} vectors\n{t} thread(s)" for n, t in groups],
        {name: [best[(n, t, name)]["searches_per_s"] for n, t in groups] for name in ("team", "one")},
        "searches/s",
        log=True,
    )
    write_json(
        args.json,
        {
            "machine": machine(),
            "busy": args.busy,
            "searches": args.searches,
            "results": [{"vectors": n, "threads": t, "variant": v, **r} for (n, t, v), r in sorted(best.items())],
        },
    )


if __name__ == "__main__":
    main()
