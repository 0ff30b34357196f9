#!/usr/bin/env python3
"""Passthrough overhead: what ragserve's ingress and generator add to a chat completion that goes
straight to the upstream LLM, against two baselines measured in the same run:

- the fake upstream called directly (no Serve at all);
- a trivial Serve deployment returning a constant body (the platform floor: proxy + one replica);
- a trivial Serve deployment that forwards the body to the upstream with httpx and returns its
  answer (the floor of any Serve-based proxy: what is left over it is ragserve's own work).

    python -m benchmarks.bench_passthrough [--requests 300] [--smoke] [--out docs/img/passthrough.png]

The upstream is the fake OpenAI server of the tests (uvicorn, TCP_NODELAY), answering at once.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import httpx
from fastapi import Request  # the forwarder's endpoint names it in its body, so it travels with the class
from fastapi.responses import JSONResponse

from benchmarks.common import (
    bar_plot,
    deploy_ragserve,
    machine,
    ray_serve,
    summary_ms,
    table,
    wait_healthy,
    write_json,
)
from deployments.builder import as_deployment
from tests.fakes.fake_openai import FakeOpenAI

BODY = {"model": "fake-model", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8}


def deploy_floor(port: int) -> str:
    """A Serve deployment that answers a constant chat completion: what Serve itself costs."""
    from fastapi import FastAPI
    from ray import serve

    api = FastAPI()
    answer = {"id": "x", "object": "chat.completion", "created": 0, "model": "floor",
              "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}],
              "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}

    @serve.deployment(ray_actor_options={"num_cpus": 0.1})
    @serve.ingress(api)
    class Floor:
        @api.post("/v1/chat/completions")
        async def chat(self) -> dict:
            return answer

        @api.get("/health")
        async def health(self) -> dict:
            return {"status": "ok"}

    serve.run(as_deployment(Floor).bind(), name="floor", route_prefix="/floor", blocking=False)
    base = f"http://127.0.0.1:{port}/floor"
    wait_healthy(base)
    return base


def deploy_forwarder(port: int, upstream: str, client: str = "httpx") -> str:
    """A Serve deployment that relays a chat completion to ``upstream`` and back, nothing else,
    with ``client`` (httpx, as ragserve's engine uses, or aiohttp, to see what the client costs)."""
    from fastapi import FastAPI
    from ray import serve

    api = FastAPI()

    @serve.deployment(ray_actor_options={"num_cpus": 0.1})
    @serve.ingress(api)
    class Forwarder:
        def __init__(self) -> None:
            self.session: Any = None
            self.client = httpx.AsyncClient(base_url=upstream, timeout=60)

        @api.post("/v1/chat/completions")
        async def chat(self, request: Request) -> JSONResponse:
            assert isinstance(request, Request)  # (a global the pickled class must carry for FastAPI)
            body = await request.body()
            if client == "aiohttp":
                import aiohttp

                if self.session is None:
                    self.session = aiohttp.ClientSession()
                async with self.session.post(f"{upstream}/v1/chat/completions", data=body,
                                             headers={"content-type": "application/json"}) as r:
                    return JSONResponse(await r.json(), status_code=r.status)
            r = await self.client.post("/v1/chat/completions", content=body,
                                       headers={"content-type": "application/json"})
            return JSONResponse(r.json(), status_code=r.status_code)

        @api.get("/health")
        async def health(self) -> dict:
            return {"status": "ok"}

    serve.run(as_deployment(Forwarder).bind(), name=f"forward-{client}", route_prefix=f"/forward-{client}",
              blocking=False)
    base = f"http://127.0.0.1:{port}/forward-{client}"
    wait_healthy(base)
    return base


def timed_posts(url: str, n: int, warmup: int = 10) -> list[float]:
    with httpx.Client(timeout=60) as client:
        for _ in range(warmup):
            client.post(url, json=BODY).raise_for_status()
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            r = client.post(url, json=BODY)
            out.append(time.perf_counter() - t0)
            r.raise_for_status()
        return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    n = 20 if args.smoke else args.requests

    with FakeOpenAI(answer="hello", model="fake-model", max_model_len=4096) as fake, ray_serve() as port:
        floor = deploy_floor(port)
        forward = deploy_forwarder(port, fake.url)
        forward_aiohttp = deploy_forwarder(port, fake.url, "aiohttp")
        storage = Path(f"/tmp/ragserve-bench-passthrough-{port}")
        rag = deploy_ragserve(port, "pass", {"storage_dir": str(storage), "num_shards": 1, "llm_engine": "openai",
                                             "llm_url": fake.url})
        paths = {"fake upstream, direct": f"{fake.url}/v1/chat/completions",
                 "trivial Serve deployment (floor)": f"{floor}/v1/chat/completions",
                 "trivial forwarding deployment": f"{forward}/v1/chat/completions",
                 "trivial forwarding deployment (aiohttp)": f"{forward_aiohttp}/v1/chat/completions",
                 "ragserve passthrough": f"{rag}/v1/chat/completions"}
        # interleave rounds so drift on a shared machine hits every path alike
        samples: dict[str, list[float]] = {k: [] for k in paths}
        rounds = 5
        for _ in range(rounds):
            for name, url in paths.items():
                samples[name] += timed_posts(url, max(1, n // rounds), warmup=3)
    stats = {k: summary_ms(v) for k, v in samples.items()}
    floor_p50 = stats["trivial Serve deployment (floor)"]["p50"]
    direct_p50 = stats["fake upstream, direct"]["p50"]
    forward_p50 = stats["trivial forwarding deployment"]["p50"]
    rows = [[k, len(samples[k]), s["p50"], s["p90"], s["p99"], s["p50"] - floor_p50, s["p50"] - direct_p50,
             s["p50"] - forward_p50] for k, s in stats.items()]
    print(f"\n### Passthrough overhead, sequential requests ({machine()})\n")
    print(table(["path", "requests", "p50 ms", "p90 ms", "p99 ms", "p50 over floor", "p50 over direct",
                 "p50 over forwarder"], rows))
    over = stats["ragserve passthrough"]["p50"] - floor_p50
    own = stats["ragserve passthrough"]["p50"] - forward_p50
    print(f"\nragserve passthrough adds {over:.2f} ms p50 over the trivial-deployment floor (goal: <= 2 ms), "
          f"{own:.2f} ms over a trivial forwarding deployment")
    bar_plot(args.out, "Passthrough chat latency (sequential)", list(stats),
             {"p50 ms": [s["p50"] for s in stats.values()], "p99 ms": [s["p99"] for s in stats.values()]}, "ms")
    payload = {"benchmark": "passthrough", "machine": machine(), "requests": n, "stats": stats,
               "added_over_floor_p50_ms": over, "added_over_forwarder_p50_ms": own}
    write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
