#!/usr/bin/env python3
"""What the embedded engine's event loop spends on an answer's text, token by token (issue 28):
turning the generated ids into text and asking the cutter (``AnswerCutter``) what may be sent,
for answers of N tokens, with the packaged Gemma 3 270M's own tokenizer, beside the way the engine
did it before, in the same run.

- ``whole decode``: after every token, the tokenizer decodes every id generated so far (as the
  engine did before ``IncrementalDecoder``), then the cutter reads the text;
- ``incremental``: ``IncrementalDecoder.add`` (the newest token decoded beside the one before),
  then the cutter reads the text, as the engine does now.

The answer is a fixed text (prose, numbers, code, emoji, CJK) tokenized and cut to N tokens; the
cutter has the client's ``--stops`` stop sequences of ``--stop-chars`` characters each (none of
them in the text, so the whole answer is read). No model runs: this is the per-token text work
alone. It runs on the event loop, where every other request of the process waits for it (the model's
steps run on the engine's own thread).

    python -m benchmarks.bench_detokenize [--tokens 1000,4000,8000] [--stops 4] [--stop-chars 64]
                                          [--smoke] [--json out.json] [--out detok.png]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks.common import MODEL_CACHE, bar_plot, machine, table, write_json
from ragserve.models.detokenize import IncrementalDecoder
from ragserve.models.stops import AnswerCutter
from ragserve.models.transformers_engine import TransformersEngine

ANSWER = (
    "The pump on line 3 is serviced every 30 minutes; its seals were replaced in May (part 4417-B). "
    "To check the pressure, run `pumpctl status --line 3` and compare it with the manual's table: "
    "1.2 bar idle, 3.4 bar under load. Émoji 😀 and 中文 appear in the operators' notes.\n"
)


def timed(ids: list[int], decode: Callable[[Sequence[int]], str], stops: list[str], whole: bool) -> float:
    """Thread CPU seconds for the text work of an answer of ``ids``, token by token."""
    cutter = AnswerCutter(stops)
    decoder = IncrementalDecoder(decode)
    t0 = time.thread_time()
    for i, token in enumerate(ids):
        cutter.feed(decode(ids[: i + 1]) if whole else decoder.add(token))
    cutter.finish()
    spent = time.thread_time() - t0
    if cutter.text != decode(ids):
        raise AssertionError("the cutter's text is not the answer's")
    return spent


def run(lengths: list[int], n_stops: int, stop_chars: int) -> dict[str, Any]:
    engine = TransformersEngine(None, MODEL_CACHE)
    asyncio.run(engine.start())
    try:
        tokenizer = engine._tokenizer
        assert tokenizer is not None

        def decode(ids: Sequence[int]) -> str:
            return str(tokenizer.decode(list(ids), skip_special_tokens=True))

        one = list(tokenizer(ANSWER, add_special_tokens=False).input_ids)
        ids = (one * (max(lengths) // len(one) + 1))[: max(lengths)]
        stops = [chr(0x2460 + i) * stop_chars for i in range(n_stops)]  # circled digits: never in the answer
        timed(ids[:64], decode, stops, whole=True)  # warm-up
        rows = []
        for n in lengths:
            whole = timed(ids[:n], decode, stops, whole=True)
            incremental = timed(ids[:n], decode, stops, whole=False)
            rows.append({"tokens": n, "whole_decode_s": whole, "incremental_s": incremental})
        return {"machine": machine(), "stops": n_stops, "stop_chars": stop_chars, "rows": rows}
    finally:
        asyncio.run(engine.stop())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", default="1000,4000,8000", help="answer lengths in tokens, comma-separated")
    ap.add_argument("--stops", type=int, default=4, help="the client's stop sequences")
    ap.add_argument("--stop-chars", type=int, default=64, help="characters of each stop sequence")
    ap.add_argument("--smoke", action="store_true", help="short answers, to check the benchmark runs")
    ap.add_argument("--json", default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    lengths = [50, 200] if args.smoke else [int(n) for n in args.tokens.split(",")]
    result = run(lengths, args.stops, args.stop_chars)
    rows = [
        [
            r["tokens"],
            r["whole_decode_s"],
            r["whole_decode_s"] / r["tokens"] * 1000,
            r["incremental_s"],
            r["incremental_s"] / r["tokens"] * 1000,
            r["whole_decode_s"] / max(r["incremental_s"], 1e-9),
        ]
        for r in result["rows"]
    ]
    print(f"machine: {result['machine']}")
    print(f"{args.stops} stop sequences of {args.stop_chars} characters; thread CPU of the text work alone")
    print(
        table(
            [
                "answer tokens",
                "whole decode s",
                "ms a token",
                "incremental s",
                "ms a token",
                "× incremental",
            ],
            rows,
        )
    )
    write_json(args.json, result)
    bar_plot(
        args.out,
        "Text work of an answer, token by token (Gemma's tokenizer): ms a token",
        [f"{r['tokens']} tokens" for r in result["rows"]],
        {
            "whole decode each token": [r["whole_decode_s"] / r["tokens"] * 1000 for r in result["rows"]],
            "incremental": [r["incremental_s"] / r["tokens"] * 1000 for r in result["rows"]],
        },
        "ms a token",
        log=True,
    )


if __name__ == "__main__":
    main()
