#!/usr/bin/env python3
"""Full garbage collections in a serving process while one large prose document is indexed: how
many, how long each held the process (its event loop with it), and how many objects each walked,
with the startup heap frozen (``ragserve.heap.settle``, the default) and without
(``RAGSERVE_FREEZE_HEAP=0``), the two runs one after the other on the same machine.

    python -m benchmarks.bench_gc_pause [--chars 1000000] [--rounds 1] [--smoke] [--json out.json]

The in-process application (``ragserve.testing.serve_process``) runs in a process of its own with a
``gc.callbacks`` recorder (``--serve``, this module); after the document's ``POST /index`` answers,
the recorder's pauses are read back (SIGUSR1 writes them to a file). docs/benchmarks.md, "Full
collections".
"""

from __future__ import annotations

import argparse
import gc
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

from benchmarks.bench_jobs import stop_server
from benchmarks.bench_large_document import prose
from benchmarks.common import bar_plot, machine, table, write_json
from ragserve.testing.live import free_port


def serve(storage: str, port: str, out: str) -> None:
    """The server, with every generation-2 collection's pause recorded (after it is ready only)."""
    pauses: list[dict[str, float]] = []
    started: dict[str, float] = {}
    ready = threading.Event()

    def record(phase: str, info: dict[str, Any]) -> None:
        if info["generation"] != 2 or not ready.is_set():
            return
        if phase == "start":
            started["t"] = time.perf_counter()
            started["objects"] = sum(len(gc.get_objects(g)) for g in range(3))
        elif "t" in started:
            ms = (time.perf_counter() - started.pop("t")) * 1000
            pauses.append({"ms": ms, "walked": started.pop("objects"), "collected": info["collected"]})

    def dump(signum: int, frame: Any) -> None:
        Path(out).write_text(json.dumps(pauses))

    def mark_ready(signum: int, frame: Any) -> None:
        ready.set()

    gc.callbacks.append(record)
    signal.signal(signal.SIGUSR1, dump)
    signal.signal(signal.SIGUSR2, mark_ready)
    from ragserve.testing import serve_process

    serve_process.main([storage, port])


def run(text: str, freeze: bool) -> dict[str, Any]:
    storage, out = tempfile.mkdtemp(prefix="bench-gc-"), tempfile.mktemp(prefix="bench-gc-", suffix=".json")
    port = free_port()
    env = {**os.environ, "RAGSERVE_FREEZE_HEAP": "1" if freeze else "0"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.bench_gc_pause", "--serve", storage, str(port), out],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGUSR2)  # record from here on
        t0 = time.perf_counter()
        r = httpx.post(f"{base}/index", json={"index_name": "large", "documents": [{"text": text}]}, timeout=3600)
        seconds = time.perf_counter() - t0
        os.kill(proc.pid, signal.SIGUSR1)
        for _ in range(100):
            if Path(out).exists():
                break
            time.sleep(0.1)
        pauses = json.loads(Path(out).read_text())
    finally:
        stop_server(proc)
    return {"freeze": freeze, "status": r.status_code, "seconds": seconds, "pauses": pauses}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve"]:
        serve(*argv[1:4])
        return {}
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--chars", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=1, help="frozen and not, alternated, this many times each")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--out", default=None, help="a plot of the longest pause in each run")
    args = ap.parse_args(argv)
    if args.smoke:
        args.chars = 5_000
    text = prose(args.chars)
    runs = [run(text, freeze) for _ in range(args.rounds) for freeze in (False, True)]
    rows = []
    for r in runs:
        ms = [p["ms"] for p in r["pauses"]]
        walked = [p["walked"] for p in r["pauses"]]
        rows.append(
            [
                "frozen (default)" if r["freeze"] else "not frozen",
                r["status"],
                round(r["seconds"], 1),
                len(ms),
                round(max(ms), 1) if ms else 0,
                round(sum(ms), 1),
                max(walked) if walked else 0,
            ]
        )
    print(f"\n### Full collections while one {args.chars:,}-character prose document is indexed ({machine()})\n")
    headers = ["startup heap", "status", "seconds", "full collections", "longest ms", "all ms", "most objects walked"]
    print(table(headers, rows))
    labels = [f"{row[0]} #{i + 1}" for i, row in enumerate(rows)]
    bar_plot(args.out, "longest full collection while indexing (ms)", labels, {"longest": [r[4] for r in rows]}, "ms")
    payload = {"benchmark": "gc_pause", "machine": machine(), "chars": args.chars, "runs": runs}
    write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
