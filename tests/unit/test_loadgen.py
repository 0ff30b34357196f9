"""The load generator of ``bench_load`` against a small real server: closed and open loops count
what the server completed, cold queries differ per request and warm ones repeat, a stream's first
text is timed, and errors are counted by status, never as successes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from benchmarks.loadgen import LoadSpec, run
from ragserve.testing.live import serve


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, list[Any]]]:
    seen: list[Any] = []

    async def echo(request: Request) -> Response:
        body = json.loads(await request.body())
        seen.append(body)
        if body.get("fail"):
            return JSONResponse({"error": "no"}, status_code=503)
        if body.get("stream"):

            async def events() -> Any:
                yield b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n'
                await asyncio.sleep(0.02)
                yield b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n'
                yield b"data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")
        return JSONResponse({"ok": True})

    with serve(Starlette(routes=[Route("/echo", echo, methods=["POST"])])) as base:
        yield base, seen


def test_a_closed_loop_counts_completions_in_its_window_and_cold_queries_differ(server) -> None:
    base, seen = server
    seen.clear()
    spec = LoadSpec(
        url=f"{base}/echo",
        body={"q": "{q}", "nested": ["{q}"]},
        queries=["alpha"],
        concurrency=3,
        duration_s=1.5,
    )
    out = asyncio.run(run(spec))
    # a few at least, even on a machine the other tests keep busy (a 0.6 s window once counted none)
    assert out["ok"] >= 3 and out["errors"] == {} and out["rps"] == pytest.approx(out["ok"] / 1.5)
    assert out["p50_ms"] <= out["p99_ms"]
    texts = [b["q"] for b in seen]
    assert len(set(texts)) == len(texts) and all(t.startswith("alpha ") for t in texts)  # every one different
    assert all(b["nested"] == [b["q"]] for b in seen)


def test_warm_queries_repeat_the_pool(server) -> None:
    base, seen = server
    seen.clear()
    spec = LoadSpec(
        url=f"{base}/echo", body={"q": "{q}"}, queries=["a", "b"], query_mode="warm", concurrency=1, duration_s=0.3
    )
    asyncio.run(run(spec))
    assert {b["q"] for b in seen} == {"a", "b"} and len(seen) > 4


def test_an_open_loop_sends_at_its_rate_and_errors_are_not_successes(server) -> None:
    base, _ = server
    spec = LoadSpec(url=f"{base}/echo", body={"fail": True}, mode="open", rate=50, duration_s=1.0, warmup_s=0.2)
    out = asyncio.run(run(spec))
    assert out["ok"] == 0 and out["rps"] == 0 and 25 <= out["errors"]["503"] <= 90  # Poisson around 50
    assert out["dropped"] == 0 and out["concurrency"] is None and out["rate"] == 50


def test_a_stream_times_its_first_text(server) -> None:
    base, _ = server
    spec = LoadSpec(url=f"{base}/echo", body={"stream": True}, stream=True, concurrency=2, duration_s=0.5)
    out = asyncio.run(run(spec))
    assert out["ok"] > 0 and 20 <= out["ttft_p50_ms"] <= out["p99_ms"]  # the text comes after the 20 ms pause


def test_a_refused_connection_is_an_error_by_name() -> None:
    spec = LoadSpec(url="http://127.0.0.1:9/echo", body={}, concurrency=1, duration_s=0.2, warmup_s=0.0)
    out = asyncio.run(run(spec))
    assert out["ok"] == 0 and "ClientConnectorError" in out["errors"]


@pytest.mark.parametrize(
    "bad", [{"mode": "sideways"}, {"query_mode": "hot"}, {"concurrency": 0}, {"mode": "open"}, {"queries": []}]
)
def test_a_spec_that_cannot_run_is_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        LoadSpec(url="http://x", **bad)


def test_cpu_by_process_charges_a_phase_only_with_what_each_process_spent_in_it() -> None:
    """``cpu_delta`` goes by process: one whose command line could not be read in one snapshot keeps
    the role the other gave it, one started during the phase counts all its CPU, and one that ran
    before but was not read then is left out (a total over whatever processes one snapshot named
    once charged a phase with an embedder's whole ingestion)."""
    from benchmarks.common import CpuSnapshot, cpu_delta, cpu_snapshot

    t = 1_000.0
    before = CpuSnapshot(
        t,
        {
            (10, t - 50): ("ingress replica", 5.0),
            (11, t - 50): (None, 7.0),  # the embedder, its command line unread this time
            (12, t - 50): ("shard actors", 1.0),
        },
    )
    after = CpuSnapshot(
        t + 10,
        {
            (10, t - 50): ("ingress replica", 6.5),
            (11, t - 50): ("embedder replica", 7.25),
            (12, t - 50): (None, 1.5),
            (13, t + 2): ("shard actors", 0.75),  # started during the phase
            (14, t - 40): ("embedder replica", 300.0),  # ran before, not read then: unknown share
            (15, t - 40): (None, 9.0),  # not the application's
        },
    )
    assert cpu_delta(before, after) == {"ingress replica": 1.5, "embedder replica": 0.25, "shard actors": 1.25}
    here = cpu_snapshot()  # a real snapshot names this process
    assert any(role and role.startswith("benchmark process") for role, _ in here.procs.values())
