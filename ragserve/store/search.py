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
from dataclasses import dataclass
from typing import Any

import numpy as np

from ragserve.api.documents import RETRIEVAL_MODES
from ragserve.store.filters import filter_sql
from ragserve.store.lexical import FTS_TABLE, MAX_QUERY_TOKENS, LexicalQuery, in_index, lexical_query
from ragserve.store.mirror import FaissMirror
from ragserve.store.readers import Readers
from ragserve.store.schema import chunked
from ragserve.store.types import DimensionMismatchError, SearchCandidates, SearchHit

#: The most query terms a lexical search weighs and searches (every term the parser keeps).
MAX_WEIGHED_TERMS = MAX_QUERY_TOKENS


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
        SearchHit(r[1], r[2], r[3], r[4], score, json.loads(r[5]), index=index)
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


def terms_held(db: sqlite3.Connection, index: str, query: LexicalQuery, ids: list[int]) -> dict[int, list[int]]:
    """Which of ``query``'s terms (their positions in ``query.terms``) each of ``ids`` (rows of
    ``index``) contains: one query per term over the rowid range the ids span, kept to the ids
    here. FTS5 seeks a rowid range in its doclists but runs ``rowid IN (...)`` as one full-text
    lookup per listed id: with 60 candidates and 3 terms that was 2.5 ms a shard, the range
    0.08 ms (docs/benchmarks.md). The range walks at most each term's postings in this index,
    which the BM25 query over the same terms has just walked."""
    held: dict[int, list[int]] = {i: [] for i in ids}
    if not ids:
        return held
    lo, hi = min(ids), max(ids)
    for pos, term in enumerate(query.terms):
        for (i,) in db.execute(
            f"SELECT rowid FROM {FTS_TABLE} WHERE {FTS_TABLE} MATCH ? AND rowid BETWEEN ? AND ?",
            (in_index(index, term), lo, hi),
        ):
            if i in held:
                held[i].append(pos)
    return held


def idf(rows_with_term: int, rows: int) -> float:
    """A term's inverse document frequency: Lucene's BM25 form, ln(1 + (N - n + 0.5) / (n + 0.5)),
    positive for every n (a term in every row still weighs a little) and largest for a term in
    no row."""
    return math.log(1.0 + (rows - rows_with_term + 0.5) / (rows_with_term + 0.5))


@dataclass(frozen=True)
class TermWeights:
    """What a lexical search of one shard searches with and how much each term tells.

    ``searched``: the terms searched, in query order; ``weights``: each one's IDF in this index;
    ``total``: the IDF of every term of the query, the searched ones, those left out for cost and
    those no row holds, so that a hit's ``coverage`` (the share of ``total`` its text holds) means
    the same whatever was left out; ``absent``: how many terms no row of the index holds."""

    searched: LexicalQuery
    weights: tuple[float, ...]
    total: float
    absent: int

    def coverage(self, held: list[int]) -> float:
        """The share of the query's information in a text that holds the searched terms at
        positions ``held``."""
        return sum(self.weights[p] for p in held) / self.total if self.total else 0.0


def term_weights(
    db: sqlite3.Connection, index: str, query: LexicalQuery, rows: int, max_postings: int | None
) -> TermWeights:
    """Weigh ``query``'s terms (at most ``MAX_WEIGHED_TERMS``) by their IDF among ``index``'s
    ``rows`` rows and choose the ones to search: rarest first while the rows they match add up to
    at most ``max_postings`` (None: all). Each count walks only this index's postings and stops
    past the bound (``max_postings + 1``, where a term could not be searched anyway), so weighing
    is bounded too and another index's rows never count. A term counted at the bound is weighed as
    if it matched that many rows, which overweighs a frequent one in an index much larger than the
    bound (at 50,000 rows: 3.2 for a term in a quarter of them, whose IDF is 1.4; a term in one row
    weighs 10.4), so there every coverage of a query holding such a term is lower than its share.
    The bound counts matches, not postings walked: a phrase term (``"xr 7720"``) that few rows
    hold is counted by walking its words' postings to their end (32 phrases of two common words
    at 50,000 rows: 35 ms, where 64 common words take 16 ms)."""
    terms = query.terms[:MAX_WEIGHED_TERMS]
    bound = max_postings + 1 if max_postings is not None else rows + 1
    counts = [
        db.execute(
            f"SELECT count(*) FROM (SELECT 1 FROM {FTS_TABLE} WHERE {FTS_TABLE} MATCH ? LIMIT ?)",
            (in_index(index, term), bound),
        ).fetchone()[0]
        for term in terms
    ]
    rows = max(rows, *counts, 1)  # the vector count may lag a concurrent write by a few rows
    weights = [idf(n, rows) for n in counts]
    kept: list[int] = []
    spent = 0
    for n, pos in sorted((n, pos) for pos, n in enumerate(counts) if n):
        if max_postings is not None and spent + n > max_postings:
            break
        kept.append(pos)
        spent += n
    kept.sort()
    return TermWeights(
        LexicalQuery(tuple(terms[p] for p in kept)),
        tuple(weights[p] for p in kept),
        sum(weights),
        sum(1 for n in counts if n == 0),
    )


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
    similarity threshold means the same in every mode; lexical hits also carry their BM25 score;
    and every hit, found by either list, its ``lexical_coverage`` (the share of the query's
    information, its terms weighed by IDF, that its text holds: what the fusion credits a lexical
    hit with, ``ragserve.rag.fusion``) and whether it contains all the query's terms. The metadata
    filter applies to both.

    ``min_match``: the ``lexical_coverage`` a lexical hit needs to be a candidate (0: any).
    ``max_postings`` bounds the lexical search's cost (``term_weights``): BM25 is computed for
    every row a term matches, so the terms are searched rarest first while the rows they match
    add up to at most this; the frequent ones left out weigh little (low IDF) and still count in
    the query's information. ``all_terms`` then means every term searched, and is never true when
    a term matches nothing here. The arguments are checked before this thread's read connection
    is opened."""
    if mode not in RETRIEVAL_MODES:
        raise ValueError(f"mode must be one of {', '.join(RETRIEVAL_MODES)}")
    query = query_vector(mirror, index, vector, k)
    db = readers.get()
    dense_pairs = dense(db, mirror, index, query, k, metadata_filter) if mode != "lexical" else []
    if dense_pairs is None:  # the filter matches nothing in this index
        return SearchCandidates()
    lex = lexical_query(text) if mode != "dense" else LexicalQuery(())
    terms = term_weights(db, index, lex, mirror.ntotal(index), max_postings) if lex else None
    searched = terms.searched if terms is not None else LexicalQuery(())
    lexical_pairs = lexical(db, index, searched, 3 * k if min_match > 0 else k, metadata_filter) if searched else []
    dense_ids = {i for i, _ in dense_pairs}
    held = terms_held(db, index, searched, list(dense_ids | {i for i, _ in lexical_pairs})) if searched else {}
    coverage = {i: terms.coverage(h) for i, h in held.items()} if terms is not None else {}
    lexical_scores = dict([(i, s) for i, s in lexical_pairs if coverage[i] >= min_match - 1e-9][:k])
    rows = chunk_rows(db, list(dense_ids))
    lexical_only = [i for i in lexical_scores if i not in dense_ids]
    rows.update(chunk_rows(db, lexical_only, vectors=True))
    complete = terms is not None and bool(searched) and not terms.absent

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
            complete and len(held.get(i, ())) == len(searched.terms),
            coverage.get(i, None if terms is None else 0.0),  # nothing searched: holds none of it
            index,
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
