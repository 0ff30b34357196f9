#!/usr/bin/env python3
"""A documentation set of ``benchmarks/docsets`` as a BEIR-format collection, for ``ragserve eval``.

    python -m benchmarks.docset_beir OUT_DIR [--docset benchmarks/docsets/flask]

The corpus is every document of the set (``benchmarks.doc_quality.docset_files``: its path relative
to the set as the id, the whole file as the text, which ``ragserve eval`` chunks like any
document), the queries are the
questions of ``questions.json`` that name a ``source`` and those of ``retrieval.json`` (each with
every file that answers it), judged relevant (1) to those files. On the Flask set: 52 files and
32 questions, mostly short and technical, the opposite shape from CISI's long questions
(docs/quality.md).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.doc_quality import docset_files

DOCSET = Path(__file__).resolve().parent / "docsets" / "flask"


def questions(docset: Path) -> list[tuple[str, list[str]]]:
    """(question, the files that answer it) of the set, in file order."""
    out = [
        (q["question"], [q["source"]])
        for q in json.loads((docset / "questions.json").read_text(encoding="utf-8"))["questions"]
        if q.get("source")
    ]
    extra = docset / "retrieval.json"
    if extra.exists():
        out += [(q["question"], list(q["sources"])) for q in json.loads(extra.read_text(encoding="utf-8"))["questions"]]
    return out


def export(docset: Path, out: Path) -> int:
    """Write the BEIR files of ``docset`` under ``out``; returns the number of queries."""
    files = docset_files(docset)
    ids = set(files)
    (out / "qrels").mkdir(parents=True, exist_ok=True)
    with (out / "corpus.jsonl").open("w", encoding="utf-8") as f:
        for name in files:
            f.write(json.dumps({"_id": name, "title": "", "text": (docset / name).read_text("utf-8")}) + "\n")
    asked = questions(docset)
    with (out / "queries.jsonl").open("w", encoding="utf-8") as q, (out / "qrels" / "test.tsv").open("w") as r:
        r.write("query-id\tcorpus-id\tscore\n")
        for n, (text, sources) in enumerate(asked):
            missing = [s for s in sources if s not in ids]
            if missing:
                raise ValueError(f"{text!r} names files the set lacks: {missing}")
            q.write(json.dumps({"_id": f"q{n}", "text": text}) + "\n")
            for s in sources:
                r.write(f"q{n}\t{s}\t1\n")
    return len(asked)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", help="folder to write corpus.jsonl, queries.jsonl and qrels/test.tsv into")
    ap.add_argument("--docset", default=str(DOCSET))
    args = ap.parse_args(argv)
    n = export(Path(args.docset), Path(args.out))
    print(f"{n} queries written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
