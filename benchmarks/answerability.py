#!/usr/bin/env python3
"""Calibrates evidence and answerability (docs/quality.md, "Evidence and 'not covered'") on real
documentation: Flask 3.1.3's docs (BSD-licensed; the ``docs/`` folder of its sdist), with questions
those docs answer (each with a fact that the answer's passage holds) and in-domain questions they
do not.

    python -m benchmarks.answerability DOCS_DIR [--top-k 5] [--storage DIR] [--json out.json]

The application runs in this process (real shards and MiniLM embedder, no Ray; the model is a fake
upstream, since nothing here depends on it). The folder's ``*.rst`` and ``*.md`` files are
converted as ``ragserve ingest`` converts them and indexed with the default chunking. Every
question goes through ``POST /v1/chat/completions`` twice: with ``answerability`` off, so the body
shows what the rule reads (the best source's cosine score, keyword matches, the evidence and its
scores; the coverage of the question's terms is computed here from ``source_nodes`` by the same
pure function), and with the settings in force, whose ``X-RAG-Reason`` is the verdict. Reports
each question's features, whether the top evidence passage holds the expected fact, each
feature's spread over answerable and unanswerable questions, the verdicts, and the time of the
evidence stage (``Server-Timing``). ``--storage`` keeps the index between runs (ingestion is the
slow part: minutes for Flask's 1 MB of docs on 2 shared cores).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import machine, table, write_json
from ragserve.api.documents import NodeWithScore
from ragserve.config import Settings
from ragserve.http.server_timing import parse_server_timing
from ragserve.rag.evidence import candidates, coverage, model_text

INDEX = "answerability"


@dataclass(frozen=True)
class Question:
    text: str
    fact: str | None  # None: the documents do not answer it


#: Questions over Flask 3.1.3's docs/ folder. Every fact was found by reading the file named beside it;
#: every unanswerable question's subject was searched for (grep) and is absent from the folder.
QUESTIONS: tuple[Question, ...] = (
    Question("Which versions of Python does Flask support?", "3.9"),  # installation.rst
    Question("How long does a permanent session last by default?", "31"),  # config.rst
    Question("What error is raised when a request is larger than MAX_CONTENT_LENGTH?", "413"),  # config.rst
    Question("Which port does the development server listen on?", "5000"),  # quickstart.rst, server.rst
    Question("On which port does waitress-serve serve the application?", "8080"),  # deploying/waitress.rst
    Question("How many worker processes does gunicorn run by default?", "1 worker"),  # deploying/gunicorn.rst
    Question("What is ItsDangerous used for?", "signs"),  # installation.rst
    Question("At what size does Flask warn that a cookie is too large?", "4093"),  # config.rst
    Question("How do I turn on debug mode when running the app?", "--debug"),  # quickstart.rst
    Question("What does Blinker provide?", "signals"),  # installation.rst
    Question("Which message broker does the Celery example use?", "Redis"),  # patterns/celery.rst
    Question("What is the blog application built in the tutorial called?", "Flaskr"),  # tutorial/index.rst
    Question("How long does the cached view decorator cache a view by default?", "5 minutes"),  # viewdecorators
    Question("What should I consider if my codebase is mainly async?", "Quart"),  # async-await.rst
    Question("What does the USE_X_SENDFILE setting do?", "X-Sendfile"),  # config.rst
    Question("Which database does the tutorial use?", "SQLite"),  # tutorial/database.rst
    # paraphrases: few of the question's words are the documents'
    Question("How can I make the dev server reachable from other machines on my network?", "0.0.0.0"),  # quickstart
    Question("How big may an upload be in the file upload example?", "16 megabytes"),  # patterns/fileuploads.rst
    Question("What happens to a session that is not permanent when the browser closes?", "deleted"),  # api.rst
    Question("How do I create a random secret key?", "token_hex"),  # quickstart.rst
    Question("Which middleware fixes the client address behind a reverse proxy?", "ProxyFix"),  # proxy_fix.rst
    # in the domain, not in the documents
    Question("How do I configure the size of the database connection pool in Flask?", None),
    Question("How do I add rate limiting to Flask routes?", None),
    Question("How do I add OAuth login with Google to a Flask app?", None),
    Question("How do I deploy a Flask application on Kubernetes?", None),
    Question("How do I connect Flask to a PostgreSQL database?", None),
    Question("How do I expose a gRPC service from a Flask application?", None),
    Question("How do I serve a Flask app over HTTP/3 with QUIC?", None),
    Question("How do I run a Flask application on AWS Lambda?", None),
    Question("How do I generate a Swagger specification for my Flask API?", None),
    Question("How do I send push notifications to mobile phones from Flask?", None),
    Question("How do I store Flask sessions in Cassandra?", None),
    Question("What is the maximum number of routes a Flask application can register?", None),
    Question("How do I cache responses in Memcached?", None),
    Question("How do I index my Flask models in Elasticsearch?", None),
    Question("How do I accept payments with Stripe in Flask?", None),
)


@dataclass
class Row:
    question: Question
    mode: str  # X-RAG-Mode and reason of the run without the rule: rag, or passthrough (no_context)
    best_score: float
    keyword_match: bool
    coverage: float
    evidence: list[dict[str, Any]]
    evidence_ms: float
    verdict: str = ""  # X-RAG-Reason with the rule: "" (answered), not_covered, no_context

    @property
    def best_evidence(self) -> float:
        return self.evidence[0]["score"] if self.evidence else 0.0

    def holds_fact(self, top: int) -> bool:
        fact = (self.question.fact or "").lower()
        return bool(fact) and any(fact in e["text"].lower() for e in self.evidence[:top])


def documents(folder: Path) -> list[dict[str, Any]]:
    """The folder's docs converted as ``ragserve ingest`` converts them (one document a section)."""
    from ragserve.ingest.convert import convert

    docs = []
    for path in sorted([*folder.rglob("*.rst"), *folder.rglob("*.md")]):
        rel = path.relative_to(folder).as_posix()
        converted = convert(path.read_bytes(), path.name)
        for i, section in enumerate(converted.sections):
            if section.text.strip():
                meta = {"path": rel, "title": converted.title or rel}
                docs.append({"doc_id": f"{rel}#{i}", "text": section.text, "metadata": meta})
    return docs


def chat(client: Any, q: Question, top_k: int) -> Any:
    body = {"messages": [{"role": "user", "content": q.text}], "index_name": INDEX, "top_k": top_k, "max_tokens": 8}
    r = client.post("/v1/chat/completions", json=body)
    r.raise_for_status()
    return r


def features(client: Any, q: Question, top_k: int) -> Row:
    r = chat(client, q, top_k)
    data = r.json()
    nodes = [NodeWithScore.model_validate(n) for n in data.get("source_nodes") or []]
    texts = [model_text(c.text) for c in candidates(nodes)]
    return Row(
        question=q,
        mode=r.headers.get("x-rag-mode", "")
        + (f" ({r.headers['x-rag-reason']})" if "x-rag-reason" in r.headers else ""),
        best_score=max((n.score for n in nodes), default=0.0),
        keyword_match=any(n.keyword_match for n in nodes),
        coverage=coverage(q.text, texts) if nodes else 0.0,
        evidence=(data.get("rag") or {}).get("evidence") or [],
        evidence_ms=parse_server_timing(r.headers.get("server-timing", "")).get("evidence", 0.0),
    )


def spread(xs: list[float]) -> str:
    if not xs:
        return "none"
    xs = sorted(xs)
    return f"min {xs[0]:.3f}  p25 {xs[len(xs) // 4]:.3f}  median {statistics.median(xs):.3f}  max {xs[-1]:.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("docs", type=Path, help="the documentation folder (Flask 3.1.3's docs/)")
    ap.add_argument("--top-k", type=int, default=5)
    ap.add_argument("--storage", type=Path, default=None, help="keep the index here between runs")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    from fastapi.testclient import TestClient

    from ragserve.models.embeddings import LocalEmbeddingModel
    from ragserve.testing.embedder import InProcessEmbedder
    from ragserve.testing.fake_openai import FakeOpenAI
    from ragserve.testing.inprocess import inprocess_app

    defaults = Settings(llm_engine="openai", llm_url="http://unused.invalid")
    storage = args.storage or Path(tempfile.mkdtemp(prefix="ragserve-answerability-"))
    storage.mkdir(parents=True, exist_ok=True)
    embedder = InProcessEmbedder(LocalEmbeddingModel(None, device="cpu"))
    chunking: dict[str, Any] = {"chunk_size": defaults.chunk_size, "chunk_overlap": defaults.chunk_overlap}
    with FakeOpenAI(answer="ok", model="fake", max_model_len=32768) as fake:
        with (
            inprocess_app(storage, embedder, fake.url, answerability=False, **chunking) as (app, _),
            TestClient(app) as client,
        ):
            if client.get(f"/indexes/{INDEX}/documents", params={"limit": 1}).status_code != 200:
                docs = documents(args.docs)
                t0 = time.perf_counter()
                for i in range(0, len(docs), 100):
                    batch = docs[i : i + 100]
                    client.post("/index", json={"index_name": INDEX, "documents": batch}).raise_for_status()
                print(f"indexed {len(docs)} documents in {time.perf_counter() - t0:.0f} s")
            features(client, QUESTIONS[0], args.top_k)  # warm-up: what loads lazily loads now
            rows = [features(client, q, args.top_k) for q in QUESTIONS]
        with inprocess_app(storage, embedder, fake.url, **chunking) as (app, _), TestClient(app) as client:
            for row in rows:
                row.verdict = chat(client, row.question, args.top_k).headers.get("x-rag-reason", "")

    def fact_cell(r: Row) -> str:
        return (
            "—" if r.question.fact is None else f"{'y' if r.holds_fact(1) else 'n'}/{'y' if r.holds_fact(3) else 'n'}"
        )

    print(
        table(
            [
                "question",
                "fact",
                "mode (rule off)",
                "best score",
                "kw",
                "coverage",
                "evidence",
                "fact top/3",
                "verdict",
            ],
            [
                [
                    r.question.text,
                    r.question.fact or "—",
                    r.mode,
                    f"{r.best_score:.3f}",
                    "y" if r.keyword_match else "",
                    f"{r.coverage:.2f}",
                    f"{r.best_evidence:.3f}",
                    fact_cell(r),
                    r.verdict or "answered",
                ]
                for r in rows
            ],
        )
    )
    for name, group in (
        ("answerable", [r for r in rows if r.question.fact is not None]),
        ("unanswerable", [r for r in rows if r.question.fact is None]),
    ):
        rag = [r for r in group if r.mode == "rag"]
        print(f"\n{name}: {len(group)} questions, {len(rag)} reach RAG (the others pass through as no_context)")
        print(f"  best source score  {spread([r.best_score for r in rag])}")
        print(f"  coverage           {spread([r.coverage for r in rag])}")
        print(f"  best evidence      {spread([r.best_evidence for r in rag])}")
        print(f"  keyword matches    {sum(r.keyword_match for r in rag)}")
        verdicts = Counter(r.verdict or "answered" for r in group)
        print(f"  verdicts           {dict(sorted(verdicts.items()))}")
        if name == "answerable":
            top, three = sum(r.holds_fact(1) for r in rag), sum(r.holds_fact(3) for r in rag)
            print(f"  evidence holds the fact: top passage {top}/{len(rag)}, top three {three}/{len(rag)}")
    ms = [r.evidence_ms for r in rows if r.mode == "rag"]
    print(
        f"\nevidence stage (sentences cut, embedded, scored): p50 {statistics.median(ms):.1f} ms, max {max(ms):.1f} ms"
    )
    print(
        f"rule: answerable_threshold {defaults.answerable_threshold}, answerable_coverage "
        f"{defaults.answerable_coverage}, answerable_evidence {defaults.answerable_evidence}"
    )
    print(machine())
    write_json(
        args.json,
        {
            "rows": [
                {
                    "question": r.question.text,
                    "fact": r.question.fact,
                    "mode": r.mode,
                    "best_score": r.best_score,
                    "keyword_match": r.keyword_match,
                    "coverage": r.coverage,
                    "evidence": r.evidence,
                    "evidence_ms": r.evidence_ms,
                    "verdict": r.verdict,
                }
                for r in rows
            ]
        },
    )


if __name__ == "__main__":
    main()
