"""The shard's lexical index (FTS5): safe queries, written and deleted with the chunk rows, filtered
like dense hits, durable through export/import, and built on open for shards written before it."""

from __future__ import annotations

import sqlite3
import time

import numpy as np
import pytest

from ragserve.store import ChunkWrite, DocumentWrite, Shard, read_export
from ragserve.store.lexical import FTS_TABLE, MAX_PHRASE_TOKENS, MAX_QUERY_CHARS, MAX_QUERY_TOKENS, lexical_query
from ragserve.store.search import idf, terms_held
from ragserve.store.types import IndexNotFoundError

TEXTS = {
    "bracket": "The XR-7720 bracket mounts the pump on the frame.",
    "install": "Installing the pump takes ten minutes with a 10 mm wrench.",
    "russian": "Ремонт насоса: замените уплотнение.",
    "chinese": "安装水泵需要十分钟",
    "other": "Unrelated words about gardening and tomatoes.",
}


def vec(seed: int, dim: int = 8) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=dim).astype(np.float32)
    return v / np.linalg.norm(v)


def doc(doc_id: str, text: str, seed: int, **meta: object) -> DocumentWrite:
    return DocumentWrite(doc_id, text, dict(meta), f"h-{doc_id}", [ChunkWrite(f"{doc_id}-0", 0, text, vec(seed))])


@pytest.fixture
def shard(tmp_path):
    s = Shard(tmp_path / "s")
    s.upsert_documents("kb", [doc(k, t, i, kind="a" if i % 2 else "b") for i, (k, t) in enumerate(TEXTS.items())])
    yield s
    s.close()


def lexical_ids(shard: Shard, text: str, **kw: object) -> list[str]:
    return [h.doc_id for h in shard.search_candidates("kb", vec(99), text, 5, mode="lexical", **kw).lexical]


@pytest.mark.parametrize(
    "text",
    [
        '"',
        '""',
        '"unbalanced',
        "pump*",
        "*",
        "NEAR(pump bracket)",
        "pump NEAR bracket",
        "-pump",
        "pump -bracket",
        "AND",
        "OR NOT",
        "pump AND OR NOT bracket",
        "(pump",
        "kind:a",
        "^pump",
        "pump + bracket",
        "'",
        "\\",
        ";--",
        "",
        "   ",
        "?!.,;",
        "…",
        "🙂",
        "a the of",
        "насоса",
        "安装水泵需要十分钟",
        "x" * 5000,
        "word " * 500,
    ],
)
def test_no_user_text_is_a_query_syntax_error(shard: Shard, text: str) -> None:
    shard.search_candidates("kb", vec(0), text, 5)  # would raise sqlite3.OperationalError


def test_query_builder_quotes_every_word_and_drops_what_selects_nothing() -> None:
    assert lexical_query('the "XR-7720," bracket?').terms == ('"xr 7720"', '"bracket"')  # a phrase of its tokens
    assert lexical_query('say "hi"').terms == ('"say"', '"hi"')  # inner quotes stripped at the edges
    assert lexical_query('a"b').terms == ('"a b"',)  # a quote inside a word separates tokens, as in FTS5
    assert lexical_query("?!. -- *").terms == ()
    assert not lexical_query("")
    assert lexical_query("How do I install it?").terms == ('"install"',)
    assert lexical_query("what is it").terms == ('"what"', '"is"', '"it"')  # only stopwords: kept
    assert lexical_query("Pump pump PUMP").terms == ('"pump"',)


def test_lexical_search_finds_words_stems_part_numbers_and_non_latin_text(shard: Shard) -> None:
    assert lexical_ids(shard, "XR-7720") == ["bracket"]
    assert lexical_ids(shard, "install") == ["install"]  # porter: installing ~ install
    assert lexical_ids(shard, "насоса") == ["russian"]
    assert lexical_ids(shard, "安装水泵需要十分钟") == ["chinese"]
    assert set(lexical_ids(shard, "pump wrench")) == {"bracket", "install"}
    assert lexical_ids(shard, "pump wrench")[0] == "install"  # both terms beat one


def test_hits_carry_cosine_bm25_and_whether_every_term_matched(shard: Shard) -> None:
    q = vec(1)  # the "install" chunk's own vector
    cand = shard.search_candidates("kb", q, "pump wrench", 5)
    lex = {h.doc_id: h for h in cand.lexical}
    assert lex["install"].score == pytest.approx(1.0, abs=1e-5)  # cosine from the stored vector
    assert lex["bracket"].score == pytest.approx(float(vec(0) @ q), abs=1e-5)
    assert lex["install"].lexical_score > lex["bracket"].lexical_score > 0
    assert lex["install"].all_terms and not lex["bracket"].all_terms
    dense = {h.doc_id: h for h in cand.dense}
    assert dense["install"].all_terms and dense["other"].lexical_score is None and not dense["other"].all_terms
    assert shard.search_candidates("kb", q, "pump", 5, mode="dense").lexical == []
    assert shard.search_candidates("kb", q, "pump", 5, mode="lexical").dense == []
    with pytest.raises(ValueError, match="mode"):
        shard.search_candidates("kb", q, "pump", 5, mode="bm25")


def test_metadata_filter_applies_to_lexical_hits(shard: Shard) -> None:
    assert set(lexical_ids(shard, "pump")) == {"bracket", "install"}
    assert lexical_ids(shard, "pump", metadata_filter={"kind": "b"}) == ["bracket"]
    assert lexical_ids(shard, "pump", metadata_filter={"kind": "nope"}) == []
    cand = shard.search_candidates("kb", vec(0), "pump", 5, metadata_filter={"kind": "a"})
    assert {h.doc_id for h in cand.dense + cand.lexical} <= {"install", "chinese"}


def test_lexical_rows_follow_updates_deletes_and_drops(shard: Shard) -> None:
    shard.upsert_documents("kb", [doc("bracket", "A completely new text about valves.", 0)])
    assert lexical_ids(shard, "XR-7720") == []
    assert lexical_ids(shard, "valves") == ["bracket"]
    shard.delete_documents("kb", ["install"])
    assert lexical_ids(shard, "wrench") == []
    shard.upsert_documents("other", [doc("x", "wrench in another index", 7)])
    assert lexical_ids(shard, "wrench") == []  # another index's rows never leak in
    assert shard.verify() == []
    shard.drop_index("kb")
    n = shard._write.execute(f"SELECT COUNT(*) FROM {FTS_TABLE} WHERE {FTS_TABLE} MATCH 'pump'").fetchone()[0]
    assert n == 0
    assert shard.verify() == []


def test_an_index_shared_shard_still_ranks_this_index_exactly(tmp_path) -> None:
    s = Shard(tmp_path / "s")
    s.upsert_documents("big", [doc(f"b{i}", f"pump pump pump note {i}", i) for i in range(60)])
    s.upsert_documents("small", [doc("s1", "pump once", 1), doc("s2", "a pump and a pump", 2)])
    hits = s.search_candidates("small", vec(0), "pump", 5, mode="lexical").lexical
    assert [h.doc_id for h in hits] == ["s2", "s1"]  # past the fast path's window into "big"
    s.close()


def test_export_and_import_carry_the_lexical_index(shard: Shard, tmp_path) -> None:
    shard.export_index("kb", tmp_path / "part.sqlite")
    _, docs = read_export(tmp_path / "part.sqlite")
    other = Shard(tmp_path / "t")
    other.upsert_documents("copy", list(docs))
    assert [h.doc_id for h in other.search_candidates("copy", vec(0), "XR-7720", 5, mode="lexical").lexical] == [
        "bracket"
    ]
    assert other.verify() == []
    other.close()


def test_a_shard_from_before_the_lexical_index_gains_it_on_open(tmp_path) -> None:
    s = Shard(tmp_path / "s")
    s.upsert_documents("kb", [doc(k, t, i) for i, (k, t) in enumerate(TEXTS.items())])
    s.close()
    db = sqlite3.connect(tmp_path / "s" / "shard.sqlite")  # back to schema version 2
    for trigger in ("chunks_fts_insert", "chunks_fts_delete", "chunks_fts_update"):
        db.execute(f"DROP TRIGGER {trigger}")
    db.execute(f"DROP TABLE {FTS_TABLE}")
    db.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
    db.commit()
    db.close()
    s = Shard(tmp_path / "s")
    assert s._write.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0] == "4"
    assert [h.doc_id for h in s.search_candidates("kb", vec(0), "XR-7720", 5, mode="lexical").lexical] == ["bracket"]
    assert s.verify() == []
    s.close()


def test_coverage_is_the_share_of_the_querys_idf_a_hit_holds(shard: Shard) -> None:
    hits = {
        h.doc_id: h for h in shard.search_candidates("kb", vec(99), "pump wrench minutes", 5, mode="lexical").lexical
    }
    # five rows of "kb": "pump" is in two, "wrench" and "minutes" in one (the install chunk)
    pump, rare = idf(2, 5), idf(1, 5)
    assert hits["install"].lexical_coverage == pytest.approx(1.0)
    assert hits["bracket"].lexical_coverage == pytest.approx(pump / (pump + 2 * rare))
    # a word no row holds weighs the most (n = 0): the query's information is mostly not here
    lone = shard.search_candidates("kb", vec(99), "pump xylophone", 5, mode="lexical").lexical
    assert [h.lexical_coverage for h in lone] == pytest.approx([pump / (pump + idf(0, 5))] * 2)
    assert not any(h.all_terms for h in lone)
    # dense candidates carry their coverage too; dense mode weighs no term
    hybrid = shard.search_candidates("kb", vec(3), "gardening pump", 5)
    assert {h.doc_id: h.lexical_coverage for h in hybrid.dense}["install"] == pytest.approx(
        idf(2, 5) / (idf(2, 5) + idf(1, 5))
    )
    assert all(h.lexical_coverage is None for h in shard.search_candidates("kb", vec(3), "pump", 5, mode="dense").dense)
    # hybrid with no term any row holds: nothing searched, and every candidate holds none of the query
    nothing = shard.search_candidates("kb", vec(3), "xylophone quasar", 5).dense
    assert nothing and all(h.lexical_coverage == 0.0 for h in nothing)


def test_min_match_leaves_out_hits_holding_too_little_of_the_query(shard: Shard) -> None:
    assert set(lexical_ids(shard, "pump wrench minutes")) == {"bracket", "install"}
    # the bracket holds only "pump", the most common of the three words
    assert lexical_ids(shard, "pump wrench minutes", min_match=0.5) == ["install"]
    assert lexical_ids(shard, "pump", min_match=1.0) != []  # one term: holding it is all of it
    # words found nowhere still count: "pump" is little of "pump xylophone quasar"
    assert lexical_ids(shard, "pump xylophone quasar", min_match=0.3, max_postings=100) == []


def test_idf_is_positive_and_falls_with_the_rows_holding_a_term() -> None:
    weights = [idf(n, 1000) for n in (0, 1, 10, 500, 1000)]
    assert weights == sorted(weights, reverse=True) and weights[-1] > 0


def test_max_postings_searches_the_rarest_terms_within_the_bound(tmp_path) -> None:
    s = Shard(tmp_path / "s")
    s.upsert_documents(
        "kb", [doc(f"c{i}", f"common filler text {i}", i) for i in range(30)] + [doc("r", "common and zebra", 99)]
    )

    def ids(text: str, **kw: object) -> list[str]:
        return [h.doc_id for h in s.search_candidates("kb", vec(0), text, 50, mode="lexical", **kw).lexical]

    assert len(ids("common zebra")) == 31
    assert ids("common zebra", max_postings=10) == ["r"]  # "common" (31 rows) is past the bound
    assert ids("common", max_postings=10) == []  # nothing selective enough: no lexical search
    hit = s.search_candidates("kb", vec(0), "zebra unicorn", 5, mode="lexical", max_postings=10).lexical[0]
    assert hit.doc_id == "r" and not hit.all_terms  # "unicorn" matches nothing: not every term is there
    s.close()


def test_terms_are_counted_for_exactly_the_asked_rows(tmp_path):
    """Which terms each candidate holds (``lexical_coverage``, ``all_terms``) is read over the rowid
    range the candidates span; rows in that range that are not candidates, rows of another index
    in it, and candidates at either end of it must all come out as a lookup row by row says."""
    rng = np.random.default_rng(7)
    words = ["pump", "valve", "seal", "bracket", "wrench", "frame", "gasket", "hose"]
    s = Shard(tmp_path / "s")
    try:
        for n in range(60):  # two indexes interleaved in one rowid sequence
            text = " ".join(rng.choice(words, size=4))
            s.upsert_documents("kb" if n % 3 else "other", [doc(f"d{n}", text, n)])
        query = lexical_query("pump valve seal gasket")
        all_ids = [r[0] for r in s._readers.get().execute("SELECT id FROM chunks WHERE index_name = 'kb' ORDER BY id")]
        for ids in (all_ids, all_ids[5:40:3], [all_ids[0], all_ids[-1]], [all_ids[17]], []):
            expected = {
                i: [
                    pos
                    for pos, t in enumerate(query.terms)
                    if s._readers.get()
                    .execute(f"SELECT count(*) FROM {FTS_TABLE} WHERE {FTS_TABLE} MATCH ? AND rowid = ?", (t, i))
                    .fetchone()[0]
                ]
                for i in ids
            }
            assert terms_held(s._readers.get(), "kb", query, ids) == expected
            if ids is all_ids:  # the data has rows matching none, some and all of the terms
                assert {0, 1, 2}.issubset({len(held) for held in expected.values()})
    finally:
        s.close()


# Characters FTS5 cannot take inside a quoted phrase (NUL ends its string, an unescaped quote ends
# the phrase), ones the driver cannot encode (a lone surrogate), and the other control, format and
# separator characters: a query holding any of them searches its words, never fails.
ODD_CHARS = ["\x00", "\x01", "\x08", "\x1b", "\x1f", "\x7f", "\x85", "\u200b", "\u2028", "\ufeff", "\ud800", '"']


@pytest.mark.parametrize("char", ODD_CHARS)
@pytest.mark.parametrize("mode", ["hybrid", "lexical"])
def test_control_and_unencodable_characters_in_a_query_are_word_breaks(shard: Shard, char: str, mode: str) -> None:
    for text in (f"XR{char}7720", f"{char}XR-7720{char}", f"bracket{char * 50}", char * 1000):
        hits = shard.search_candidates("kb", vec(0), text, 5, mode=mode, max_postings=2000).lexical
        assert [h.doc_id for h in hits] == ([] if text == char * 1000 else ["bracket"]), text
    query = lexical_query(f"xr{char}7720 pump{char}")
    assert query.terms == (('"xr"', '"7720"') if char.isspace() else ('"xr 7720"',)) + ('"pump"',)


def test_a_lexical_query_is_bounded_in_characters_and_tokens() -> None:
    one_word = lexical_query("qk-" * 200_000)  # 600 KB: one word of 200,000 tokens
    assert one_word.terms == ('"' + " ".join(["qk"] * MAX_PHRASE_TOKENS) + '"',)
    many = lexical_query(" ".join(f"w{i}-x{i}" for i in range(5000)))  # every word two tokens
    assert many.tokens == MAX_QUERY_TOKENS and len(many.terms) == MAX_QUERY_TOKENS // 2
    past = lexical_query("pump " + " " * MAX_QUERY_CHARS + "zebra")  # only the beginning is read
    assert past.terms == ('"pump"',)
    cut = lexical_query("x" * (MAX_QUERY_CHARS - 3) + " pumpkin")  # a word cut at the bound is left out
    assert cut.terms == ('"' + "x" * (MAX_QUERY_CHARS - 3) + '"',)
    for query in (one_word, many, lexical_query("a-" * 500_000), lexical_query("\x00a" * 500_000)):
        assert query.tokens <= MAX_QUERY_TOKENS
        assert all(len(t[1:-1].split()) <= MAX_PHRASE_TOKENS for t in query.terms)


def test_a_huge_hyphenated_word_searches_only_its_first_tokens(tmp_path) -> None:
    s = Shard(tmp_path / "s")
    try:
        s.upsert_documents("kb", [doc(f"d{i}", f"qk-{i} qk-qk qk", i) for i in range(300)])
        t0 = time.thread_time()  # CPU seconds of this thread (the search runs in it): not the machine's load
        for mode in ("hybrid", "lexical"):
            hits = s.search_candidates("kb", vec(0), "qk-" * 200_000, 5, mode=mode, max_postings=2000).lexical
            assert hits == []  # no row holds 16 "qk" in a row
        assert time.thread_time() - t0 < 2.0
        assert [h.doc_id for h in s.search_candidates("kb", vec(0), "qk-7", 5, mode="lexical").lexical] == ["d7"]
    finally:
        s.close()


def test_another_index_in_the_shard_cannot_crowd_out_lexical_hits(tmp_path) -> None:
    """``max_postings`` counts the rows of the index searched: another index's 2,500 rows holding
    the word leave this index's one row found (counted over the shard, the word was past the
    bound and searched nowhere)."""
    s = Shard(tmp_path / "s")
    try:
        s.upsert_documents("big", [doc(f"b{i}", f"pump note {i}", i) for i in range(2500)])
        s.upsert_documents("small", [doc("s1", "the pump once", 1), doc("s2", "a valve", 2)])
        for mode in ("hybrid", "lexical"):
            hits = s.search_candidates("small", vec(0), "pump", 5, mode=mode, max_postings=2000).lexical
            assert [h.doc_id for h in hits] == ["s1"] and hits[0].all_terms
        assert s.search_candidates("big", vec(0), "pump", 5, mode="lexical", max_postings=2000).lexical == []
        assert len(s.search_candidates("big", vec(0), "pump note", 5, mode="lexical").lexical) == 5
    finally:
        s.close()


@pytest.mark.parametrize("names", [("a.b", "a-b"), ("kb", "kb2"), ("x", "X"), ("ä", "a")])
def test_indexes_whose_names_tokenize_alike_keep_their_rows_apart(tmp_path, names: tuple[str, str]) -> None:
    s = Shard(tmp_path / "s")
    try:
        for n, name in enumerate(names):
            s.upsert_documents(name, [doc(f"{n}", "the pump", n)])
        for n, name in enumerate(names):
            assert [h.doc_id for h in s.search_candidates(name, vec(0), "pump", 5, mode="lexical").lexical] == [f"{n}"]
        assert s.verify() == []
    finally:
        s.close()


def _shard_of_schema_3(path) -> None:
    """A shard whose lexical index is schema version 3's (no ``idx`` column)."""
    s = Shard(path)
    s.upsert_documents("kb", [doc(k, t, i) for i, (k, t) in enumerate(TEXTS.items())])
    s.upsert_documents("other", [doc("o", "the XR-7720 bracket again", 9)])
    s.close()
    db = sqlite3.connect(path / "shard.sqlite")  # back to schema version 3's lexical index
    for trigger in ("chunks_fts_insert", "chunks_fts_delete", "chunks_fts_update"):
        db.execute(f"DROP TRIGGER {trigger}")
    db.execute(f"DROP TABLE {FTS_TABLE}")
    db.executescript(
        f"""CREATE VIRTUAL TABLE {FTS_TABLE} USING fts5(
            text, content='chunks', content_rowid='id', tokenize='porter unicode61');
        CREATE TRIGGER chunks_fts_insert AFTER INSERT ON chunks BEGIN
            INSERT INTO {FTS_TABLE} (rowid, text) VALUES (new.id, new.text);
        END;
        INSERT INTO {FTS_TABLE} ({FTS_TABLE}) VALUES ('rebuild');
        UPDATE meta SET value = '3' WHERE key = 'schema_version';"""
    )
    db.commit()
    db.close()


def _migrated_shard_works(path) -> None:
    s = Shard(path)
    try:
        assert s._write.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0] == "4"
        assert [h.doc_id for h in s.search_candidates("kb", vec(0), "XR-7720", 5, mode="lexical").lexical] == [
            "bracket"
        ]
        assert s.verify() == []
        s.upsert_documents("kb", [doc("bracket", "the XR-7720 bracket, revised", 1)])  # the triggers hold
        assert s.verify() == []
    finally:
        s.close()


def test_a_shard_with_the_lexical_index_of_schema_3_gets_the_per_index_one_on_open(tmp_path) -> None:
    _shard_of_schema_3(tmp_path / "s")
    _migrated_shard_works(tmp_path / "s")


_CRASH_DURING_MIGRATION = """
import os, sys
import ragserve.store.schema as schema
build = schema.create_lexical_index

steps = [0]

def crashing(conn):
    def step():
        steps[0] += 1
        if sys.argv[2] != "count" and steps[0] >= int(sys.argv[2]):
            os._exit(3)  # the process dies here: no rollback, no close
        return 0
    conn.set_progress_handler(step, 1)
    return build(conn)

schema.create_lexical_index = crashing
from ragserve.store.shard import Shard
Shard(sys.argv[1]).close()
print(steps[0])
"""


def test_a_migration_cut_short_by_a_crash_leaves_a_shard_that_migrates_on_the_next_open(tmp_path) -> None:
    """The process dies at several points of the schema-3 to schema-4 rebuild of the lexical index
    (a progress handler exits after N virtual-machine steps): the next open still migrates it, and
    lexical search, the integrity check and later writes work. Built statement by statement, a crash
    after the new table was created and before it was filled left it empty for good (and every
    update of an existing document then failed: 'database disk image is malformed')."""
    import subprocess
    import sys

    def migrate(path, until: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-c", _CRASH_DURING_MIGRATION, str(path), until]
        return subprocess.run(argv, check=False, capture_output=True, text=True)

    _shard_of_schema_3(tmp_path / "whole")
    whole = migrate(tmp_path / "whole", "count")  # how many steps a whole migration takes
    assert whole.returncode == 0, whole.stderr
    total = int(whole.stdout.split()[-1])
    for tenth in range(1, 10):
        path = tmp_path / f"cut{tenth}"
        _shard_of_schema_3(path)
        run = migrate(path, str(total * tenth // 10))
        assert run.returncode == 3, run.stderr  # it died part-way
        _migrated_shard_works(path)


def test_a_loads_swap_moves_the_lexical_rows_to_the_loaded_name(tmp_path) -> None:
    """A load imports into a staging index and renames it: the rows' index token follows, so the
    loaded index finds them lexically, the staging name does not, and the old rows are gone."""
    s = Shard(tmp_path / "s")
    try:
        s.upsert_documents("kb", [doc("old", "the XR-7720 bracket, old text", 1)])
        s.upsert_documents("staging~kb", [doc("new", "the XR-7720 bracket, new text", 2)])
        s.replace_index("staging~kb", "kb")
        assert [h.doc_id for h in s.search_candidates("kb", vec(0), "XR-7720", 5, mode="lexical").lexical] == ["new"]
        assert s.verify() == []
        n = s._readers.get().execute(f"SELECT count(*) FROM {FTS_TABLE} WHERE {FTS_TABLE} MATCH 'xr'").fetchone()[0]
        assert n == 1
    finally:
        s.close()


def test_a_decomposed_query_finds_what_the_composed_one_finds(tmp_path) -> None:
    """FTS5 folds a Latin accent within its token; a query written decomposed (NFD, as macOS file
    names and some keyboards give it) was split at its combining mark and found nothing."""
    s = Shard(tmp_path / "s")
    try:
        s.upsert_documents("kb", [doc("naive", "a na\u00efve approach to the problem", 1), doc("x", "unrelated", 2)])
        for query in ("na\u00efve", "nai\u0308ve", "NAI\u0308VE"):
            hits = s.search_candidates("kb", vec(0), query, 5, mode="lexical").lexical
            assert [h.doc_id for h in hits] == ["naive"], query
    finally:
        s.close()


def test_which_words_an_index_mentions(shard: Shard, tmp_path) -> None:
    first = next(iter(TEXTS.values()))
    word = next(w for w in first.split() if w.isalpha() and len(w) > 4)
    assert shard.mentioned("kb", [word, word.upper(), "Kubernetes", "!!!", ""]) == [word, word.upper()]
    # another index's words are not this one's
    shard.upsert_documents("other", [doc("o", "Kubernetes clusters and Helm charts.", 7)])
    assert shard.mentioned("kb", ["Kubernetes"]) == [] and shard.mentioned("other", ["kubernetes"]) == ["kubernetes"]
    with pytest.raises(IndexNotFoundError):
        shard.mentioned("missing", [word])
    # hostile words are phrases of their tokens, never FTS5 syntax
    for hostile in ['"', "NEAR(a b)", "*", "a OR b", "\ud800", "x" * 100_000]:
        assert shard.mentioned("kb", [hostile]) == []
