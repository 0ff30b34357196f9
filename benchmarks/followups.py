#!/usr/bin/env python3
"""Follow-up questions on real documents (issue 24): the multi-turn cases of a documentation set
(``benchmarks/docsets/flask/followups.json``), each asked three ways, and whether the file that
answers the newest turn comes first (hit@1) or among the first three sources (hit@3).

    python -m benchmarks.followups [--json out.json] [--only ID,ID] [--rewrite]

The methods, each through ``POST /v1/chat/completions`` of the application in this process (real
shards, MiniLM, production chunking; a fake upstream model, since only retrieval is measured):

- **newest turn alone**: the newest user turn sent as the only message;
- **whole-turn join (before)**: what chat did before issue 24: the newest turn alone, and unless
  its best source reached ``answerable_threshold``, the earlier user turns and it joined whole
  (sent as consecutive user messages, which chat joins the same way), keeping whichever found the
  higher best score (every case's turns fit the old 128-token bound);
- **follow-up (now)**: the whole conversation, as a client sends it: chat decides itself
  (``ragserve.rag.followup``) whether the newest turn refers back and what it adds;
- ``--rewrite``: also the whole conversation with ``query_rewrite: llm`` on the embedded Gemma 3
  270M (transformers engine, CPU: about 20 s a case on 2 cores, 8 minutes in all).

A case's sources are the RAG answer's ``source_nodes`` (best cosine first); a passthrough
(``no_context``) has none. For a topic switch the old topic's file must not be the first source.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import MODEL_CACHE, machine, table, write_json
from benchmarks.doc_quality import DOCSET, docset_files, ingest

CASES = DOCSET / "followups.json"
INDEX = "flask_docs"
KINDS = ("reference", "ellipsis", "switch")
METHODS = ("newest turn alone", "whole-turn join (before)", "follow-up (now)")
REWRITE = "query_rewrite: llm"


@dataclass(frozen=True)
class Case:
    id: str
    kind: str  # reference | ellipsis | switch
    turns: tuple[str, ...]  # user, assistant, ..., user
    source: tuple[str, ...]  # the files that answer the newest turn (any counts)
    previous: str | None = None  # switch: the earlier topic's file

    def messages(self) -> list[dict[str, str]]:
        return [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(self.turns)]

    @property
    def user_turns(self) -> list[str]:
        return list(self.turns[::2])


def load_cases(path: Path = CASES) -> list[Case]:
    """The cases of a ``followups.json``; a malformed one is a ValueError naming it."""
    raw = json.loads(path.read_text())
    out = []
    for i, c in enumerate(raw["cases"]):
        where = f"{path.name}: case {i} ({c.get('id', '?')})"
        case = Case(
            id=c["id"],
            kind=c.get("kind", ""),
            turns=tuple(c["turns"]),
            source=tuple(c["source"]),
            previous=c.get("previous"),
        )
        if case.kind not in KINDS:
            raise ValueError(f"{where}: kind must be one of {KINDS}")
        if len(case.turns) < 3 or len(case.turns) % 2 == 0 or not case.source:
            raise ValueError(f"{where}: turns alternate user and assistant, end with the user, and a source is named")
        if (case.kind == "switch") != (case.previous is not None):
            raise ValueError(f"{where}: a switch (and only a switch) names the previous topic's file")
        out.append(case)
    if len({c.id for c in out}) != len(out):
        raise ValueError(f"{path.name}: case ids repeat")
    return out


@dataclass
class Asked:
    """One method's retrieval for one case."""

    sources: list[str] = field(default_factory=list)  # each source node's path, best first
    top_score: float | None = None
    query: str | None = None  # rag.query
    query_source: str | None = None  # rag.query_source
    mode: str = ""  # X-RAG-Mode

    def rank(self, files: Sequence[str]) -> int | None:
        """The 1-based rank of the first source from ``files``; None when none is a source."""
        return next((i + 1 for i, p in enumerate(self.sources) if p in files), None)


def ask(http: Any, messages: list[dict[str, str]], index: str = INDEX, **extra: Any) -> Asked:
    r = http.post(
        "/v1/chat/completions",
        json={"index_name": index, "messages": messages, "max_tokens": 16, **extra},
    )
    if r.status_code != 200:
        raise RuntimeError(f"chat: HTTP {r.status_code}: {r.text[:300]}")
    body = r.json()
    nodes = body.get("source_nodes") or []
    rag = body.get("rag") or {}
    return Asked(
        sources=[str((n.get("metadata") or {}).get("path") or n.get("doc_id")) for n in nodes],
        top_score=max((float(n["score"]) for n in nodes), default=None),
        query=rag.get("query"),
        query_source=rag.get("query_source"),
        mode=r.headers.get("x-rag-mode", ""),
    )


def ask_all(http: Any, case: Case, answerable_threshold: float, rewrite: bool) -> dict[str, Asked]:
    """The case asked by every method."""
    alone = ask(http, [{"role": "user", "content": case.turns[-1]}])
    before = alone
    if alone.top_score is None or alone.top_score < answerable_threshold:
        joined = ask(http, [{"role": "user", "content": t} for t in case.user_turns])
        if joined.top_score is not None and (alone.top_score is None or joined.top_score > alone.top_score):
            before = joined
    out = {METHODS[0]: alone, METHODS[1]: before, METHODS[2]: ask(http, case.messages())}
    if rewrite:
        out[REWRITE] = ask(http, case.messages(), query_rewrite="llm")
    return out


def hits(case: Case, asked: Asked) -> dict[str, bool]:
    rank = asked.rank(case.source)
    verdict = {"hit@1": rank == 1, "hit@3": rank is not None and rank <= 3}
    if case.previous is not None:  # a switch: the old topic must not come first
        verdict["old topic first"] = bool(asked.sources) and asked.sources[0] == case.previous
    return verdict


@contextmanager
def flask_app(storage: Path, *, rewrite: bool = False, model_cache: Path = MODEL_CACHE) -> Iterator[Any]:
    """The application in this process over the Flask set (uploaded as ``doc_quality`` does), with
    Settings' chunking and shard defaults; its upstream is a fake model answering "OK." unless
    ``rewrite`` (then the embedded Gemma 3 270M, which the rewrite needs). Yields a TestClient."""
    from fastapi.testclient import TestClient

    from ragserve.config import Settings
    from ragserve.models.embeddings import LocalEmbeddingModel
    from ragserve.testing.embedder import InProcessEmbedder
    from ragserve.testing.fake_openai import FakeOpenAI
    from ragserve.testing.inprocess import inprocess_app

    settings: dict[str, Any] = {
        name: Settings.model_fields[name].default for name in ("num_shards", "chunk_size", "chunk_overlap")
    }
    embedder = InProcessEmbedder(LocalEmbeddingModel(None, device="cpu"))
    with ExitStack() as stack:
        engine = None
        url = None
        if rewrite:
            from ragserve.service.engine_factory import make_engine

            settings |= {"llm_engine": "transformers", "model_cache_dir": str(model_cache)}
            engine = make_engine(Settings(storage_dir=str(storage), **settings))
            asyncio.run(engine.start())
            stack.callback(lambda: asyncio.run(engine.stop()))
        else:
            url = stack.enter_context(FakeOpenAI(answer="OK.", model="fake-model", max_model_len=8192)).url
        app, _ = stack.enter_context(inprocess_app(storage, embedder, url, engine=engine, **settings))
        http: Any = stack.enter_context(TestClient(app))  # httpx's interface: what ingest uses of it
        ingest(http, INDEX, DOCSET, docset_files(DOCSET))
        yield http


def run(cases: Sequence[Case], http: Any, rewrite: bool) -> dict[str, Any]:
    from ragserve.config import Settings

    threshold = Settings.model_fields["answerable_threshold"].default
    methods = [*METHODS, *([REWRITE] if rewrite else [])]
    results = []
    for case in cases:
        asked = ask_all(http, case, threshold, rewrite)
        row: dict[str, Any] = {"id": case.id, "kind": case.kind, "methods": {}}
        for m in methods:
            row["methods"][m] = {**asdict(asked[m]), **hits(case, asked[m])}
        results.append(row)
        now = asked[METHODS[2]]
        print(f"{case.id}: {now.query_source} {now.query!r} -> {now.sources[:3]}", file=sys.stderr)
    return {"machine": machine(), "cases": len(cases), "methods": methods, "results": results}


def summary_rows(out: dict[str, Any]) -> list[list[Any]]:
    rows = []
    for m in out["methods"]:
        row: list[Any] = [m]
        for kinds in (KINDS, ("reference",), ("ellipsis",), ("switch",)):
            rs = [r["methods"][m] for r in out["results"] if r["kind"] in kinds]
            row.append(f"{sum(r['hit@1'] for r in rs)}/{len(rs)} · {sum(r['hit@3'] for r in rs)}/{len(rs)}")
        switches = [r["methods"][m] for r in out["results"] if r["kind"] == "switch"]
        row.append(f"{sum(r['old topic first'] for r in switches)}/{len(switches)}")
        rows.append(row)
    return rows


def print_report(out: dict[str, Any]) -> None:
    print(f"machine: {out['machine']}; {out['cases']} cases; {out.get('wall_s', 0):.0f} s\n")
    print("hit@1 · hit@3 of the file that answers the newest turn\n")
    print(
        table(
            ["method", "all", "reference", "ellipsis", "switch", "switch: old topic first"],
            summary_rows(out),
        )
    )
    print()
    per_case = []
    for r in out["results"]:
        ranks = []
        for m in out["methods"]:
            a = r["methods"][m]
            ranks.append("3+" if not a["hit@3"] else ("1" if a["hit@1"] else "2-3"))
        now = r["methods"][METHODS[2]]
        per_case.append([r["id"], r["kind"], *ranks, now["query_source"], repr(now["query"])])
    print(table(["case", "kind", *out["methods"], "query_source (now)", "query (now)"], per_case))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--cases", type=Path, default=CASES, help="the multi-turn cases (followups.json)")
    parser.add_argument("--only", help="ask only these case ids (comma-separated)")
    parser.add_argument("--rewrite", action="store_true", help="also query_rewrite: llm on the embedded Gemma 270M")
    parser.add_argument("--model-cache", type=Path, default=MODEL_CACHE, help="--rewrite: the converted Gemma cache")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)

    cases = load_cases(args.cases)
    if args.only:
        wanted = set(args.only.split(","))
        if unknown := wanted - {c.id for c in cases}:
            raise SystemExit(f"--only: no case {sorted(unknown)}")
        cases = [c for c in cases if c.id in wanted]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, flask_app(Path(tmp), rewrite=args.rewrite) as http:
        out = run(cases, http, args.rewrite)
    out["wall_s"] = time.perf_counter() - t0
    print_report(out)
    write_json(args.json, out)


if __name__ == "__main__":
    main()
