#!/usr/bin/env python3
"""Request-path overhead: what ragserve adds to a chat completion that goes straight to the
upstream LLM (passthrough) and to a RAG chat completion (cold: every question different, so the
query embedding is computed each time), in each of Serve's modes, against baselines measured in
the same run:

- the fake upstream called directly (no Serve at all);
- a trivial Serve deployment returning a constant body (the platform floor: ingress + one replica);
- a trivial Serve deployment that forwards the body to the upstream with aiohttp and returns its
  answer (the floor of any Serve-based proxy: what is left over it is ragserve's own work);
- raw encoding of the same questions with the same model in this process (the embedding a RAG
  request cannot avoid): in a tight loop, the goal's baseline; and *paced*, each encode after a
  pause as long as a RAG request (the ingress encodes one query per request, and an encode after
  a pause is slower on this kind of machine: ``benchmarks.common.paced_query_encode``), with the
  eager model and with the ingress's own optimized graph on one thread;
- Ray's floor for the search stage: one call to each of two trivial actors at once, paced
  likewise (``benchmarks.common.actor_call_floor``).

    python -m benchmarks.bench_passthrough [--requests 300] [--modes default,high-throughput,default]
        [--query-embedding auto|ingress|deployment]
        [--smoke] [--out docs/img/passthrough.png]

Each mode (``benchmarks.common.MODES``: Serve's default request path, or its HAProxy/gRPC
high-throughput mode; ``MODE:QUERY_EMBEDDING`` also sets where queries are embedded) starts its
own Ray; the default order A-B-A shows drift on a shared machine.
Within a mode the paths are interleaved in rounds. The RAG chat's stages come from the server's
own ``Server-Timing`` (embed, search, fit = token counting and prompt assembly, generate = the
upstream call); "outside" is the rest (ingress, request handling, JSON). The goal of issue 13 is
checked per mode: RAG chat overhead (p50 over the direct upstream call) <= 1.5 x (floor p50 + raw
encode p50); passthrough <= 1 ms over the floor.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path
from typing import Any

import httpx
from fastapi import Request  # the forwarder's endpoint names it in its body, so it travels with the class
from fastapi.responses import JSONResponse

from benchmarks.common import (
    MODES,
    actor_call_floor,
    bar_plot,
    deploy_ragserve,
    machine,
    make_queries,
    make_texts,
    paced_query_encode,
    parse_mode,
    raw_query_encode,
    ray_serve,
    summary_ms,
    table,
    wait_healthy,
    write_json,
)
from ragserve.deployments.builder import as_deployment
from ragserve.http.server_timing import parse_server_timing
from ragserve.testing.fake_openai import FakeOpenAI

BODY = {"model": "fake-model", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8}


def deploy_floor(port: int) -> str:
    """A Serve deployment that answers at once with a constant body: what Serve itself costs. It has
    the routes the benchmarks compare with: a chat completion (an SSE stream of three events when the
    body asks for one, found without parsing it), ``/retrieve`` and ``/health``."""
    from fastapi import FastAPI
    from fastapi.responses import Response, StreamingResponse
    from ray import serve

    api = FastAPI()
    answer = {
        "id": "x",
        "object": "chat.completion",
        "created": 0,
        "model": "floor",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }
    events = [
        b'data: {"id":"x","object":"chat.completion.chunk","created":0,"model":"floor","choices":[{"index":0,'
        + part
        + b"}]}\n\n"
        for part in (
            b'"delta":{"role":"assistant","content":""},"finish_reason":null',
            b'"delta":{"content":"hello"},"finish_reason":null',
            b'"delta":{},"finish_reason":"stop"',
        )
    ] + [b"data: [DONE]\n\n"]
    retrieved = {"query": "q", "results": [], "count": 0}

    @serve.deployment(ray_actor_options={"num_cpus": 0.1})
    @serve.ingress(api)
    class Floor:
        @api.post("/v1/chat/completions")
        async def chat(self, request: Request) -> Any:
            assert isinstance(request, Request)  # (a global the pickled class must carry for FastAPI)
            if b'"stream": true' in await request.body():

                async def sse() -> Any:
                    for event in events:
                        yield event

                return StreamingResponse(sse(), media_type="text/event-stream")
            return answer

        @api.post("/retrieve")
        async def retrieve(self) -> dict:
            return retrieved

        @api.get("/health")
        async def health(self) -> Response:
            return Response(b'{"status":"ok"}', media_type="application/json")

    serve.run(as_deployment(Floor).bind(), name="floor", route_prefix="/floor", blocking=False)
    base = f"http://127.0.0.1:{port}/floor"
    wait_healthy(base)
    return base


def deploy_forwarder(port: int, upstream: str, client: str = "aiohttp") -> str:
    """A Serve deployment that relays a chat completion to ``upstream`` and back, nothing else,
    with ``client`` (aiohttp, as ragserve's engine uses, or httpx, to see what the client costs)."""
    from fastapi import FastAPI
    from ray import serve

    api = FastAPI()

    @serve.deployment(ray_actor_options={"num_cpus": 0.1})
    @serve.ingress(api)
    class Forwarder:
        def __init__(self) -> None:
            self.session: Any = None
            # idle connections dropped before the upstream's (uvicorn: 5 s) own keep-alive timeout, so
            # a reuse never races the server closing it (an httpx.ReadError between rounds)
            self.client = httpx.AsyncClient(base_url=upstream, timeout=60, limits=httpx.Limits(keepalive_expiry=2.0))

        @api.post("/v1/chat/completions")
        async def chat(self, request: Request) -> JSONResponse:
            assert isinstance(request, Request)  # (a global the pickled class must carry for FastAPI)
            body = await request.body()
            if client == "aiohttp":
                import aiohttp

                if self.session is None:
                    self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(keepalive_timeout=2.0))
                async with self.session.post(
                    f"{upstream}/v1/chat/completions", data=body, headers={"content-type": "application/json"}
                ) as r:
                    return JSONResponse(await r.json(), status_code=r.status)
            r = await self.client.post(
                "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
            )
            return JSONResponse(r.json(), status_code=r.status_code)

        @api.get("/health")
        async def health(self) -> dict:
            return {"status": "ok"}

    serve.run(
        as_deployment(Forwarder).bind(), name=f"forward-{client}", route_prefix=f"/forward-{client}", blocking=False
    )
    base = f"http://127.0.0.1:{port}/forward-{client}"
    wait_healthy(base)
    return base


def timed_posts(url: str, n: int, warmup: int = 10, body: dict[str, Any] | None = None) -> list[float]:
    with httpx.Client(timeout=60) as client:
        for _ in range(warmup):
            client.post(url, json=body or BODY).raise_for_status()
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            r = client.post(url, json=body or BODY)
            out.append(time.perf_counter() - t0)
            r.raise_for_status()
        return out


def timed_rag_chats(base: str, questions: list[str]) -> tuple[list[float], dict[str, list[float]]]:
    """Latency of RAG chat completions, one per (distinct) question, and each Server-Timing stage;
    "outside" is what the stages do not cover."""
    lat: list[float] = []
    stages: dict[str, list[float]] = {}
    with httpx.Client(base_url=base, timeout=60) as client:
        for q in questions:
            t0 = time.perf_counter()
            r = client.post(
                "/v1/chat/completions",
                json={"index_name": "kb", "max_tokens": 8, "messages": [{"role": "user", "content": q}]},
            )
            took = time.perf_counter() - t0
            r.raise_for_status()
            assert r.headers["x-rag-mode"] == "rag", r.headers
            lat.append(took)
            timing = parse_server_timing(r.headers.get("server-timing", ""))
            for name, ms in timing.items():
                stages.setdefault(name, []).append(ms / 1000)
            stages.setdefault("outside", []).append(took - sum(timing.values()) / 1000)
    return lat, stages


def run_mode(
    high_throughput: bool,
    query_embedding: str,
    fake: FakeOpenAI,
    n: int,
    questions: list[str],
    docs: list[str],
    rounds: int,
) -> tuple[dict[str, list[float]], dict[str, list[float]], dict[str, float]]:
    """Every path measured under one Serve mode (a Ray of its own), and Ray's floor for the search
    stage in it (``actor_call_floor``, paced like the RAG chats)."""
    with ray_serve(high_throughput=high_throughput) as port:
        floor = deploy_floor(port)
        forward = deploy_forwarder(port, fake.url)
        storage = Path(f"/tmp/ragserve-bench-passthrough-{port}")
        rag = deploy_ragserve(
            port,
            "pass",
            {
                "storage_dir": str(storage),
                "num_shards": 2,
                "llm_engine": "openai",
                "llm_url": fake.url,
                "similarity_threshold": 0.0,
                "query_embedding": query_embedding,
            },
        )
        httpx.post(
            f"{rag}/index", json={"index_name": "kb", "documents": [{"text": t} for t in docs]}, timeout=600
        ).raise_for_status()
        paths = {
            "fake upstream, direct": f"{fake.url}/v1/chat/completions",
            "trivial Serve deployment (floor)": f"{floor}/v1/chat/completions",
            "trivial forwarding deployment": f"{forward}/v1/chat/completions",
            "ragserve passthrough": f"{rag}/v1/chat/completions",
        }
        samples: dict[str, list[float]] = {k: [] for k in [*paths, "ragserve RAG chat (cold)"]}
        stages: dict[str, list[float]] = {}
        timed_rag_chats(rag, [f"warm-up question {i}?" for i in range(5)])
        per_round = max(1, n // rounds)
        for r in range(rounds):  # interleave rounds so drift on a shared machine hits every path alike
            for name, url in paths.items():
                samples[name] += timed_posts(url, per_round, warmup=3)
            lat, st = timed_rag_chats(rag, questions[r * per_round : (r + 1) * per_round])
            samples["ragserve RAG chat (cold)"] += lat
            for k, v in st.items():
                stages.setdefault(k, []).extend(v)
        pause = summary_ms(samples["ragserve RAG chat (cold)"])["p50"] / 1000
        actors = actor_call_floor(min(n, 200), pause)
        shutil.rmtree(storage, ignore_errors=True)
    return samples, stages, actors


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument(
        "--modes",
        default="default,high-throughput,default",
        help=f"MODE[:QUERY_EMBEDDING] in the order run, MODE from {sorted(MODES)}",
    )
    ap.add_argument("--query-embedding", default="auto", choices=["auto", "ingress", "deployment"])
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    n = 20 if args.smoke else args.requests
    modes = ["high-throughput"] if args.smoke else args.modes.split(",")
    rounds = 5

    from ragserve.models.embeddings import LocalEmbeddingModel

    model = LocalEmbeddingModel(None, device="cpu")
    graph = LocalEmbeddingModel(None, device="cpu", threads=1, graph="optimized")  # the ingress's copy
    questions = make_queries(n + rounds, seed=11)
    docs = make_texts(60 if args.smoke else 200, sentences=4, seed=3)
    results: list[dict[str, Any]] = []
    with FakeOpenAI(answer="hello", model="fake-model", max_model_len=4096) as fake:
        for i, mode in enumerate(modes):
            high_throughput, query_embedding = parse_mode(mode, args.query_embedding)
            samples, stages, actors = run_mode(high_throughput, query_embedding, fake, n, questions, docs, rounds)
            encode = raw_query_encode(model, questions[:n])  # between the modes, so drift hits it too
            stats = {k: summary_ms(v) for k, v in samples.items()}
            pause = stats["ragserve RAG chat (cold)"]["p50"] / 1000  # as run_mode paced the actor calls
            paced = {
                "eager": paced_query_encode(model, questions[: min(n, 200)], pause),
                "optimized": paced_query_encode(graph, questions[: min(n, 200)], pause),
            }
            results.append(
                {
                    "mode": mode,
                    "run": i + 1,
                    "stats": stats,
                    "counts": {k: len(v) for k, v in samples.items()},
                    "stages_p50_ms": {k: summary_ms(v)["p50"] for k, v in stages.items()},
                    "raw_encode": encode["best"],
                    "raw_encode_by_threads": encode,
                    "paced_encode": paced,
                    "actor_call_floor": actors,
                }
            )

    rows, stage_rows, goal_rows = [], [], []
    for res in results:
        stats, label = res["stats"], f"{res['mode']} ({res['run']})"
        floor_p50 = stats["trivial Serve deployment (floor)"]["p50"]
        direct_p50 = stats["fake upstream, direct"]["p50"]
        forward_p50 = stats["trivial forwarding deployment"]["p50"]
        rows += [
            [
                label,
                k,
                res["counts"][k],
                s["p50"],
                s["p90"],
                s["p99"],
                s["p50"] - floor_p50,
                s["p50"] - direct_p50,
                s["p50"] - forward_p50,
            ]
            for k, s in stats.items()
        ]
        rag = stats["ragserve RAG chat (cold)"]["p50"]
        st = res["stages_p50_ms"]
        stage_rows.append(
            [
                label,
                rag,
                floor_p50,
                st.get("embed", 0.0),
                st.get("search", 0.0),
                st.get("fit", 0.0),
                st.get("generate", 0.0),
                st.get("outside", 0.0),
                res["raw_encode"]["p50"],
                res["paced_encode"]["eager"]["p50"],
                res["paced_encode"]["optimized"]["p50"],
                res["actor_call_floor"]["p50"],
                direct_p50,
            ]
        )
        bound = 1.5 * (floor_p50 + res["raw_encode"]["p50"])
        over_pass = stats["ragserve passthrough"]["p50"] - floor_p50
        paced_bound = 1.5 * (floor_p50 + res["paced_encode"]["eager"]["p50"])
        res["goals"] = {
            "rag_overhead_p50": rag - direct_p50,
            "rag_bound": bound,
            "rag_ratio": (rag - direct_p50) / (floor_p50 + res["raw_encode"]["p50"]),
            "rag_bound_paced": paced_bound,
            "rag_ratio_paced": (rag - direct_p50) / (floor_p50 + res["paced_encode"]["eager"]["p50"]),
            "passthrough_over_floor": over_pass,
        }
        goal_rows.append(
            [
                label,
                rag - direct_p50,
                bound,
                res["goals"]["rag_ratio"],
                "yes" if rag - direct_p50 <= bound else "no",
                res["goals"]["rag_ratio_paced"],
                "yes" if rag - direct_p50 <= paced_bound else "no",
                over_pass,
                "yes" if over_pass <= 1.0 else "no",
            ]
        )
    print(f"\n### Chat request overhead by Serve mode, sequential requests ({machine()})\n")
    print(
        table(
            [
                "mode (run)",
                "path",
                "requests",
                "p50 ms",
                "p90 ms",
                "p99 ms",
                "p50 over floor",
                "p50 over direct",
                "p50 over forwarder",
            ],
            rows,
        )
    )
    print("\n### RAG chat (cold) stages, p50 ms (Server-Timing; outside = the rest of the request)\n")
    print(
        table(
            [
                "mode (run)",
                "RAG chat",
                "floor",
                "embed",
                "search",
                "fit",
                "generate",
                "outside",
                "raw encode (in-process)",
                "paced encode, eager",
                "paced encode, ingress graph",
                "2 actor calls, paced",
                "upstream direct",
            ],
            stage_rows,
        )
    )
    print("\n### Goals (issue 13)\n")
    print(
        table(
            [
                "mode (run)",
                "RAG overhead p50 ms",
                "goal: <= 1.5 x (floor + raw encode)",
                "ratio to (floor + encode)",
                "met",
                "ratio to (floor + paced eager encode)",
                "met (paced)",
                "passthrough over floor ms",
                "<= 1 ms",
            ],
            goal_rows,
        )
    )
    labels = [f"{r['mode']} ({r['run']})" for r in results]
    bar_plot(
        args.out,
        "Chat request latency p50 by Serve mode",
        labels,
        {k: [r["stats"][k]["p50"] for r in results] for k in results[0]["stats"]},
        "ms",
    )
    payload = {"benchmark": "passthrough", "machine": machine(), "requests": n, "modes": modes, "results": results}
    write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
