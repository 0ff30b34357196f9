#!/usr/bin/env python3
"""Answers on real documents: a documentation set shipped in the repository (the Flask docs,
benchmarks/docsets/flask), its questions with facts checked against the sources, asked through the
HTTP API with the ``openai`` SDK exactly as the README shows it.

    python -m benchmarks.doc_quality [--url URL] [--top-k N] [--model NAME] [--json out.json]

Ingests the set's ``.rst`` files through the document API (``POST /indexes/{name}/files``, the
conversion ``ragserve ingest`` uses; ``--reuse-index`` keeps an index that exists), then asks every
question with ``client.chat.completions.create(..., stream=True, max_tokens=64,
extra_body={"index_name": ...})``: no ``top_k`` unless ``--top-k`` gives one (the server then sizes
the context itself, as for every SDK user). Per question and in total it reports:

- **correct**: the answer holds the expected fact (one accepted wording of every group in
  ``expect``, case-insensitive) and echoes no part of the prompt;
- **source in top 3**: the file that has the fact is among the first three ``source_nodes``;
- **evidence has fact**: a passage of ``rag.evidence`` holds the fact (``n/a`` while the server
  sends no evidence);
- **not covered**: a question the documents do not answer gets ``rag.answerable: false`` or
  ``X-RAG-Reason: not_covered`` (``n/a`` while the server says neither for any question); an
  answerable question declared not covered is counted as **wrongly not covered**;
- the time of each answer (request to the end of the stream), p50 and max, the time to the first
  token, the number of sources used and the prompt's tokens (``stream_options.include_usage``, the
  one addition to the README's call, which changes nothing the server does).

Without ``--url`` the application runs in this process (real shards, MiniLM embedder and the
embedded Gemma 3 270M on the transformers engine, production defaults, no Ray) on a loopback port;
``--storage DIR`` keeps its index for a later run (with ``--reuse-index``). With ``--url`` it asks a
running server, which may use any engine (a remote LLM with ``llm_engine: openai``). ``--smoke`` asks
two questions over two documents (CI runs it against the fake upstream: tests/load/test_smoke.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from benchmarks.answer_quality import echoes_prompt
from benchmarks.common import MODEL_CACHE, REPO, machine, pct, table, write_json

DOCSET = REPO / "benchmarks" / "docsets" / "flask"
INDEX = "flask_docs"
KINDS = ("fact", "steps", "not_covered")
#: What ``--smoke`` asks, over which documents: one fact and one question the two do not answer.
SMOKE_QUESTIONS = ("waitress-port", "kubernetes")
SMOKE_FILES = ("deploying/waitress.rst", "deploying/gunicorn.rst")
#: The reason a server gives (``X-RAG-Reason``) when the indexed documents do not cover a question.
NOT_COVERED = "not_covered"


# --- the question set ---------------------------------------------------------------------------


def normalized(text: str) -> str:
    """Lower case, typographic apostrophes plain, every whitespace run one space: how answers,
    evidence, quotes and sources are compared (a fact may wrap across lines of the source)."""
    return " ".join(text.replace("\u2019", "'").lower().split())


def holds(text: str, wordings: Sequence[str]) -> bool:
    """Whether ``text`` contains one of ``wordings`` (case and whitespace aside)."""
    t = normalized(text)
    return any(normalized(w) in t for w in wordings)


@dataclass(frozen=True)
class Question:
    id: str
    kind: str  # fact | steps | not_covered
    question: str
    expect: tuple[tuple[str, ...], ...] = ()  # groups of accepted wordings: one of each group
    source: str | None = None  # the file (relative to the set) that has the answer
    quotes: tuple[str, ...] = ()  # its own words, verbatim, holding the expected wordings
    absent: tuple[str, ...] = ()  # not_covered: words no file of the set contains

    @property
    def answerable(self) -> bool:
        return self.kind != "not_covered"

    def answered_by(self, text: str) -> bool:
        return all(holds(text, group) for group in self.expect)


def load_questions(path: Path) -> list[Question]:
    """The questions of a set's ``questions.json``; a malformed entry is a ValueError naming it."""
    raw = json.loads(path.read_text())
    out: list[Question] = []
    for i, q in enumerate(raw["questions"]):
        where = f"{path.name}: question {i} ({q.get('id', '?')})"
        if q.get("kind") not in KINDS:
            raise ValueError(f"{where}: kind must be one of {KINDS}")
        question = Question(
            id=q["id"],
            kind=q["kind"],
            question=q["question"],
            expect=tuple(tuple(g) for g in q.get("expect", ())),
            source=q.get("source"),
            quotes=tuple(q.get("quotes", ())),
            absent=tuple(q.get("absent", ())),
        )
        if question.answerable and not (question.expect and all(question.expect) and question.source):
            raise ValueError(f"{where}: an answerable question needs expect (non-empty groups) and source")
        if not question.answerable and (question.expect or question.source or not question.absent):
            raise ValueError(f"{where}: a not_covered question has absent words, and no expect or source")
        out.append(question)
    ids = [q.id for q in out]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path.name}: question ids repeat")
    return out


def docset_files(root: Path) -> list[str]:
    """The documents of a set: its ``.rst`` files, relative to ``root`` (README, LICENSE and the
    questions are about the set, not part of it)."""
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*.rst"))


# --- talking to the server ----------------------------------------------------------------------


def http_client(url: str, api_key: str | None, timeout_s: float) -> httpx.Client:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return httpx.Client(base_url=url, headers=headers, timeout=timeout_s)


def _check(r: httpx.Response, what: str) -> None:
    if r.status_code >= 400:
        raise RuntimeError(f"{what}: HTTP {r.status_code}: {r.text[:500]}")


def index_exists(http: httpx.Client, index: str) -> bool:
    r = http.get("/indexes")
    _check(r, "GET /indexes")
    body = r.json()
    names = body if isinstance(body, list) else body.get("indexes", [])
    return index in names


def ingest(http: httpx.Client, index: str, root: Path, files: Sequence[str]) -> dict[str, Any]:
    """Replace ``index`` with ``files`` (paths relative to ``root``, which become each document's
    ``path``), one upload each through ``POST /indexes/{index}/files``; the index's stats after."""
    t0 = time.perf_counter()
    r = http.delete(f"/indexes/{index}")
    if r.status_code not in (200, 204, 404):
        _check(r, f"DELETE /indexes/{index}")
    for rel in files:
        data = (root / rel).read_bytes()
        for attempt in range(20):
            r = http.post(
                f"/indexes/{index}/files",
                params={"filename": Path(rel).name, "path": rel},
                content=data,
                headers={"Content-Type": "application/octet-stream"},
            )
            if r.status_code != 503 or attempt == 19:  # 503: busy converting other uploads
                break
            time.sleep(float(r.headers.get("retry-after", "1")))
        _check(r, f"upload {rel}")
    seconds = time.perf_counter() - t0
    r = http.get(f"/indexes/{index}/stats")
    _check(r, f"GET /indexes/{index}/stats")
    stats = r.json()
    return {
        "files": len(files),
        "documents": stats.get("documents"),
        "chunks": stats.get("chunks"),
        "seconds": seconds,
    }


def served_model(http: httpx.Client) -> str:
    r = http.get("/v1/models")
    _check(r, "GET /v1/models")
    return str(r.json()["data"][0]["id"])


@dataclass
class Result:
    id: str
    kind: str
    question: str
    answer: str = ""
    seconds: float = 0.0
    first_token_s: float | None = None
    finish_reason: str | None = None
    mode: str = ""  # X-RAG-Mode
    reason: str = ""  # X-RAG-Reason
    sources: list[str] = field(default_factory=list)  # each source node's path, in order
    prompt_tokens: int | None = None
    evidence: list[str] | None = None  # rag.evidence texts; None: the server sent none
    answerable: bool | None = None  # rag.answerable
    error: str | None = None
    # the judgement (judge()); None where it does not apply or cannot be told (n/a)
    correct: bool | None = None
    source_top3: bool | None = None
    evidence_has_fact: bool | None = None
    not_covered: bool | None = None  # declared not covered (answerable questions: wrongly)

    @property
    def declared_not_covered(self) -> bool:
        return self.answerable is False or self.reason == NOT_COVERED


def _path_of(node: dict[str, Any]) -> str:
    meta = node.get("metadata") or {}
    return str(meta.get("path") or node.get("doc_id") or "")


def ask(client: Any, model: str, q: Question, index: str, top_k: int | None, max_tokens: int) -> Result:
    """One question through the SDK, streamed, as the README asks it."""
    import openai

    res = Result(q.id, q.kind, q.question)
    extra: dict[str, Any] = {"index_name": index}
    if top_k is not None:
        extra["top_k"] = top_k
    rag: dict[str, Any] = {}
    text: list[str] = []
    t0 = time.perf_counter()
    try:
        raw = client.chat.completions.with_raw_response.create(
            model=model,
            messages=[{"role": "user", "content": q.question}],
            max_tokens=max_tokens,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=extra,
        )
        res.mode = raw.headers.get("x-rag-mode", "")
        res.reason = raw.headers.get("x-rag-reason", "")
        for chunk in raw.parse():
            more = chunk.model_extra or {}
            if more.get("source_nodes") and not res.sources:
                res.sources = [_path_of(n) for n in more["source_nodes"]]
            if isinstance(more.get("rag"), dict):  # the first chunk has it; the last may add evidence
                rag.update({k: v for k, v in more["rag"].items() if v is not None})
            if chunk.usage is not None:
                res.prompt_tokens = chunk.usage.prompt_tokens
            for choice in chunk.choices:
                if choice.delta.content:
                    if res.first_token_s is None:
                        res.first_token_s = time.perf_counter() - t0
                    text.append(choice.delta.content)
                if choice.finish_reason:
                    res.finish_reason = choice.finish_reason
    except openai.APIError as e:
        res.error = f"{type(e).__name__}: {getattr(e, 'message', e)}"[:300]
    res.seconds = time.perf_counter() - t0
    res.answer = "".join(text)
    if isinstance(rag.get("evidence"), list):
        res.evidence = [str(ev.get("text", "")) for ev in rag["evidence"] if isinstance(ev, dict)]
    if isinstance(rag.get("answerable"), bool):
        res.answerable = rag["answerable"]
    return res


def judge(results: list[Result], questions: dict[str, Question]) -> None:
    """Fill each result's verdicts. ``not_covered`` can be told only where the server reports
    answerability: for some question of the run, ``rag.answerable`` or a not-covered reason."""
    reports = any(r.answerable is not None or r.reason == NOT_COVERED for r in results)
    for r in results:
        q = questions[r.id]
        declared: bool | None = r.declared_not_covered if reports else None
        r.not_covered = declared
        if not q.answerable:
            continue
        r.correct = r.error is None and q.answered_by(r.answer) and not echoes_prompt(r.answer)
        r.source_top3 = any(p == q.source or p.endswith("/" + str(q.source)) for p in r.sources[:3])
        if r.evidence is not None:
            r.evidence_has_fact = any(holds(ev, q.expect[0]) for ev in r.evidence)


def summary(results: list[Result]) -> dict[str, Any]:
    answerable = [r for r in results if r.kind != "not_covered"]
    unanswerable = [r for r in results if r.kind == "not_covered"]

    def share(rs: list[Result], attr: str) -> dict[str, int] | None:
        told = [getattr(r, attr) for r in rs if getattr(r, attr) is not None]
        if not rs or not told:
            return None  # n/a
        return {"yes": sum(bool(v) for v in told), "of": len(rs)}

    seconds = [r.seconds for r in results]
    first = [r.first_token_s for r in results if r.first_token_s is not None]
    prompts = [r.prompt_tokens for r in results if r.prompt_tokens is not None]
    return {
        "asked": len(results),
        "errors": sum(r.error is not None for r in results),
        "correct": share(answerable, "correct"),
        "source_top3": share(answerable, "source_top3"),
        "evidence_has_fact": share(answerable, "evidence_has_fact"),
        "not_covered_handled": share(unanswerable, "not_covered"),
        "wrongly_not_covered": share(answerable, "not_covered"),
        "p50_s": pct(seconds, 50) if seconds else None,
        "max_s": max(seconds) if seconds else None,
        "p50_first_token_s": pct(first, 50) if first else None,
        "mean_sources": statistics.fmean(len(r.sources) for r in results) if results else None,
        "p50_prompt_tokens": pct(prompts, 50) if prompts else None,
    }


def _mark(v: bool | None) -> str:
    return "n/a" if v is None else ("yes" if v else "no")


def _share(s: dict[str, int] | None) -> str:
    return "n/a" if s is None else f"{s['yes']}/{s['of']}"


def result_table(results: list[Result]) -> str:
    rows = []
    for r in results:
        answer = r.error or r.answer
        if r.kind == "not_covered":
            verdicts = ["", "", "", _mark(r.not_covered)]
        else:
            not_covered = "" if r.not_covered is None else ("wrongly" if r.not_covered else "")
            verdicts = [_mark(r.correct), _mark(r.source_top3), _mark(r.evidence_has_fact), not_covered]
        mode = f"{r.mode}: {r.reason}" if r.reason else r.mode
        rows.append([r.id, r.kind, *verdicts, mode, len(r.sources), r.seconds, repr(" ".join(answer.split())[:70])])
    return table(
        [
            "question",
            "kind",
            "correct",
            "source in top 3",
            "evidence has fact",
            "not covered",
            "mode",
            "sources",
            "s",
            "answer",
        ],
        rows,
    )


def summary_table(s: dict[str, Any]) -> str:
    def num(v: float | None) -> Any:
        return "n/a" if v is None else v

    return table(
        [
            "correct",
            "source in top 3",
            "evidence has fact",
            "not covered handled",
            "wrongly not covered",
            "p50 s",
            "max s",
            "p50 first token s",
            "mean sources",
            "p50 prompt tokens",
            "errors",
        ],
        [
            [
                _share(s["correct"]),
                _share(s["source_top3"]),
                _share(s["evidence_has_fact"]),
                _share(s["not_covered_handled"]),
                _share(s["wrongly_not_covered"]),
                num(s["p50_s"]),
                num(s["max_s"]),
                num(s["p50_first_token_s"]),
                num(s["mean_sources"]),
                num(s["p50_prompt_tokens"]),
                s["errors"],
            ]
        ],
    )


# --- the application in this process ------------------------------------------------------------


@contextmanager
def inprocess_server(storage: Path, model_cache: Path) -> Iterator[str]:
    """The application on the embedded models, as ``make run`` configures it (Settings' defaults,
    not the test suite's smaller chunks), served on a loopback port; yields its base URL."""
    from ragserve.config import Settings
    from ragserve.models.embeddings import LocalEmbeddingModel
    from ragserve.service.engine_factory import make_engine
    from ragserve.testing.embedder import InProcessEmbedder
    from ragserve.testing.inprocess import inprocess_app
    from ragserve.testing.live import serve

    defaults = {
        name: Settings.model_fields[name].default
        for name in ("num_shards", "default_max_tokens", "chunk_size", "chunk_overlap")
    }
    settings = {**defaults, "llm_engine": "transformers", "model_cache_dir": str(model_cache)}
    engine = make_engine(Settings(storage_dir=str(storage), **settings))
    asyncio.run(engine.start())
    embedder = InProcessEmbedder(LocalEmbeddingModel(None, device="cpu"))
    try:
        with (
            inprocess_app(storage, embedder, None, engine=engine, **settings) as (app, _),
            serve(app, startup_timeout_s=120) as url,
        ):
            yield url
    finally:
        asyncio.run(engine.stop())


# --- the command --------------------------------------------------------------------------------


def run(args: argparse.Namespace, url: str) -> dict[str, Any]:
    from openai import OpenAI

    root = Path(args.docs)
    questions = load_questions(Path(args.questions) if args.questions else root / "questions.json")
    files = docset_files(root)
    if args.smoke:
        questions = [q for q in questions if q.id in SMOKE_QUESTIONS]
        files = [f for f in files if f in SMOKE_FILES]
    if args.only:
        wanted = set(args.only.split(","))
        unknown = wanted - {q.id for q in questions}
        if unknown:
            raise SystemExit(f"--only: no question {sorted(unknown)}; ids: {[q.id for q in questions]}")
        questions = [q for q in questions if q.id in wanted]
    if args.limit:
        questions = questions[: args.limit]

    with http_client(url, args.api_key, args.timeout) as http:
        if args.reuse_index and index_exists(http, args.index):
            ingested: dict[str, Any] = {"reused": True}
        else:
            ingested = ingest(http, args.index, root, files)
        print(f"index {args.index}: {ingested}", file=sys.stderr)
        model = args.model or served_model(http)
        if not args.url:  # the first generation pays one-off costs: not a question's time
            http.post(
                "/v1/chat/completions",
                json={"model": model, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 1},
            )

    client = OpenAI(base_url=f"{url}/v1", api_key=args.api_key or "unused", timeout=args.timeout, max_retries=0)
    results = []
    for q in questions:
        r = ask(client, model, q, args.index, args.top_k, args.max_tokens)
        print(f"{q.id}: {r.seconds:.1f} s, {len(r.sources)} sources: {r.error or r.answer[:100]!r}", file=sys.stderr)
        results.append(r)
    judge(results, {q.id: q for q in questions})
    return {
        "machine": machine(),
        "server": args.url or "in-process (embedded Gemma 3 270M, transformers engine, MiniLM; no Ray)",
        "model": model,
        "top_k": args.top_k,
        "max_tokens": args.max_tokens,
        "docs": str(root.relative_to(REPO) if root.is_relative_to(REPO) else root),
        "index": ingested,
        "summary": summary(results),
        "results": [asdict(r) for r in results],
    }


def combined(paths: Sequence[str], questions: list[Question]) -> dict[str, Any]:
    """Earlier runs' ``--json`` files taken as one run (parts asked with ``--only``/``--limit``,
    with the same server, model, ``top_k`` and ``max_tokens``), judged again, in question order."""
    parts = [json.loads(Path(p).read_text()) for p in paths]
    setup = ("server", "model", "top_k", "max_tokens")
    if any(tuple(p.get(k) for k in setup) != tuple(parts[0].get(k) for k in setup) for p in parts):
        raise SystemExit(f"--report: the runs differ in {setup}; give runs of one setup")
    order = {q.id: i for i, q in enumerate(questions)}
    by_id = {r["id"]: r for p in parts for r in p["results"]}
    unknown = sorted(set(by_id) - set(order))
    if unknown:
        raise SystemExit(f"--report: no question {unknown} in the question set")
    results = [Result(**by_id[i]) for i in sorted(by_id, key=order.__getitem__)]
    judge(results, {q.id: q for q in questions})
    return {
        **{k: parts[0].get(k) for k in ("machine", *setup, "docs")},
        "index": [p.get("index") for p in parts],
        "wall_s": sum(p.get("wall_s") or 0.0 for p in parts),
        "summary": summary(results),
        "results": [asdict(r) for r in results],
    }


def print_report(out: dict[str, Any]) -> None:
    results = [Result(**r) for r in out["results"]]
    print(f"machine: {out['machine']}")
    print(
        f"server: {out['server']}; model {out['model']}; top_k {out['top_k'] or 'none (server default)'}; "
        f"max_tokens {out['max_tokens']}; index {out['index']}; {out.get('wall_s') or 0:.0f} s in all\n"
    )
    print(result_table(results))
    print()
    print(summary_table(out["summary"]))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--url", help="a running ragserve (default: the application in this process)")
    parser.add_argument("--top-k", type=int, help="send this top_k (default: none, as the README's SDK call)")
    parser.add_argument("--model", help="the model to name (default: the server's first in /v1/models)")
    parser.add_argument("--max-tokens", type=int, default=64, help="as the README's SDK call (64)")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--docs", default=str(DOCSET), help="the documentation set (its .rst files)")
    parser.add_argument("--questions", help="the questions (default: questions.json in --docs)")
    parser.add_argument("--index", default=INDEX, help=f"index name (default {INDEX}); it is replaced")
    parser.add_argument("--reuse-index", action="store_true", help="ask an index of that name as it is, if it exists")
    parser.add_argument("--only", help="ask only these question ids (comma-separated)")
    parser.add_argument("--limit", type=int, help="ask only the first N questions")
    parser.add_argument("--smoke", action="store_true", help=f"two questions {SMOKE_QUESTIONS} over {SMOKE_FILES}")
    parser.add_argument("--api-key", default=os.environ.get("RAGSERVE_API_KEY"), help="bearer key ($RAGSERVE_API_KEY)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per request")
    parser.add_argument("--storage", help="in-process: the storage_dir (default: a temporary one)")
    parser.add_argument("--model-cache", type=Path, default=MODEL_CACHE, help="in-process: the converted Gemma cache")
    parser.add_argument(
        "--report",
        nargs="+",
        metavar="JSON",
        help="ask nothing: print earlier runs' --json files taken together (parts of one run)",
    )
    args = parser.parse_args(argv)

    if args.report:
        questions = load_questions(Path(args.questions) if args.questions else Path(args.docs) / "questions.json")
        out = combined(args.report, questions)
        print_report(out)
        write_json(args.json, out)
        return
    t0 = time.perf_counter()
    if args.url:
        out = run(args, args.url.rstrip("/"))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            storage = Path(args.storage or tmp)
            storage.mkdir(parents=True, exist_ok=True)
            with inprocess_server(storage, args.model_cache) as url:
                out = run(args, url)
    out["wall_s"] = time.perf_counter() - t0
    print_report(out)
    write_json(args.json, out)


if __name__ == "__main__":
    main()
