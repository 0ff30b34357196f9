"""How this subset of CISI was made (run from the repository root with the full collection beside it):

    python tests/data/cisi-mini/make_subset.py ../shared/data/cisi-beir tests/data/cisi-mini

The judged queries with at most 15 relevant documents (23 of 76: a small corpus can hold all their
relevant documents), every document judged relevant to one of them, and other documents of the
collection drawn at random (seed 24) up to 400 in all. Queries, documents and judgements are
CISI's own, unchanged.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

MAX_RELEVANT = 15
DOCUMENTS = 400
SEED = 24


def main(src: Path, dest: Path) -> None:
    corpus = [json.loads(line) for line in (src / "corpus.jsonl").open(encoding="utf-8") if line.strip()]
    queries = {q["_id"]: q for q in map(json.loads, (src / "queries.jsonl").open(encoding="utf-8"))}
    qrels: dict[str, dict[str, int]] = {}
    for n, line in enumerate((src / "qrels" / "test.tsv").open(encoding="utf-8")):
        q, d, r = line.rstrip("\n").split("\t")
        if n and int(r) > 0:
            qrels.setdefault(q, {})[d] = int(r)
    kept = {q: rels for q, rels in qrels.items() if len(rels) <= MAX_RELEVANT}
    relevant = {d for rels in kept.values() for d in rels}
    others = sorted(d["_id"] for d in corpus if d["_id"] not in relevant)
    chosen = relevant | set(random.Random(SEED).sample(others, DOCUMENTS - len(relevant)))
    (dest / "qrels").mkdir(parents=True, exist_ok=True)
    with (dest / "corpus.jsonl").open("w", encoding="utf-8") as f:
        for d in corpus:
            if d["_id"] in chosen:
                f.write(json.dumps(d, ensure_ascii=False) + "\n")
    with (dest / "queries.jsonl").open("w", encoding="utf-8") as f:
        for q in sorted(kept, key=int):
            f.write(json.dumps(queries[q], ensure_ascii=False) + "\n")
    with (dest / "qrels" / "test.tsv").open("w", encoding="utf-8") as f:
        f.write("query-id\tcorpus-id\tscore\n")
        for q in sorted(kept, key=int):
            for d, r in sorted(kept[q].items(), key=lambda x: int(x[0])):
                f.write(f"{q}\t{d}\t{r}\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
