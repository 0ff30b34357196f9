#!/usr/bin/env python3
"""What tracing costs: RAG chat p50/p95 with OpenTelemetry tracing off and on (100 % sampling,
every span exported over OTLP/HTTP), interleaved request by request in one run
(docs/architecture.md §7, "Traces").

    python -m benchmarks.bench_tracing [--queries 150] [--shards 2] [--json out.json] [--out plot.png]
        [--smoke]

The server is the in-process application (``ragserve.testing.inprocess``: real shards, MiniLM,
production chunking, the OpenAI engine) in this process, driven through Starlette's TestClient,
against the fake upstream. Tracing is configured once with the SDK's OTLP/HTTP exporter and its
``BatchSpanProcessor`` (the server's own setup, ``ragserve.tracing.configure``) sending to a receiver
in a process of its own (``python -m ragserve.testing.otlp``, which parses every export as a
collector would), then turned on and off between requests (``ragserve.tracing.enable``); the order
alternates (on-off, off-on) so drift on a shared host falls on both. Every question is new, so
each request embeds its query. The batch exporter works in a background thread, so part of the
export cost of the "on" requests may land during "off" ones: the difference is a lower bound of
what one traced request costs, and the CPU of the export is the same however it is split.
Also printed: the off path's cost (the tracing helpers a request calls with tracing off).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from fastapi.testclient import TestClient
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

from benchmarks.common import bar_plot, free_port, machine, make_queries, make_texts, pct, table, write_json
from ragserve import tracing
from ragserve.models.embeddings import LocalEmbeddingModel
from ragserve.testing.embedder import InProcessEmbedder
from ragserve.testing.fake_openai import FakeOpenAI
from ragserve.testing.inprocess import inprocess_app


def start_receiver() -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "ragserve.testing.otlp", str(port)], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
    return proc, f"http://127.0.0.1:{port}"


def off_path_us(n: int = 20_000) -> float:
    """Microseconds a request spends in the tracing helpers with tracing off: the stages and spans
    of a RAG chat and a carrier per Ray hop (what ``ragserve.service`` and the shells call)."""
    assert not tracing.ENABLED
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    for _ in range(n):
        for stage in ("embed", "search", "fit", "evidence", "generate"):
            with tracing.stage(stage, timings):
                pass
        for name in ("rag.plan", "retrieval.fuse"):
            with tracing.span(name):
                pass
        for _ in range(4):
            tracing.carrier()
        tracing.start("chat")
    return (time.perf_counter() - t0) / n * 1e6


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--queries", type=int, default=150, help="RAG chats in each variant")
    ap.add_argument("--docs", type=int, default=300)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--top-k", type=int, help="the chats' top_k (default: the server's choice from the window)")
    ap.add_argument(
        "--no-evidence",
        action="store_true",
        help="answers without evidence and the answerability rule (evidence_passages 0, answerability off): "
        "a cheaper chat, so what tracing adds is a larger share of it",
    )
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--out", help="write a bar plot of p50 and p95 here (PNG)")
    ap.add_argument("--smoke", action="store_true", help="a few documents and questions: does it run")
    args = ap.parse_args(argv)
    if args.smoke:
        args.queries, args.docs = 4, 10
    idle_us = off_path_us()
    settings: dict[str, Any] = {"num_shards": args.shards, "chunk_size": 256}
    if args.no_evidence:
        settings.update(evidence_passages=0, answerability=False)
    receiver, collector = start_receiver()
    times: dict[str, list[float]] = {"off": [], "on": []}
    try:
        tracing.configure("inprocess", OTLPSpanExporter(endpoint=f"{collector}/v1/traces"), batch=True)
        embedder = InProcessEmbedder(LocalEmbeddingModel(None, device="cpu"))
        with (
            FakeOpenAI(answer="It is in the sources [1].", model="fake-model", max_model_len=8192) as fake,
            tempfile.TemporaryDirectory(prefix="bench-tracing-") as tmp,
            inprocess_app(Path(tmp), embedder, fake.url, **settings) as (app, _),
            TestClient(app) as client,
        ):
            docs = [{"doc_id": f"d{i}", "text": t} for i, t in enumerate(make_texts(args.docs, 8))]
            for i in range(0, len(docs), 64):
                client.post("/index", json={"index_name": "kb", "documents": docs[i : i + 64]}).raise_for_status()

            def ask(q: str) -> float:
                body: dict[str, Any] = {
                    "messages": [{"role": "user", "content": q}],
                    "index_name": "kb",
                    "max_tokens": 32,
                }
                if args.top_k:
                    body["top_k"] = args.top_k
                t0 = time.perf_counter()
                r = client.post("/v1/chat/completions", json=body)
                took = time.perf_counter() - t0
                r.raise_for_status()
                if ("traceparent" in r.headers) != tracing.ENABLED:
                    raise RuntimeError("the traceparent header does not follow the tracing switch")
                return took

            for q in make_queries(4, seed=7):  # warm both paths: lazy imports, first exports
                for on in (True, False):
                    tracing.enable(on)
                    ask(q)
            for i, q in enumerate(make_queries(2 * args.queries)):
                on = (i % 4) in (0, 3)  # on, off, off, on, ...
                tracing.enable(on)
                times["on" if on else "off"].append(ask(q))
        tracing.enable(True)
        tracing.flush()
        exported = httpx.get(collector, timeout=10).json()
    finally:
        tracing.shutdown()
        receiver.kill()
        receiver.wait()
    off50, on50 = pct(times["off"], 50) * 1000, pct(times["on"], 50) * 1000
    rows: list[list[Any]] = []
    for name, xs in times.items():
        ms = [x * 1000 for x in xs]
        rows.append([f"tracing {name}", len(ms), pct(ms, 50), pct(ms, 95), pct(ms, 50) - off50])
    print(
        f"{machine()}; RAG chat (top_k {args.top_k or 'from the window'}"
        f"{', no evidence' if args.no_evidence else ''}), in-process app, {args.docs} documents "
        f"on {args.shards} shards, fake upstream; "
        f"tracing on = 100 % sampled, OTLP/HTTP batch export to a receiver process "
        f"({exported['spans']} spans in {exported['requests']} exports)"
    )
    print(table(["variant", "requests", "p50 ms", "p95 ms", "p50 - off p50 ms"], rows))
    print(f"on - off p50: {on50 - off50:+.2f} ms ({(on50 / off50 - 1) * 100:+.1f} %); off path: {idle_us:.1f} µs")
    bar_plot(
        args.out,
        "RAG chat with tracing off and on (100 % sampled, OTLP/HTTP export)",
        [r[0] for r in rows],
        {"p50": [r[2] for r in rows], "p95": [r[3] for r in rows]},
        "ms",
    )
    write_json(
        args.json,
        {
            "queries": args.queries,
            "docs": args.docs,
            "shards": args.shards,
            "top_k": args.top_k,
            "evidence": not args.no_evidence,
            "spans_exported": exported["spans"],
            "off_path_us": idle_us,
            "ms": {k: [x * 1000 for x in v] for k, v in times.items()},
        },
    )


if __name__ == "__main__":
    main()
