#!/usr/bin/env python3
"""Continuous batching in the embedded CPU engine (issue 28): aggregate decode tokens/s and time to
first token with 1, 2, 4 and 8 concurrent streams on the real packaged Gemma 3 270M, in-process (no
Ray), beside the path the engine took before batching, measured in the same run.

- ``old path``: ``model.generate`` for one request at a time, greedy, with a token streamer and a
  cancellation criterion, as the engine ran it before batching (``old_generate`` below);
- ``batched, N streams``: N requests submitted together to the engine's own batch loop (the one
  ``chat`` and ``chat_stream`` feed, with the engine's ``max_batch`` and ``prefill_chunk``), greedy.

Every stream runs to exactly ``--max-tokens``: the benchmark drives the engine at the token level,
with no end-of-sequence token and no answer rule (on the old path: ``eos_token_id=[]``), so no stream
ends early and every variant decodes the same number of tokens. Prompts are the completion-format
prompts of distinct questions (about 40 tokens each); each variant is run ``--rounds`` times
interleaved, and its best round kept (on two shared cores another process's work only ever slows a
round).

Figures: ``decode tok/s``, tokens after each stream's first divided by the time from the first
stream's first token to the last stream's last (what the shared decode steps deliver);
``end to end tok/s``, all tokens over the time from submission to the last token (prompt reading
included); ``TTFT``, each stream's time from submission to its first token (later streams wait for
the earlier prompts to be read).

    python -m benchmarks.bench_batching [--streams 1,2,4,8] [--max-tokens 64] [--rounds 2]
                                        [--max-batch N] [--prefill-chunk N] [--torch-threads N]
                                        [--smoke] [--json out.json] [--out batching.png]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time
from typing import Any

from benchmarks.common import MODEL_CACHE, bar_plot, machine, table, write_json
from ragserve.models import batching
from ragserve.models.transformers_engine import TransformersEngine

QUESTIONS = [
    "What does the pump on line three need after a repair?",
    "Which seals were replaced in May, and why?",
    "How is the pressure checked against the manual?",
    "Who restarts the ingress after a node failure?",
    "When does the scheduler compact the maintenance log?",
    "Where are the nightly backups of the vector index kept?",
    "Why does the autoscaler throttle the request queue?",
    "What limits does the manual list for each model of pump?",
]
WAIT_S = 600


class Clock:
    """A sink that notes when each token came (on the loop's thread)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.error: BaseException | None = None
        self.ended = threading.Event()

    def token(self, token_id: int) -> None:
        self.times.append(time.perf_counter())

    def end(self, error: BaseException | None) -> None:
        self.error = error
        self.ended.set()


def old_generate(engine: TransformersEngine, prompt: list[int], max_new: int) -> tuple[float, list[float]]:
    """One request as the engine served it before batching: ``generate`` with a streamer that notes
    each token and a criterion that would stop it when its client left (never here). Returns when
    it started and when each token came."""
    import torch
    import transformers
    from transformers.generation.streamers import BaseStreamer

    cancel = threading.Event()

    class Cancel(transformers.StoppingCriteria):
        def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
            return torch.full((input_ids.shape[0],), cancel.is_set(), dtype=torch.bool)

    class Streamer(BaseStreamer):
        def __init__(self) -> None:
            self.times: list[float] = []
            self.prompt_seen = False

        def put(self, value: Any) -> None:
            if not self.prompt_seen:  # the first put is the prompt
                self.prompt_seen = True
                return
            self.times.append(time.perf_counter())

        def end(self) -> None:
            pass

    streamer = Streamer()
    ids = torch.tensor([prompt])
    started = time.perf_counter()
    with torch.inference_mode():
        engine._model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            streamer=streamer,
            stopping_criteria=transformers.StoppingCriteriaList([Cancel()]),
            max_new_tokens=max_new,
            eos_token_id=[],  # never ends early: every variant decodes max_new tokens
            pad_token_id=0,
            do_sample=False,
            temperature=None,
            top_p=None,
            top_k=None,
        )
    return started, streamer.times


def batched(engine: TransformersEngine, prompts: list[list[int]], max_new: int) -> tuple[float, list[list[float]]]:
    """``prompts`` submitted together to the engine's batch loop, greedy, no end-of-sequence token."""
    loop = engine._batcher
    assert loop is not None
    clocks = [Clock() for _ in prompts]
    started = time.perf_counter()
    for prompt, clock in zip(prompts, clocks, strict=True):
        loop.submit(batching.Sequence(prompt=prompt, max_new_tokens=max_new, sink=clock))
    for clock in clocks:
        if not clock.ended.wait(WAIT_S) or clock.error is not None:
            raise RuntimeError(f"a stream failed or hung: {clock.error!r}")
        if len(clock.times) != max_new:
            raise RuntimeError(f"a stream decoded {len(clock.times)} tokens, not {max_new}")
    return started, [c.times for c in clocks]


def figures(started: float, streams: list[list[float]]) -> dict[str, Any]:
    first = min(times[0] for times in streams)
    last = max(times[-1] for times in streams)
    decoded = sum(len(times) - 1 for times in streams)
    ttft = [times[0] - started for times in streams]
    return {
        "streams": len(streams),
        "tokens": sum(len(times) for times in streams),
        "decode_tok_s": decoded / max(last - first, 1e-9),
        "end_to_end_tok_s": sum(len(times) for times in streams) / max(last - started, 1e-9),
        "ttft_s": ttft,
        "ttft_p50_s": statistics.median(ttft),
        "ttft_max_s": max(ttft),
        "seconds": last - started,
    }


def run(streams: list[int], max_new: int, rounds: int, engine_args: dict[str, Any]) -> dict[str, Any]:
    engine = TransformersEngine(None, MODEL_CACHE, engine_args=engine_args)
    asyncio.run(engine.start())
    try:
        assert engine._counter is not None and engine._tokenizer is not None
        prompts = [
            list(
                engine._tokenizer(
                    engine._counter.render([{"role": "user", "content": q}]), add_special_tokens=False
                ).input_ids
            )
            for q in QUESTIONS
        ]
        need = max(streams)
        while len(prompts) < need:
            prompts += prompts[: need - len(prompts)]
        # warm-up: both paths pay their one-off costs before anything is timed
        old_generate(engine, prompts[0], 4)
        batched(engine, prompts[:2], 4)
        results: dict[str, list[dict[str, Any]]] = {"old path": []}
        for n in streams:
            results[f"batched, {n}"] = []
        for _ in range(rounds):
            started, times = old_generate(engine, prompts[0], max_new)
            results["old path"].append(figures(started, [times]))
            for n in streams:
                results[f"batched, {n}"].append(figures(*batched(engine, prompts[:n], max_new)))
        best = {name: max(runs, key=lambda r: r["decode_tok_s"]) for name, runs in results.items()}
        return {
            "machine": machine(),
            "max_tokens": max_new,
            "rounds": rounds,
            "engine": {
                "max_batch": engine.max_batch,
                "prefill_chunk": engine.prefill_chunk,
                "torch_threads": _torch_threads(),
                "prompt_tokens": [len(p) for p in prompts[:need]],
                "prefill_tokens_per_s": engine.prefill_tokens_per_s(),
            },
            "best": best,
            "rounds_all": results,
        }
    finally:
        asyncio.run(engine.stop())


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", default="1,2,4,8", help="concurrent stream counts, comma-separated")
    ap.add_argument("--max-tokens", type=int, default=64, help="tokens each stream decodes")
    ap.add_argument("--rounds", type=int, default=2, help="runs of every variant, interleaved; the best is kept")
    ap.add_argument("--max-batch", type=int, default=None, help="the engine's max_batch (default: its own)")
    ap.add_argument("--prefill-chunk", type=int, default=None, help="the engine's prefill_chunk (default: its own)")
    ap.add_argument(
        "--torch-threads", type=int, default=None, help="the engine's torch_threads (default: usable cores)"
    )
    ap.add_argument("--smoke", action="store_true", help="1 and 2 streams of a few tokens, to check the benchmark runs")
    ap.add_argument("--json", default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    streams = [1, 2] if args.smoke else [int(s) for s in args.streams.split(",")]
    max_new = 4 if args.smoke else args.max_tokens
    rounds = 1 if args.smoke else args.rounds
    engine_args = {
        key: value
        for key, value in (
            ("max_batch", args.max_batch),
            ("prefill_chunk", args.prefill_chunk),
            ("torch_threads", args.torch_threads),
        )
        if value is not None
    }
    result = run(streams, max_new, rounds, engine_args)
    best = result["best"]
    one_old = best["old path"]["decode_tok_s"]
    one_new = best["batched, 1"]["decode_tok_s"] if "batched, 1" in best else float("nan")
    rows = [
        [
            name,
            r["streams"],
            r["decode_tok_s"],
            r["decode_tok_s"] / one_new,
            r["end_to_end_tok_s"],
            r["ttft_p50_s"] * 1000,
            r["ttft_max_s"] * 1000,
        ]
        for name, r in best.items()
    ]
    print(f"machine: {result['machine']}")
    print(f"engine: {result['engine']}; {max_new} tokens a stream, best of {rounds} round(s)")
    print(
        table(
            [
                "variant",
                "streams",
                "decode tok/s",
                "× 1 batched stream",
                "end to end tok/s",
                "TTFT p50 ms",
                "TTFT max ms",
            ],
            rows,
        )
    )
    print(f"one stream, batched vs old path: {one_new / one_old:.2f}×")
    write_json(args.json, result)
    names = list(best)
    bar_plot(
        args.out,
        f"Embedded Gemma 3 270M, {max_new} tokens a stream: aggregate decode tokens/s",
        names,
        {"decode tok/s": [best[n]["decode_tok_s"] for n in names]},
        "tokens/s",
    )


if __name__ == "__main__":
    main()
