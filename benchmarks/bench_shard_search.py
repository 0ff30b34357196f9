#!/usr/bin/env python3
"""One shard's ``search_candidates`` in this process: dense against hybrid, for short questions and
for long ones, optionally beside another version of the search code in the same run.

    python -m benchmarks.bench_shard_search [--rows 50000] [--queries 200] [--repeat 2]
        [--baseline-src PATH/TO/ragserve/store/search.py] [--storage DIR]

The shard holds ``--rows`` of the benchmark's sentence-like chunks (``make_texts``, random unit
vectors: only the search's own work is measured, not the embedding), built once under
``--storage``. Questions: the benchmark's short ones (``make_queries``) and ones of three
benchmark sentences (about 20 content words, each matching thousands of chunks: the worst case for
weighing a long question's terms). Each question runs dense then hybrid, in every version given,
interleaved, so that drift falls on all alike; what is timed is the thread's CPU time (other
processes' load counts little). ``--baseline-src`` loads another version's ``search.py`` (e.g. from
a worktree of an older commit) beside this one's: the rest of the store is this version's.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from pathlib import Path
from types import ModuleType

import numpy as np

from benchmarks.common import make_queries, make_texts, table
from ragserve.store import ChunkWrite, DocumentWrite, Shard
from ragserve.store import search as current

INDEX = "bench"


def build(path: Path, rows: int) -> Shard:
    new = not path.exists()
    shard = Shard(path)
    if new:
        rng = np.random.default_rng(0)
        texts = make_texts(rows, sentences=3, seed=7)
        for start in range(0, rows, 2000):
            docs = []
            for i, text in enumerate(texts[start : start + 2000], start=start):
                v = rng.normal(size=384).astype(np.float32)
                docs.append(
                    DocumentWrite(f"d{i}", text, {}, f"h{i}", [ChunkWrite(f"d{i}-0", 0, text, v / np.linalg.norm(v))])
                )
            shard.upsert_documents(INDEX, docs)
    return shard


def load_search(src: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("baseline_search", src)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=50_000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--baseline-src", default=None, help="another version's ragserve/store/search.py")
    ap.add_argument("--baseline-min-match", type=float, default=0.3, help="its lexical_min_match default")
    ap.add_argument("--storage", default="data/bench-cache/shard-search")
    args = ap.parse_args(argv)
    shard = build(Path(args.storage) / f"rows-{args.rows}", args.rows)
    versions: list[tuple[str, ModuleType, float]] = [("now", current, 0.0)]
    if args.baseline_src:
        versions.insert(0, ("baseline", load_search(args.baseline_src), args.baseline_min_match))
    rng = np.random.default_rng(1)
    vectors = rng.normal(size=(args.queries, 384)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    shapes = {"short": make_queries(args.queries), "3 sentences": make_texts(args.queries, 3, seed=99)}
    rows = []
    try:
        for run in range(1, args.repeat + 1):
            for shape, questions in shapes.items():
                ms: dict[tuple[str, str], list[float]] = {}
                for text, vector in zip(questions, vectors, strict=True):
                    for name, module, min_match in versions:
                        for mode in ("dense", "hybrid"):
                            t0 = time.thread_time()
                            module.candidates(
                                shard._readers,
                                shard._mirror,
                                INDEX,
                                vector,
                                text,
                                20,
                                mode=mode,
                                min_match=min_match,
                                max_postings=2000,
                            )
                            ms.setdefault((name, mode), []).append(1000 * (time.thread_time() - t0))
                for name, _, _ in versions:
                    dense, hybrid = (statistics.median(ms[(name, m)]) for m in ("dense", "hybrid"))
                    rows.append([run, shape, name, dense, hybrid, hybrid - dense])
    finally:
        shard.close()
    print(f"\n### One shard's search_candidates, {args.rows:,} rows, 20 candidates a list, CPU ms p50\n")
    print(table(["run", "questions", "code", "dense", "hybrid", "hybrid - dense"], rows))


if __name__ == "__main__":
    main()
