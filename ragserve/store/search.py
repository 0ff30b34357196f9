"""A shard's search: dense (FAISS) and lexical (FTS5/BM25) candidates, with metadata filters.

Functions of what they read, passed explicitly: the calling thread's read connection (SQLite, for
filters, the lexical index and the chunk rows) and the shard's ``FaissMirror`` (for dense scores).
A search takes no write lock: FAISS is read under the mirror's lock only, and every hit is re-read
from SQLite, so a chunk deleted concurrently is dropped, not returned.

A metadata filter selects the matching chunk ids in SQLite first and FAISS scores only those, so a
filter never starves a dense result; the lexical search joins the documents instead. Lexical
statistics are the whole shard's (docs/architecture.md §6): the FTS5 query is ANDed with the index's
own token, so only this index's rows match, but BM25 weighs them by every index's rows.
"""

from __future__ import annotations

import json
import math
import sqlite3
from typing import Any

import numpy as np

from ragserve.api.documents import RETRIEVAL_MODES
from ragserve.store.filters import filter_sql
from ragserve.store.lexical import FTS_TABLE, LexicalQuery, in_index, lexical_query
from ragserve.store.mirror import FaissMirror
from ragserve.store.readers import Readers
from ragserve.store.schema import chunked
from ragserve.store.types import DimensionMismatchError, SearchCandidates, SearchHit

MAX_COUNTED_TERMS = 16  # a lexical search considers a query's first 16 content words


def query_vector(mirror: FaissMirror, index: str, vector: np.ndarray, k: int) -> np.ndarray:
    """``vector`` as one float32 query row for ``index``; ``IndexNotFoundError``, ``ValueError``
    (``k`` < 1) or ``DimensionMismatchError`` otherwise, in that order."""
    dim = mirror.require(index)
    if k < 1:
        raise ValueError("k must be >= 1")
    query = np.ascontiguousarray(vector, dtype=np.float32).reshape(1, -1)
    if query.shape[1] != dim:
        raise DimensionMismatchError(f"index {index!r} holds {dim}-d vectors, query is {query.shape[1]}-d")
    return query


def dense(
    db: sqlite3.Connection,
    mirror: FaissMirror,
    index: str,
    query: np.ndarray,
    k: int,
    metadata_filter: dict[str, Any] | None,
) -> list[tuple[int, float]] | None:
    """(chunk id, cosine) of the top ``k`` by FAISS; None when the filter matches nothing. A
    filter selects ids in SQLite first and FAISS scores only those, so it never starves the result."""
    allowed = None
    if metadata_filter:
        cond, args = filter_sql(metadata_filter, "d.metadata")
        ids = [
            r[0]
            for r in db.execute(
                "SELECT c.id FROM chunks c JOIN documents d ON d.index_name = c.index_name AND d.doc_id = c.doc_id "
                f"WHERE c.index_name = ? AND {cond}",
                (index, *args),
            )
        ]
        if not ids:
            return None
        allowed = ids
    found = mirror.search(index, query, k, allowed)
    if found is None:  # the index holds no vector
        return []
    scores, ids_found = found
    return [(int(i), float(s)) for i, s in zip(ids_found[0], scores[0], strict=True) if i >= 0]


def chunk_rows(db: sqlite3.Connection, ids: list[int], *, vectors: bool = False) -> dict[int, tuple[Any, ...]]:
    """Chunk rows with their document's metadata, by id; (id, doc_id, node_id, chunk_index,
    text, metadata[, vector]). A chunk deleted meanwhile is simply absent."""
    rows: dict[int, tuple[Any, ...]] = {}
    extra = ", c.vector" if vectors else ""
    for part in chunked(ids):
        marks = ",".join("?" * len(part))
        rows.update(
            (r[0], r)
            for r in db.execute(
                f"SELECT c.id, c.doc_id, c.node_id, c.chunk_index, c.text, d.metadata{extra} FROM chunks c "
                "JOIN documents d ON d.index_name = c.index_name AND d.doc_id = c.doc_id "
                f"WHERE c.id IN ({marks})",
                part,
            )
        )
    return rows


def dense_search(
    readers: Readers,
    mirror: FaissMirror,
    index: str,
    vector: np.ndarray,
    k: int,
    metadata_filter: dict[str, Any] | None = None,
) -> list[SearchHit]:
    """Top ``k`` chunks by cosine score (dense only). The arguments are checked before this
    thread's read connection is opened."""
    query = query_vector(mirror, index, vector, k)
    db = readers.get()
    pairs = dense(db, mirror, index, query, k, metadata_filter)
    if not pairs:
        return []
    rows = chunk_rows(db, [i for i, _ in pairs])
    return [
        SearchHit(r[1], r[2], r[3], r[4], score, json.loads(r[5]))
        for i, score in pairs
        if (r := rows.get(i)) is not None
    ]


def lexical(
    db: sqlite3.Connection, index: str, query: LexicalQuery, k: int, metadata_filter: dict[str, Any] | None
) -> list[tuple[int, float]]:
    """(chunk id, BM25 score, higher better) of the top ``k`` lexical matches in ``index``.

    The query is ANDed with the index's own token (``LexicalQuery.match_in``), so FTS5 returns
    and ranks this index's matching rows only; the BM25 statistics it ranks them by (row count,
    average length, each term's document frequency) are the whole shard's, so another index's
    text shifts the scores and order of these rows (docs/architecture.md §6); a metadata
    filter joins the documents."""
    match = query.match_in(index)
    if not metadata_filter:
        return [
            (int(i), -float(r))
            for i, r in db.execute(
                f"SELECT rowid, rank FROM {FTS_TABLE} WHERE {FTS_TABLE} MATCH ? ORDER BY rank LIMIT ?", (match, k)
            )
        ]
    cond, args = filter_sql(metadata_filter, "d.metadata")
    return [
        (int(i), -float(r))
        for i, r in db.execute(
            f"SELECT c.id, {FTS_TABLE}.rank FROM {FTS_TABLE} JOIN chunks c ON c.id = {FTS_TABLE}.rowid "
            "JOIN documents d ON d.index_name = c.index_name AND d.doc_id = c.doc_id "
            f"WHERE {FTS_TABLE} MATCH ? AND {cond} ORDER BY {FTS_TABLE}.rank LIMIT ?",
            (match, *args, k),
        )
    ]


def terms_matched(db: sqlite3.Connection, index: str, query: LexicalQuery, ids: list[int]) -> dict[int, int]:
    """How many of ``query``'s terms each of ``ids`` (rows of ``index``) contains: one query per
    term over the rowid range the ids span, kept to the ids here. FTS5 seeks a rowid range in its
    doclists but runs ``rowid IN (...)`` as one full-text lookup per listed id: with 60
    candidates and 3 terms that was 2.5 ms a shard, the range 0.08 ms (docs/benchmarks.md). The
    range walks at most each term's postings in this index, which the BM25 query over the same
    terms has just walked."""
    counts = dict.fromkeys(ids, 0)
    if not ids:
        return counts
    lo, hi = min(ids), max(ids)
    for term in query.terms:
        for (i,) in db.execute(
            f"SELECT rowid FROM {FTS_TABLE} WHERE {FTS_TABLE} MATCH ? AND rowid BETWEEN ? AND ?",
            (in_index(index, term), lo, hi),
        ):
            if i in counts:
                counts[i] += 1
    return counts


def selective(db: sqlite3.Connection, index: str, query: LexicalQuery, max_postings: int) -> tuple[LexicalQuery, int]:
    """The terms of ``query`` to search ``index`` with, rarest first while the rows of ``index``
    they match add up to at most ``max_postings`` (each count stops at that bound and walks only
    this index's postings, so counting is cheap too and another index's rows never count); and
    how many terms match no row of ``index`` at all."""
    counts: list[tuple[int, int]] = []
    absent = 0
    for pos, term in enumerate(query.terms[:MAX_COUNTED_TERMS]):
        n = db.execute(
            f"SELECT count(*) FROM (SELECT 1 FROM {FTS_TABLE} WHERE {FTS_TABLE} MATCH ? LIMIT ?)",
            (in_index(index, term), max_postings + 1),
        ).fetchone()[0]
        if n:
            counts.append((n, pos))
        else:
            absent += 1
    kept: set[int] = set()
    spent = 0
    for n, pos in sorted(counts):
        if spent + n > max_postings:
            break
        kept.add(pos)
        spent += n
    return LexicalQuery(tuple(t for pos, t in enumerate(query.terms) if pos in kept)), absent


def candidates(
    readers: Readers,
    mirror: FaissMirror,
    index: str,
    vector: np.ndarray,
    text: str,
    k: int,
    *,
    mode: str = "hybrid",
    metadata_filter: dict[str, Any] | None = None,
    min_match: float = 0.0,
    max_postings: int | None = None,
) -> SearchCandidates:
    """A retrieval's candidates from this shard, in one call: the top ``k`` by cosine (unless
    ``mode`` is ``lexical``) and the top ``k`` by BM25 over ``text`` (unless it is ``dense``).
    Every hit carries its cosine score (lexical-only ones from their stored vector), so a
    similarity threshold means the same in every mode; lexical hits also carry their BM25 score,
    and every hit whether it contains all the query's terms. The metadata filter applies to both.

    ``min_match``: the share of the query's terms a lexical hit must contain (rounded up, at
    least one), BM25's "minimum should match". A hit sharing one common word with a long
    question is no evidence, but rank fusion would credit it as much as a real match; so the
    top ``3k`` matches are counted and the weak ones left out. Terms that no row contains count
    in the share (a chunk with one of six words of a question is weak evidence, even when four
    of the six occur nowhere); terms left out for cost (below) do not.

    ``max_postings`` bounds the lexical search's cost (``selective``): BM25 is computed for
    every row a term matches, so the terms are taken rarest first while the rows they match
    add up to at most this; the frequent ones left out weigh little in BM25 anyway (low IDF).
    ``all_terms`` then means every term searched, and is never true when a term matches
    nothing here. The arguments are checked before this thread's read connection is opened."""
    if mode not in RETRIEVAL_MODES:
        raise ValueError(f"mode must be one of {', '.join(RETRIEVAL_MODES)}")
    query = query_vector(mirror, index, vector, k)
    db = readers.get()
    dense_pairs = dense(db, mirror, index, query, k, metadata_filter) if mode != "lexical" else []
    if dense_pairs is None:  # the filter matches nothing in this index
        return SearchCandidates()
    lex = lexical_query(text) if mode != "dense" else LexicalQuery(())
    absent = 0  # terms no row here contains: they still count in the share a hit must match
    if lex and max_postings is not None:
        lex, absent = selective(db, index, lex, max_postings)
    need = max(1, math.ceil(min_match * (len(lex.terms) + absent) - 1e-9))
    lexical_pairs = lexical(db, index, lex, 3 * k if need > 1 else k, metadata_filter) if lex else []
    dense_ids = {i for i, _ in dense_pairs}
    matched = terms_matched(db, index, lex, list(dense_ids | {i for i, _ in lexical_pairs})) if lex else {}
    lexical_scores = dict([(i, s) for i, s in lexical_pairs if matched[i] >= need][:k])
    rows = chunk_rows(db, list(dense_ids))
    lexical_only = [i for i in lexical_scores if i not in dense_ids]
    rows.update(chunk_rows(db, lexical_only, vectors=True))

    def hit(i: int, score: float) -> SearchHit:
        r = rows[i]
        return SearchHit(
            r[1],
            r[2],
            r[3],
            r[4],
            score,
            json.loads(r[5]),
            lexical_scores.get(i),
            bool(lex) and not absent and matched.get(i, 0) == len(lex.terms),
        )

    cosines = dict(dense_pairs)
    for i in lexical_only:
        if i in rows:
            cosines[i] = float(np.frombuffer(rows[i][6], dtype=np.float32) @ query[0])
    return SearchCandidates(
        dense=[hit(i, s) for i, s in dense_pairs if i in rows],
        lexical=[hit(i, cosines[i]) for i in lexical_scores if i in rows],
    )


#: The most words ``mentioned`` looks up in one call.
MAX_MENTION_WORDS = 16


def mentioned(readers: Readers, index: str, words: list[str]) -> list[str]:
    """Those of ``words`` (at most ``MAX_MENTION_WORDS``) that some chunk of ``index`` holds, as
    lexical search reads them (``"Node.js"`` is the phrase ``"node js"``): one FTS5 lookup of at most
    one row each, in this index's postings only. A word that is only punctuation is never held."""
    db = readers.get()
    out: list[str] = []
    for word in words[:MAX_MENTION_WORDS]:
        query = lexical_query(word)
        if (
            query
            and db.execute(
                f"SELECT 1 FROM {FTS_TABLE} WHERE {FTS_TABLE} MATCH ? LIMIT 1", (query.match_in(index),)
            ).fetchone()
        ):
            out.append(word)
    return out
