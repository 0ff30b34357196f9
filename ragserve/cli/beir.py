"""``ragserve-eval``: retrieval quality of a running server on a BEIR-format dataset.

    ragserve-eval DATA_DIR [--url http://127.0.0.1:8000] [--modes hybrid,dense,lexical] [--out results.json]

``DATA_DIR`` holds BEIR's files: ``corpus.jsonl`` (``_id``, ``title``, ``text``), ``queries.jsonl``
(``_id``, ``text``) and ``qrels/test.tsv`` (``query-id``, ``corpus-id``, ``score``, with a header).
The corpus is indexed through the HTTP API into a fresh index (dropped afterwards unless
``--keep-index``; an ``--index`` that already exists is refused, so eval never writes to or drops
an index it did not create), then every query with judgements is sent to ``/retrieve`` in each mode; a
document ranks where its best chunk does. Printed per mode: nDCG@10, recall@10, recall@100, MRR@10
and the p50 latency of ``/retrieve`` as the client saw it; ``--out`` writes the same as JSON.

Why over HTTP: what is measured is what clients get (chunking, embedding, the shards, fusion), not a
re-implementation beside the server.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from ragserve.api.documents import validate_index_name
from ragserve.cli.args import at_least, positive_seconds
from ragserve.cli.client import default_url

MODES = ("hybrid", "dense", "lexical")
DEPTH = 100  # documents ranked per query: recall@100 needs them


@dataclass
class Dataset:
    corpus: dict[str, dict[str, str]]
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]  # query id -> {doc id: relevance}

    @classmethod
    def load(cls, root: str | Path, split: str = "test") -> Dataset:
        """A BEIR dataset folder; only queries judged in ``split`` are kept."""
        root = Path(root)
        corpus = {
            str(d["_id"]): {"title": d.get("title") or "", "text": d.get("text") or ""}
            for d in _jsonl(root / "corpus.jsonl")
        }
        qrels: dict[str, dict[str, int]] = {}
        with open(root / "qrels" / f"{split}.tsv", encoding="utf-8") as f:
            for n, line in enumerate(f):
                parts = line.rstrip("\n").split("\t")
                if len(parts) < 3 or (n == 0 and not parts[2].strip().lstrip("-").isdigit()):
                    continue  # the header, or a blank line
                qrels.setdefault(parts[0].strip(), {})[parts[1].strip()] = int(parts[2])
        queries = {str(q["_id"]): q["text"] for q in _jsonl(root / "queries.jsonl") if str(q["_id"]) in qrels}
        return cls(corpus, queries, {q: r for q, r in qrels.items() if q in queries})


def _jsonl(path: Path) -> Iterator[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


# --- metrics (BEIR's definitions: graded gains, log2 discounts, cut-offs on the ranking) ----------
def ndcg_at(ranking: Sequence[str], rels: dict[str, int], k: int = 10) -> float:
    dcg = sum(rels.get(d, 0) / math.log2(i + 2) for i, d in enumerate(ranking[:k]))
    ideal = sorted((r for r in rels.values() if r > 0), reverse=True)[:k]
    idcg = sum(r / math.log2(i + 2) for i, r in enumerate(ideal))
    return dcg / idcg if idcg else 0.0


def recall_at(ranking: Sequence[str], rels: dict[str, int], k: int) -> float:
    relevant = {d for d, r in rels.items() if r > 0}
    return len(relevant & set(ranking[:k])) / len(relevant) if relevant else 0.0


def mrr_at(ranking: Sequence[str], rels: dict[str, int], k: int = 10) -> float:
    for i, d in enumerate(ranking[:k]):
        if rels.get(d, 0) > 0:
            return 1.0 / (i + 1)
    return 0.0


#: The metrics of one ranking against its judgements, by the names the summary reports.
METRICS: dict[str, Callable[[Sequence[str], dict[str, int]], float]] = {
    "ndcg@10": lambda ranking, rels: ndcg_at(ranking, rels, 10),
    "recall@10": lambda ranking, rels: recall_at(ranking, rels, 10),
    "recall@100": lambda ranking, rels: recall_at(ranking, rels, 100),
    "mrr@10": lambda ranking, rels: mrr_at(ranking, rels, 10),
}


@dataclass
class ModeResult:
    """Per-query metrics of one retrieval mode, averaged (and latency's p50) in the summary."""

    mode: str
    per_query: dict[str, list[float]] = field(default_factory=lambda: {name: [] for name in METRICS})
    latency_s: list[float] = field(default_factory=list)

    def add(self, ranking: Sequence[str], rels: dict[str, int], seconds: float) -> None:
        for name, metric in METRICS.items():
            self.per_query[name].append(metric(ranking, rels))
        self.latency_s.append(seconds)

    def summary(self) -> dict[str, float]:
        out = {name: sum(xs) / len(xs) if xs else 0.0 for name, xs in self.per_query.items()}
        out["p50_ms"] = 1000 * statistics.median(self.latency_s) if self.latency_s else 0.0
        out["queries"] = len(self.latency_s)
        return out


def document_ranking(nodes: list[dict[str, Any]]) -> list[str]:
    """Documents in the order of their best chunk."""
    return list(dict.fromkeys(n["doc_id"] for n in nodes))


class EvalError(RuntimeError):
    """The server refused a step of the evaluation (status and body in the message)."""


def _check(r: httpx.Response, what: str) -> httpx.Response:
    if r.status_code >= 400:
        raise EvalError(f"{what}: HTTP {r.status_code}: {r.text[:500]}")
    return r


def index_exists(client: httpx.Client, index: str) -> bool:
    """Whether the server holds ``index`` already (``GET /indexes``)."""
    names = _check(client.get("/indexes"), "listing the indexes").json()
    return index in names


def index_path(index: str) -> str:
    return f"/indexes/{quote(index, safe='')}"


def index_corpus(client: httpx.Client, index: str, data: Dataset, batch: int) -> None:
    """The corpus into ``index``: the title and the text as the document (the title is part of what
    BEIR's retrievers see), the BEIR id as doc_id."""
    docs = [
        {"doc_id": doc_id, "text": f"{d['title']}\n\n{d['text']}".strip(), "metadata": {"title": d["title"]}}
        for doc_id, d in data.corpus.items()
        if (d["title"] + d["text"]).strip()
    ]
    for i in range(0, len(docs), batch):
        _check(
            client.post("/index", json={"index_name": index, "documents": docs[i : i + batch]}),
            f"indexing documents {i}-{i + batch}",
        )


def evaluate(
    client: httpx.Client, index: str, data: Dataset, modes: Sequence[str], depth: int = DEPTH
) -> dict[str, ModeResult]:
    """Every judged query in every mode (modes interleaved per query, so that a slower moment of a
    shared machine does not fall on one mode only)."""
    results = {m: ModeResult(m) for m in modes}
    for qid, text in data.queries.items():
        for mode in modes:
            t0 = time.perf_counter()
            r = _check(
                client.post(
                    "/retrieve",
                    json={"index_name": index, "query": text, "max_node_count": depth, "retrieval_mode": mode},
                ),
                f"query {qid} ({mode})",
            )
            seconds = time.perf_counter() - t0
            results[mode].add(document_ranking(r.json()["results"]), data.qrels[qid], seconds)
    return results


def table(summaries: dict[str, dict[str, float]]) -> str:
    head = "| mode | nDCG@10 | recall@10 | recall@100 | MRR@10 | p50 ms |\n|---|---:|---:|---:|---:|---:|"
    rows = [
        f"| {m} | {s['ndcg@10']:.3f} | {s['recall@10']:.3f} | {s['recall@100']:.3f} | {s['mrr@10']:.3f} | "
        f"{s['p50_ms']:.1f} |"
        for m, s in summaries.items()
    ]
    return "\n".join([head, *rows])


def parser(prog: str = "ragserve-eval") -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=prog,
        description="Retrieval quality of a ragserve server on a "
        "BEIR-format dataset (nDCG@10, recall@10/100, MRR@10, p50 latency per mode).",
    )
    ap.add_argument("data", help="folder with corpus.jsonl, queries.jsonl and qrels/<split>.tsv")
    ap.add_argument(
        "--url",
        default=None,
        help="the server's base URL (env RAGSERVE_URL; default http://127.0.0.1:$RAGSERVE_PORT, else port 8000)",
    )
    ap.add_argument(
        "--api-key",
        default=os.environ.get("RAGSERVE_API_KEY"),
        help="bearer key, a write key since the corpus is indexed (env RAGSERVE_API_KEY)",
    )
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated retrieval modes")
    ap.add_argument("--split", default="test", help="the qrels file to judge with")
    ap.add_argument(
        "--index",
        default=None,
        help="name of the index to create (default: a fresh eval-<random> index); one that exists is refused",
    )
    ap.add_argument("--keep-index", action="store_true", help="do not drop the index afterwards")
    ap.add_argument("--batch", type=at_least(1), default=64, help="documents per /index request")
    ap.add_argument("--max-queries", type=at_least(1), default=None, help="only the first N judged queries")
    ap.add_argument("--timeout", type=positive_seconds, default=600.0, help="seconds per HTTP request")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    return ap


def main(argv: list[str] | None = None, prog: str = "ragserve-eval") -> int:
    args = parser(prog).parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        print(f"ragserve-eval: --modes must name some of {', '.join(MODES)}; got {args.modes!r}", file=sys.stderr)
        return 2
    try:
        data = Dataset.load(args.data, args.split)
    except (OSError, ValueError, KeyError) as e:
        print(f"ragserve-eval: cannot read the dataset at {args.data}: {e}", file=sys.stderr)
        return 2
    if args.index is not None:
        try:
            validate_index_name(args.index)
        except ValueError as e:
            print(f"ragserve-eval: --index: {e}", file=sys.stderr)
            return 2
    if args.max_queries:
        data.queries = dict(list(data.queries.items())[: args.max_queries])
    index = args.index or f"eval-{uuid.uuid4().hex[:10]}"
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    created = False  # only an index this run created is ever dropped
    with httpx.Client(base_url=args.url or default_url(), headers=headers, timeout=args.timeout) as client:
        try:
            if index_exists(client, index):
                print(
                    f"ragserve-eval: index {index!r} already exists; name a new one with --index, or leave "
                    "--index out for a fresh one (eval indexes its corpus into an index it creates, then drops it)",
                    file=sys.stderr,
                )
                return 2
            created = True
            t0 = time.perf_counter()
            index_corpus(client, index, data, args.batch)
            indexed_s = time.perf_counter() - t0
            results = evaluate(client, index, data, modes)
        except (EvalError, httpx.HTTPError) as e:
            print(f"ragserve-eval: {e}", file=sys.stderr)
            return 1
        finally:
            if created and not args.keep_index:
                with contextlib.suppress(httpx.HTTPError):  # the results stand without the clean-up
                    client.delete(index_path(index))
    summaries = {m: r.summary() for m, r in results.items()}
    print(
        f"{Path(args.data).name}: {len(data.corpus)} documents (indexed in {indexed_s:.1f} s), "
        f"{len(data.queries)} queries\n"
    )
    print(table(summaries))
    if args.out:
        payload = {
            "dataset": str(args.data),
            "documents": len(data.corpus),
            "queries": len(data.queries),
            "index_seconds": indexed_s,
            "modes": summaries,
        }
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(payload, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
