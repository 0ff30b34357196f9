#!/usr/bin/env python3
"""Ingestion jobs (``POST /jobs``) against queries and against ``POST /index``: how much a large job
slows ``/retrieve`` (p50/p95 while it runs vs idle, same server, same run) and what its single slot
costs in throughput (documents/s from submit to finished vs ``POST /index`` of the same documents).

    python -m benchmarks.bench_jobs [--docs 2000] [--preload 500] [--queries 200] [--per-request 64]
        [--job-concurrency 1,2] [--smoke] [--out plot.png] [--json out.json]

One server per ``--job-concurrency`` value (the ``job_concurrency`` setting; 1 is the default): the
in-process application (``ragserve.testing.serve_process``: real shards, MiniLM, the job runner, no
LLM) in a process of its own, so the client never shares the server's GIL. Its chunking is the
production default (``chunk_size`` 256, overlap 32). Per server, in this order:

1. ``--preload`` documents indexed with ``POST /index`` into the index the queries ask;
2. idle: ``--queries`` ``POST /retrieve`` (top 5, the default hybrid mode), one at a time;
3. a job of ``--docs`` documents into a fresh index, and the same queries, repeated, one at a time
   until the job has finished (a thread polls ``GET /jobs/{id}`` every 0.2 s);
4. idle again (the A-B-A check that the server did not simply drift);
5. ``POST /index`` of the same documents, ``--per-request`` a call, one client, into a fresh index;
6. the same job again, alone (no queries), into a fresh index: the throughput to compare with 5.

The in-process application has no query-vector cache, so a repeated query is encoded again: the
repeats during the job cost what the first ones did. The documents are ``make_texts`` with 12
sentences (~120 words, one chunk each); the queries ``make_queries``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from benchmarks.common import bar_plot, free_port, machine, make_queries, make_texts, pct, table, write_json

SENTENCES = 12  # ~120 words a document
POLL_S = 0.2


def start_server(storage: Path, settings: dict[str, Any]) -> tuple[subprocess.Popen[bytes], str]:
    """``ragserve.testing.serve_process`` on a free port; returns it once ``/health`` answers."""
    port = free_port()
    args = [f"{k}={json.dumps(v)}" for k, v in settings.items()]
    proc = subprocess.Popen(
        [sys.executable, "-m", "ragserve.testing.serve_process", str(storage), str(port), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while True:
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_server(proc)
            err = proc.stderr.read().decode(errors="replace")[-3000:] if proc.stderr else ""
            raise RuntimeError(f"the server did not start: {err}")
        time.sleep(0.2)


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def documents(texts: list[str]) -> list[dict[str, Any]]:
    return [{"text": t, "doc_id": f"doc-{i}"} for i, t in enumerate(texts)]


def index_batches(client: httpx.Client, index: str, docs: list[dict[str, Any]], per_request: int) -> float:
    """Seconds to send ``docs`` with ``POST /index``, ``per_request`` a call, one after another."""
    t0 = time.perf_counter()
    for i in range(0, len(docs), per_request):
        client.post("/index", json={"index_name": index, "documents": docs[i : i + per_request]}).raise_for_status()
    return time.perf_counter() - t0


def query(client: httpx.Client, index: str, q: str) -> float:
    t0 = time.perf_counter()
    r = client.post("/retrieve", json={"index_name": index, "query": q, "top_k": 5})
    r.raise_for_status()
    took = time.perf_counter() - t0
    if not r.json()["results"]:
        raise RuntimeError(f"no results for {q!r}")
    return took


class JobWatch:
    """Submits a job and polls it on a thread of its own: ``done`` is set once it has finished."""

    def __init__(self, base: str, index: str, docs: list[dict[str, Any]]):
        self.base, self.done = base, threading.Event()
        self.info: dict[str, Any] = {}
        with httpx.Client(base_url=base, timeout=600) as c:
            self.t0 = time.perf_counter()
            r = c.post("/jobs", json={"index_name": index, "documents": docs, "webhook": False})
            r.raise_for_status()
        self.submit_s = time.perf_counter() - self.t0
        self.id: str = r.json()["id"]
        self.seconds = float("nan")
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        with httpx.Client(base_url=self.base, timeout=60) as c:
            while True:
                info = c.get(f"/jobs/{self.id}").json()
                if info.get("finished_at") is not None:
                    self.seconds = time.perf_counter() - self.t0
                    self.info = info
                    self.done.set()
                    return
                time.sleep(POLL_S)

    def wait(self) -> dict[str, Any]:
        self._thread.join()
        if self.info.get("status") != "completed" or self.info["documents"]["failed"]:
            raise RuntimeError(f"the job did not complete cleanly: {self.info}")
        return self.info


def lat_ms(seconds: list[float]) -> dict[str, float]:
    ms = [s * 1000 for s in seconds]
    return {"n": len(ms), "p50": pct(ms, 50), "p95": pct(ms, 95), "p99": pct(ms, 99)}


class CoreMeter:
    """CPU seconds of the server process (all threads) per wall second over a phase; 2.0 = 2 cores."""

    def __init__(self, pid: int):
        self.proc = psutil.Process(pid)

    def __enter__(self) -> CoreMeter:
        t = self.proc.cpu_times()
        self.cpu0, self.t0, self.cores = t.user + t.system, time.perf_counter(), 0.0
        return self

    def __exit__(self, *exc: object) -> None:
        t = self.proc.cpu_times()
        self.cores = (t.user + t.system - self.cpu0) / (time.perf_counter() - self.t0)


def measure(concurrency: int, args: argparse.Namespace, texts: list[str], queries: list[str]) -> dict[str, Any]:
    docs = documents(texts)
    settings = {
        "job_concurrency": concurrency,
        "job_batch_documents": args.job_batch,
        "chunk_size": 256,
        "chunk_overlap": 32,
    }
    with tempfile.TemporaryDirectory(prefix="ragserve-bench-jobs-") as storage:
        proc, base = start_server(Path(storage), settings)
        try:
            with httpx.Client(base_url=base, timeout=600) as c:
                index_batches(c, "bench-q", docs[: args.preload], args.per_request)
                for q in queries[:5]:  # warm-up of the route, the model and the shards
                    query(c, "bench-q", q)

                with CoreMeter(proc.pid) as m_idle:
                    idle = [query(c, "bench-q", q) for q in queries]

                busy: list[float] = []
                with CoreMeter(proc.pid) as m_busy:
                    job = JobWatch(base, "bench-job-busy", docs)
                    i = 0
                    while not job.done.is_set():
                        busy.append(query(c, "bench-q", queries[i % len(queries)]))
                        i += 1
                    job.wait()

                with CoreMeter(proc.pid) as m_idle2:
                    idle2 = [query(c, "bench-q", q) for q in queries]

                with CoreMeter(proc.pid) as m_index:
                    index_s = index_batches(c, "bench-index", docs, args.per_request)

                with CoreMeter(proc.pid) as m_alone:
                    alone = JobWatch(base, "bench-job", docs)
                    alone.wait()

                for name in ("bench-job-busy", "bench-index", "bench-job"):
                    got = c.get(f"/indexes/{name}/documents", params={"limit": 1}).json()["total_items"]
                    if got != len(docs):
                        raise RuntimeError(f"{name} holds {got} documents, not {len(docs)}")
        finally:
            stop_server(proc)
    n = len(docs)
    return {
        "job_concurrency": concurrency,
        "idle_ms": lat_ms(idle),
        "during_job_ms": lat_ms(busy),
        "idle_after_ms": lat_ms(idle2),
        "queries_during_job": len(busy),
        "job_with_queries_s": job.seconds,
        "job_with_queries_docs_per_s": n / job.seconds,
        "job_submit_s": job.submit_s,
        "job_alone_s": alone.seconds,
        "job_alone_docs_per_s": n / alone.seconds,
        "post_index_s": index_s,
        "post_index_docs_per_s": n / index_s,
        "server_cores_busy": {
            "idle_queries": m_idle.cores,
            "job_with_queries": m_busy.cores,
            "idle_queries_after": m_idle2.cores,
            "post_index": m_index.cores,
            "job_alone": m_alone.cores,
        },
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--docs", type=int, default=2000, help="documents of the job (and of POST /index)")
    ap.add_argument("--preload", type=int, default=500, help="documents in the index the queries ask")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--per-request", type=int, default=64, help="documents per POST /index call")
    ap.add_argument("--job-batch", type=int, default=64, help="job_batch_documents (the server's default: 64)")
    ap.add_argument("--job-concurrency", default="1,2", help="comma-separated job_concurrency values, a server each")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.smoke:
        args.docs, args.preload, args.queries, args.per_request, args.job_batch = 40, 20, 10, 16, 16
        args.job_concurrency = "1"
    texts = make_texts(args.docs, sentences=SENTENCES, seed=3)
    queries = make_queries(args.queries, seed=7)
    results = [measure(int(v), args, texts, queries) for v in args.job_concurrency.split(",")]

    print(f"\n### Queries during a {args.docs}-document job ({machine()})\n")
    print(
        f"`POST /retrieve` (top 5, hybrid) over {args.preload} documents, one at a time; "
        f"idle = {args.queries} queries before the job and again after it.\n"
    )
    rows: list[list[Any]] = []
    for r in results:
        jc = f"job_concurrency={r['job_concurrency']}"
        for label, key in (("idle", "idle_ms"), ("during the job", "during_job_ms"), ("idle after", "idle_after_ms")):
            rows.append([f"{jc}: {label}", r[key]["n"], r[key]["p50"], r[key]["p95"]])
    print(table(["server", "queries", "p50 ms", "p95 ms"], rows))

    print(f"\n### Throughput: {args.docs} documents, a job vs POST /index ({args.per_request} a call, one client)\n")
    rows = []
    for r in results:
        jc = f"job_concurrency={r['job_concurrency']}"
        rows.append([f"{jc}: POST /index", r["post_index_s"], r["post_index_docs_per_s"], 1.0])
        rows.append(
            [f"{jc}: job, alone", r["job_alone_s"], r["job_alone_docs_per_s"], r["post_index_s"] / r["job_alone_s"]]
        )
        rows.append(
            [
                f"{jc}: job, with the queries",
                r["job_with_queries_s"],
                r["job_with_queries_docs_per_s"],
                r["post_index_s"] / r["job_with_queries_s"],
            ]
        )
    print(table(["what", "seconds", "documents/s", "vs POST /index"], rows))

    print("\n#### Server process CPU (seconds per wall second; 2.0 = both cores)\n")
    phases = list(results[0]["server_cores_busy"])
    print(
        table(
            ["job_concurrency", *phases],
            [[r["job_concurrency"], *(r["server_cores_busy"][p] for p in phases)] for r in results],
        )
    )
    bar_plot(
        args.out,
        f"/retrieve during a {args.docs}-document job (ms)",
        [f"job_concurrency={r['job_concurrency']}\n{k}" for r in results for k in ("idle", "during job")],
        {
            "p50": [r[k]["p50"] for r in results for k in ("idle_ms", "during_job_ms")],
            "p95": [r[k]["p95"] for r in results for k in ("idle_ms", "during_job_ms")],
        },
        "ms",
    )
    payload = {
        "benchmark": "jobs",
        "machine": machine(),
        "documents": args.docs,
        "preload": args.preload,
        "queries": args.queries,
        "per_request": args.per_request,
        "job_batch_documents": args.job_batch,
        "results": results,
    }
    write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
