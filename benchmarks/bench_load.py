#!/usr/bin/env python3
"""Load curves: requests/s and latency under many clients, beside the platform's own ceiling
measured in the same run with the same client.

    python -m benchmarks.bench_load [--docs 2000] [--concurrency 1,4,16,64] [--duration 15]
        [--rates 25,50,100,200] [--paths retrieve,retrieve-warm,chat,chat-warm,passthrough,stream]
        [--ingest-docs 2000] [--peer-url URL] [--ingress-replicas 1] [--mode high-throughput]
        [--json out.json] [--out docs/img/load.png] [--smoke]

What runs: a private Ray in Serve's high-throughput mode (as ``make run``), the real application
(``build_app``, a remote-LLM configuration: ``llm_engine: openai`` against the fake upstream in this
process, so the model's speed never hides ragserve's own), ``--docs`` synthetic documents
(``make_texts``) indexed with MiniLM on 2 shards, and beside it **the platform's floor**: a trivial
Serve deployment in the same Ray and mode that answers each route at once with a constant body
(``benchmarks.bench_passthrough.deploy_floor``). Every measurement is one ``benchmarks.loadgen``
client process (aiohttp, one event loop), the same for the floor, ragserve and a peer.

- **Closed loop** at each ``--concurrency`` C: C workers send back to back for ``--duration`` s
  (after a warm-up); requests/s, p50 and p99. Per C the floor is measured first, then each path,
  so drift on a shared machine hits them alike.
- **Open loop** at each ``--rates`` R (Poisson arrivals): p50/p99 counted from each request's
  scheduled start, errors and arrivals dropped (more than 2,048 in flight).
- **Queries during ingestion**: cold ``/retrieve`` at C=4 idle, then while ``--ingest-docs`` new
  documents are indexed (``POST /index``, 64 a call, one client); the ingestion's docs/s.
- ``--peer-url``: the same ``/retrieve`` and RAG chat curves against a server of KAITO RAGEngine's
  API (its own copy of the corpus is indexed first).

Paths: ``retrieve`` (``POST /retrieve``, 5 nodes), ``chat`` (RAG chat, ``max_tokens`` 16),
``passthrough`` (chat without ``index_name``), ``stream`` (RAG chat streamed: TTFT). ``-warm``
repeats 32 questions (the query-embedding cache holds them); cold makes every question different.
RAG chats opt out of the answer cache (``"cache": false``) unless ``--answer-cache``, so the curve is
the pipeline's. Goals (issue 28), checked per path and printed: saturation requests/s >= 0.5x the
floor's, and p99 at C=16 <= 4x the p50 at C=1.
"""

from __future__ import annotations

import argparse
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.bench_passthrough import deploy_floor
from benchmarks.common import (
    cpu_delta,
    cpu_snapshot,
    deploy_ragserve,
    machine,
    make_queries,
    make_texts,
    parse_mode,
    ray_serve,
    table,
    write_json,
)
from benchmarks.loadgen import LoadSpec, run_in_process
from ragserve.testing.fake_openai import FakeOpenAI

INDEX = "kb"
WARM_QUERIES = 32
INGEST_BATCH = 64

_CHAT = {"index_name": INDEX, "max_tokens": 16, "messages": [{"role": "user", "content": "{q}"}]}
#: path -> (route, body, streamed, query mode); the floor answered for it: ``floor_kind``
PATHS: dict[str, tuple[str, dict[str, Any], bool, str]] = {
    "retrieve": ("/retrieve", {"index_name": INDEX, "query": "{q}", "max_node_count": 5}, False, "cold"),
    "retrieve-warm": (
        "/retrieve",
        {"index_name": INDEX, "query": "{q}", "max_node_count": 5},
        False,
        "warm",
    ),
    "chat": ("/v1/chat/completions", _CHAT, False, "cold"),
    "chat-warm": ("/v1/chat/completions", _CHAT, False, "warm"),
    "passthrough": (
        "/v1/chat/completions",
        {"max_tokens": 16, "messages": [{"role": "user", "content": "{q}"}]},
        False,
        "cold",
    ),
    "stream": ("/v1/chat/completions", {**_CHAT, "stream": True}, True, "cold"),
}
#: what the floor answers for each kind of path: a JSON body, or an SSE stream
_FLOOR_KINDS = {"json": ("/v1/chat/completions", False), "stream": ("/v1/chat/completions", True)}


def floor_kind(path: str) -> str:
    return "stream" if PATHS[path][2] else "json"


def path_spec(base: str, path: str, queries: list[str], answer_cache: bool, **kw: Any) -> LoadSpec:
    route, body, stream, query_mode = PATHS[path]
    body = dict(body)
    if "messages" in body and "index_name" in body and not answer_cache:
        body["cache"] = False
    pool = queries[:WARM_QUERIES] if query_mode == "warm" else queries
    return LoadSpec(url=f"{base}{route}", body=body, queries=pool, query_mode=query_mode, stream=stream, **kw)


def floor_spec(floor: str, kind: str, **kw: Any) -> LoadSpec:
    route, stream = _FLOOR_KINDS[kind]
    body = {"messages": [{"role": "user", "content": "{q}"}], **({"stream": True} if stream else {})}
    return LoadSpec(url=f"{floor}{route}", body=body, stream=stream, **kw)


def index_docs(base: str, texts: list[str], index: str = INDEX, id_prefix: str = "doc") -> float:
    """Index ``texts`` (``POST /index``, 64 a call, one client); documents per second."""
    t0 = time.perf_counter()
    with httpx.Client(base_url=base, timeout=600) as client:
        for i in range(0, len(texts), INGEST_BATCH):
            docs = [{"text": t, "doc_id": f"{id_prefix}-{i + j}"} for j, t in enumerate(texts[i : i + INGEST_BATCH])]
            client.post("/index", json={"index_name": index, "documents": docs}).raise_for_status()
    return len(texts) / (time.perf_counter() - t0)


def _row(label: str, r: dict[str, Any]) -> list[Any]:
    errors = sum(r["errors"].values()) + r.get("dropped", 0)
    return [label, r["rps"], r["p50_ms"], r["p99_ms"], errors]


def closed_curves(
    targets: dict[str, str], floor: str, paths: list[str], concurrency: list[int], queries: list[str], args: Any
) -> dict[str, Any]:
    """Per C: the floor of each kind the paths need, then every path on every target."""
    out: dict[str, Any] = {"floor": {}, "paths": {}}
    kinds = sorted({floor_kind(p) for p in paths})
    timing = {"duration_s": args.duration, "warmup_s": args.warmup}
    for c in concurrency:
        for kind in kinds:
            r = run_in_process(floor_spec(floor, kind, concurrency=c, **timing))
            out["floor"].setdefault(kind, {})[c] = r
            print(f"  C={c:<3} floor {kind:<6} {r['rps']:8.1f} req/s  p50 {r['p50_ms']:7.1f} ms", flush=True)
        for path in paths:
            for target, base in targets.items():
                if target != "ragserve" and path not in ("retrieve", "chat"):
                    continue  # a peer: KAITO's API has /retrieve and RAG chat
                spec = path_spec(base, path, queries, args.answer_cache, concurrency=c, **timing)
                if target != "ragserve":
                    spec.body = {k: v for k, v in (spec.body or {}).items() if k != "cache"}
                before = cpu_snapshot() if target == "ragserve" else None
                r = run_in_process(spec)
                if before is not None:  # where each request's CPU went, by process (ms a request)
                    spent = cpu_delta(before, cpu_snapshot())
                    r["cpu_ms_per_request"] = {k: 1000 * v / max(1, r["requests"]) for k, v in spent.items()}
                out["paths"].setdefault(target, {}).setdefault(path, {})[c] = r
                extra = f"  ttft p50 {r['ttft_p50_ms']:.1f} ms" if "ttft_p50_ms" in r else ""
                print(
                    f"  C={c:<3} {target} {path:<13} {r['rps']:8.1f} req/s  p50 {r['p50_ms']:7.1f} ms  "
                    f"p99 {r['p99_ms']:7.1f} ms  errors {r['errors'] or 0}{extra}",
                    flush=True,
                )
    return out


def open_loop(base: str, floor: str, paths: list[str], rates: list[float], queries: list[str], args: Any) -> dict:
    out: dict[str, Any] = {}
    timing = {"duration_s": args.duration, "warmup_s": args.warmup}
    for rate in rates:
        for kind in sorted({floor_kind(p) for p in paths}):
            out.setdefault(f"floor-{kind}", {})[rate] = run_in_process(
                floor_spec(floor, kind, mode="open", rate=rate, **timing)
            )
        for path in paths:
            r = run_in_process(path_spec(base, path, queries, args.answer_cache, mode="open", rate=rate, **timing))
            out.setdefault(path, {})[rate] = r
            print(
                f"  open {rate:6.1f}/s {path:<13} p50 {r['p50_ms']:7.1f} ms  p99 {r['p99_ms']:7.1f} ms  "
                f"errors {sum(r['errors'].values())} dropped {r['dropped']}",
                flush=True,
            )
    return out


def during_ingestion(base: str, texts: list[str], queries: list[str], args: Any) -> dict[str, Any]:
    """Cold /retrieve at C=4: idle, then while ``texts`` are indexed."""
    spec = path_spec(base, "retrieve", queries, True, concurrency=4, duration_s=args.duration, warmup_s=args.warmup)
    idle = run_in_process(spec)
    state: dict[str, Any] = {}

    def ingest() -> None:
        state["docs_per_s"] = index_docs(base, texts, id_prefix="ingest")
        state["ended"] = time.perf_counter()

    worker = threading.Thread(target=ingest)
    worker.start()
    time.sleep(0.5)  # the first batch is being embedded
    t0 = time.perf_counter()
    busy = run_in_process(spec)
    t1 = time.perf_counter()
    worker.join()
    # the share of the query window that the ingestion covered (1.0: it ran the whole time)
    covered = max(0.0, min(state["ended"], t1) - t0) / (t1 - t0)
    print(
        f"  /retrieve C=4 idle {idle['rps']:.1f} req/s p50 {idle['p50_ms']:.1f} ms; during ingestion "
        f"{busy['rps']:.1f} req/s p50 {busy['p50_ms']:.1f} ms p99 {busy['p99_ms']:.1f} ms "
        f"(ingest {state['docs_per_s']:.1f} docs/s, covering {covered:.0%} of the window)",
        flush=True,
    )
    return {"idle": idle, "during": busy, "ingest_docs_per_s": state["docs_per_s"], "window_covered": covered}


def goals(curves: dict[str, Any], concurrency: list[int]) -> list[list[Any]]:
    """Per path: saturation (the best requests/s over C) against the floor's, and p99 at C=16 against
    the p50 at C=1. The floor's own rows first: the same latency ratio of a deployment that does
    nothing, which a closed loop of 16 clients on a few cores bounds from below (each waits for
    the 15 others' turns)."""
    rows = []
    for kind, by_c in curves["floor"].items():
        best = max(r["rps"] for r in by_c.values())
        row: list[Any] = [f"floor ({kind})", best, best, 1.0]
        if 1 in by_c and 16 in by_c:
            row += [by_c[1]["p50_ms"], by_c[16]["p99_ms"], by_c[16]["p99_ms"] / by_c[1]["p50_ms"]]
        else:
            row += ["n/a", "n/a", "n/a"]
        rows.append(row)
    for path, by_c in curves["paths"].get("ragserve", {}).items():
        floor = max(r["rps"] for r in curves["floor"][floor_kind(path)].values())
        best = max(r["rps"] for r in by_c.values())
        row = [path, best, floor, best / floor if floor else float("nan")]
        if 1 in by_c and 16 in by_c:
            row += [by_c[1]["p50_ms"], by_c[16]["p99_ms"], by_c[16]["p99_ms"] / by_c[1]["p50_ms"]]
        else:
            row += ["n/a", "n/a", "n/a"]
        rows.append(row)
    return rows


def plot(curves: dict[str, Any], path_out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for kind, by_c in curves["floor"].items():
        cs = sorted(by_c)
        ax.plot(cs, [by_c[c]["rps"] for c in cs], "k--" if kind == "json" else "k:", label=f"Serve floor ({kind})")
    for target, by_path in curves["paths"].items():
        for path, by_c in by_path.items():
            cs = sorted(by_c)
            ax.plot(cs, [by_c[c]["rps"] for c in cs], marker="o", label=f"{target} {path}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent clients (closed loop)")
    ax.set_ylabel("requests/s")
    ax.set_title("Throughput under load, same client and run")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    Path(path_out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path_out)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=2000)
    ap.add_argument("--concurrency", default="1,4,16,64")
    ap.add_argument("--duration", type=float, default=15.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--rates", default="25,50,100,200", help="open-loop arrival rates (requests/s); '' for none")
    ap.add_argument("--open-paths", default="retrieve,chat")
    ap.add_argument("--paths", default=",".join(PATHS))
    ap.add_argument("--ingest-docs", type=int, default=2000, help="0: no queries-during-ingestion run")
    ap.add_argument("--peer-url", default=None, help="a server of KAITO RAGEngine's API, measured alike")
    ap.add_argument("--ingress-replicas", type=int, default=1)
    ap.add_argument("--mode", default="high-throughput", help="MODE[:QUERY_EMBEDDING] (benchmarks.common)")
    ap.add_argument("--answer-cache", action="store_true", help="let RAG chats use the answer cache")
    ap.add_argument("--settings", default="{}", help="more application settings, as JSON")
    ap.add_argument("--json", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)
    if args.smoke:
        args.docs, args.concurrency, args.duration, args.warmup = 60, "1,2", 1.0, 0.3
        args.paths, args.open_paths, args.rates, args.ingest_docs = "retrieve,chat,stream", "retrieve", "5", 64
    import json

    concurrency = [int(c) for c in args.concurrency.split(",")]
    paths = [p for p in args.paths.split(",") if p]
    unknown = sorted(set(paths) - set(PATHS))
    if unknown:
        ap.error(f"unknown paths {unknown}; known: {sorted(PATHS)}")
    rates = [float(r) for r in args.rates.split(",") if r]
    high_throughput, query_embedding = parse_mode(args.mode)
    texts = make_texts(args.docs, sentences=8)
    queries = make_queries(max(WARM_QUERIES, 200))
    print(f"# bench_load on {machine()}", flush=True)
    result: dict[str, Any] = {"machine": machine(), "args": vars(args)}
    storage = Path(f"/tmp/ragserve-bench-load-{int(time.time())}")
    settings = {
        "storage_dir": str(storage),
        "num_shards": 2,
        "llm_engine": "openai",
        "similarity_threshold": 0.0,
        "query_embedding": query_embedding,
        **json.loads(args.settings),
    }
    with (
        FakeOpenAI(answer="The pump is serviced every 30 minutes [1].", model="fake-model", max_model_len=8192) as fake,
        ray_serve(high_throughput=high_throughput) as port,
    ):
        floor = deploy_floor(port)
        options = {"Ingress": {"num_replicas": args.ingress_replicas}} if args.ingress_replicas != 1 else None
        base = deploy_ragserve(port, "rag", {**settings, "llm_url": fake.url}, options=options)
        t0 = time.perf_counter()
        result["index_docs_per_s"] = index_docs(base, texts)
        print(f"indexed {len(texts)} documents in {time.perf_counter() - t0:.1f}s", flush=True)
        targets = {"ragserve": base}
        if args.peer_url:
            index_docs(args.peer_url, texts)
            targets["peer"] = args.peer_url.rstrip("/")
        before = cpu_snapshot()
        curves = closed_curves(targets, floor, paths, concurrency, queries, args)
        result["cpu_s_closed_loop"] = cpu_delta(before, cpu_snapshot())
        result["closed"] = curves
        if rates:
            open_paths = [p for p in args.open_paths.split(",") if p in PATHS]
            result["open"] = open_loop(base, floor, open_paths, rates, queries, args)
        if args.ingest_docs:
            result["ingestion"] = during_ingestion(base, make_texts(args.ingest_docs, 8, seed=7), queries, args)
        shutil.rmtree(storage, ignore_errors=True)

    print()
    for path in paths:
        rows = []
        for c in concurrency:
            kind = floor_kind(path)
            fr = curves["floor"][kind][c]
            rows.append(_row(f"floor ({kind}), C={c}", fr))
            for target in targets:
                r = curves["paths"].get(target, {}).get(path, {}).get(c)
                if r is not None:
                    rows.append(_row(f"{target} {path}, C={c}", r))
        print(f"### {path}\n")
        print(table(["closed loop", "requests/s", "p50 ms", "p99 ms", "errors"], rows))
        print()
    print("### Goals (issue 28): saturation >= 0.5x the floor; p99 at C=16 <= 4x p50 at C=1\n")
    goal_rows = goals(curves, concurrency)
    print(
        table(
            ["path", "saturation req/s", "floor req/s", "x floor", "p50 C=1 ms", "p99 C=16 ms", "p99/p50"],
            goal_rows,
        )
    )
    result["goals"] = goal_rows
    if rates:
        print("\n### Open loop\n")
        rows = []
        for name, by_rate in result["open"].items():
            for rate, r in by_rate.items():
                rows.append([name, rate, r["rps"], r["p50_ms"], r["p99_ms"], sum(r["errors"].values()), r["dropped"]])
        print(table(["path", "offered req/s", "served req/s", "p50 ms", "p99 ms", "errors", "dropped"], rows))
    if args.ingest_docs:
        ing = result["ingestion"]
        print("\n### Queries during an ingestion\n")
        print(
            table(
                ["cold /retrieve, C=4", "requests/s", "p50 ms", "p99 ms", "errors"],
                [_row("idle", ing["idle"]), _row(f"while indexing {args.ingest_docs} documents", ing["during"])],
            )
        )
        covered = ing["window_covered"]
        print(f"\ningestion: {ing['ingest_docs_per_s']:.1f} docs/s; it covered {covered:.0%} of the query window")
    print("\n### CPU a request, by process, at the highest concurrency (ms)\n")
    top = max(concurrency)
    roles = sorted(
        {k for by_c in curves["paths"].get("ragserve", {}).values() for k in by_c[top].get("cpu_ms_per_request", {})}
    )
    print(
        table(
            ["path", *roles],
            [
                [path, *(by_c[top].get("cpu_ms_per_request", {}).get(role, 0.0) for role in roles)]
                for path, by_c in curves["paths"].get("ragserve", {}).items()
            ],
        )
    )
    print("\nCPU seconds by process during the closed-loop curves:", result["cpu_s_closed_loop"])
    write_json(args.json, result)
    if args.out:
        plot(curves, args.out)
    return result


if __name__ == "__main__":
    main()
