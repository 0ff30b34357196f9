#!/usr/bin/env python3
"""A small HTTP load generator: closed loop (C workers sending back to back) or open loop (Poisson
arrivals at a fixed rate), one asyncio event loop and one aiohttp session in its own process.

    python -m benchmarks.loadgen SPEC_JSON      # prints one JSON result line

``bench_load`` runs it in a subprocess per measurement, so the client never shares a process (or
its GIL) with the server, the fake upstream or another client, and every server and the platform
floor is measured with the same client. The spec (``LoadSpec``):

- ``url``, ``method`` (GET/POST), ``body`` (JSON; every string ``{q}`` in it is replaced by a query),
  ``queries`` (their pool) and ``query_mode``: ``cold`` makes every request's query different (the
  pool's query with a request number, so no cache helps), ``warm`` cycles through the pool (the
  caches hold them after a round);
- ``mode`` ``closed`` with ``concurrency`` workers, or ``open`` with ``rate`` requests/s (exponential
  gaps; a latency counts from the request's scheduled start, so a server that falls behind is charged
  for the wait, not hidden by the client waiting: no coordinated omission; at most ``max_outstanding``
  in flight, arrivals beyond are counted ``dropped``);
- ``duration_s`` measured after ``warmup_s`` (requests that start in the warm-up are not counted);
- ``stream``: read the SSE body and record the time to the first ``data:`` event that carries text.

The result: requests sent and completed in the window, ``rps`` (successes per second), latency
p50/p90/p99 and mean (ms), TTFT percentiles for streams, errors by status (or exception name).
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

#: An SSE event that carries answer text (a content delta) rather than the stream's framing.
_CONTENT_MARK = b'"content":"'


@dataclass
class LoadSpec:
    url: str
    method: str = "POST"
    body: Any = None
    queries: list[str] = field(default_factory=lambda: ["q"])
    query_mode: str = "cold"  # cold | warm
    mode: str = "closed"  # closed | open
    concurrency: int = 1
    rate: float = 0.0
    duration_s: float = 10.0
    warmup_s: float = 1.0
    stream: bool = False
    timeout_s: float = 60.0
    max_outstanding: int = 2048
    headers: dict[str, str] = field(default_factory=dict)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.mode not in ("closed", "open") or self.query_mode not in ("cold", "warm"):
            raise ValueError(f"mode must be closed|open and query_mode cold|warm, not {self.mode}/{self.query_mode}")
        if self.mode == "closed" and self.concurrency < 1:
            raise ValueError("a closed loop needs concurrency >= 1")
        if self.mode == "open" and not self.rate > 0:
            raise ValueError("an open loop needs rate > 0")
        if not self.queries:
            raise ValueError("queries must not be empty")


def _fill(template: Any, query: str) -> Any:
    if isinstance(template, str):
        return template.replace("{q}", query)
    if isinstance(template, dict):
        return {k: _fill(v, query) for k, v in template.items()}
    if isinstance(template, list):
        return [_fill(v, query) for v in template]
    return template


class _Bodies:
    """The i-th request's body, pre-encoded (the client's own cost stays small and equal for all)."""

    def __init__(self, spec: LoadSpec):
        self.spec = spec
        self.i = 0

    def next(self) -> bytes | None:
        if self.spec.body is None:
            return None
        i, self.i = self.i, self.i + 1
        pool = self.spec.queries
        query = pool[i % len(pool)]
        if self.spec.query_mode == "cold":
            query = f"{query} {i}"
        return json.dumps(_fill(self.spec.body, query)).encode()


def _has_text(event: bytes) -> bool:
    """Whether an SSE line carries answer text: a ``content`` that is not empty (the first chunk
    of an OpenAI stream has the role and an empty content)."""
    at = event.find(_CONTENT_MARK)
    return at >= 0 and event[at + len(_CONTENT_MARK) : at + len(_CONTENT_MARK) + 1] not in (b'"', b"")


@dataclass
class _Sample:
    start: float  # scheduled start (open loop) or send time (closed loop), on the loop's clock
    end: float
    status: str  # "200", "503", "ClientConnectorError", ...
    ttft: float | None = None


async def _one(session: Any, spec: LoadSpec, body: bytes | None, scheduled: float) -> _Sample:
    import aiohttp

    headers = {"content-type": "application/json", **spec.headers} if body is not None else spec.headers
    ttft = None
    try:
        async with session.request(spec.method, spec.url, data=body, headers=headers) as r:
            if spec.stream and r.status == 200:
                async for line in r.content:
                    if ttft is None and line.startswith(b"data:") and _has_text(line):
                        ttft = time.perf_counter() - scheduled
            else:
                await r.read()
            status = str(r.status)
    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
        status = type(e).__name__
    return _Sample(scheduled, time.perf_counter(), status, ttft)


async def run(spec: LoadSpec) -> dict[str, Any]:
    import aiohttp

    bodies = _Bodies(spec)
    samples: list[_Sample] = []
    dropped = 0
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=spec.timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        t0 = time.perf_counter()
        window = (t0 + spec.warmup_s, t0 + spec.warmup_s + spec.duration_s)
        if spec.mode == "closed":

            async def worker() -> None:
                while time.perf_counter() < window[1]:
                    samples.append(await _one(session, spec, bodies.next(), time.perf_counter()))

            await asyncio.gather(*(worker() for _ in range(spec.concurrency)))
        else:
            rng = random.Random(spec.seed)
            tasks: set[asyncio.Task[None]] = set()

            async def fire(scheduled: float) -> None:
                samples.append(await _one(session, spec, bodies.next(), scheduled))

            at = t0
            while True:
                at += rng.expovariate(spec.rate)
                if at >= window[1]:
                    break
                delay = at - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                if len(tasks) >= spec.max_outstanding:
                    dropped += at >= window[0]
                    continue
                task = asyncio.create_task(fire(at))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if tasks:
                await asyncio.gather(*tasks)
    return summarise(spec, samples, window, dropped)


def _pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(p / 100 * len(s) + 0.5) - 1))] if s else float("nan")


def summarise(spec: LoadSpec, samples: list[_Sample], window: tuple[float, float], dropped: int) -> dict[str, Any]:
    """What counts: requests that started within the window (closed loop: ended within it too, so
    the rate is what the server completed in that time)."""
    start, end = window
    counted = [s for s in samples if start <= s.start < end and (spec.mode == "open" or s.end <= end)]
    ok = [s for s in counted if s.status == "200"]
    errors: dict[str, int] = {}
    for s in counted:
        if s.status != "200":
            errors[s.status] = errors.get(s.status, 0) + 1
    lat = [(s.end - s.start) * 1000 for s in ok]
    ttft = [s.ttft * 1000 for s in ok if s.ttft is not None]
    out: dict[str, Any] = {
        "mode": spec.mode,
        "concurrency": spec.concurrency if spec.mode == "closed" else None,
        "rate": spec.rate if spec.mode == "open" else None,
        "requests": len(counted),
        "ok": len(ok),
        "rps": len(ok) / (end - start),
        "p50_ms": _pct(lat, 50),
        "p90_ms": _pct(lat, 90),
        "p99_ms": _pct(lat, 99),
        "mean_ms": sum(lat) / len(lat) if lat else float("nan"),
        "errors": errors,
        "dropped": dropped,
    }
    if spec.stream:
        out["ttft_p50_ms"] = _pct(ttft, 50)
        out["ttft_p99_ms"] = _pct(ttft, 99)
    return out


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        raise SystemExit("usage: python -m benchmarks.loadgen SPEC_JSON")
    spec = LoadSpec(**json.loads(args[0]))
    print(json.dumps(asyncio.run(run(spec))), flush=True)


def run_in_process(spec: LoadSpec) -> dict[str, Any]:
    """``spec`` run by a client process of its own (``python -m benchmarks.loadgen``); its result."""
    import subprocess

    from benchmarks.common import REPO

    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.loadgen", json.dumps(asdict(spec))],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=spec.warmup_s + spec.duration_s + spec.timeout_s + 60,
    )
    if done.returncode != 0:
        raise RuntimeError(f"loadgen failed ({done.returncode}): {done.stderr[-2000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


if __name__ == "__main__":
    main()
