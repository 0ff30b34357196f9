"""The lexical side of a shard: an SQLite FTS5 index over chunk text, and user text as a safe query.

Why FTS5 inside the shard's own database: its rows are written by triggers on ``chunks``, so every
write path (upsert, delete, drop, load's swap, orphan purge) keeps it exact *in the same
transaction* as the chunk rows, and it is exactly as durable as they are; a snapshot needs nothing
extra either (an export carries chunk text, and importing it writes the rows, which index them).

Why a query builder: FTS5 has a query syntax (``"``, ``*``, ``NEAR``, ``AND``/``OR``/``NOT``,
``-``, ``:`` and parentheses), and user questions contain all of them. Every word of the user's
text becomes one quoted phrase of its letters and digits only, so nothing the user types is syntax;
the phrases are OR-ed, as BM25 ranking expects (a chunk need not contain every word). The builder
is linear in the text and bounded (``MAX_QUERY_CHARS``, ``MAX_PHRASE_TOKENS``, ``MAX_QUERY_TOKENS``):
it runs on the ingress and in every shard for each retrieval.
"""

from __future__ import annotations

import re
import sqlite3
import unicodedata
from dataclasses import dataclass

FTS_TABLE = "chunks_fts"
FTS_CONTENT = "chunks_fts_content"
# Each row's index, as one token of its own column (``idx``): ``x`` and the hex of the name's UTF-8
# bytes, so it is exactly one unicode61 token for every index name and no two names share one (the
# porter stemmer can only drop a final ``e``, which turns an odd-length token into an even one).
_IDX_SQL = "'x' || lower(hex({}))"

# External-content FTS5 over chunks.text, kept exact by triggers (see the module docstring). Its
# second column ``idx`` holds the row's index token, so a search ANDs its terms with the index's
# token and FTS5 walks only that index's postings (it seeks the term's doclist to each of the
# index's rows): another index's rows cost nothing and cannot crowd this index's out. The ranking
# weighs ``idx`` at 0. The update trigger fires when the text or the index changes (a load's swap
# renames the staging index: its rows are indexed again under the new name).
FTS_DDL = f"""
CREATE VIEW IF NOT EXISTS {FTS_CONTENT} AS
    SELECT id, text, {_IDX_SQL.format("index_name")} AS idx FROM chunks;
CREATE VIRTUAL TABLE IF NOT EXISTS {FTS_TABLE} USING fts5(
    text, idx, content='{FTS_CONTENT}', content_rowid='id', tokenize='porter unicode61');
CREATE TRIGGER IF NOT EXISTS chunks_fts_insert AFTER INSERT ON chunks BEGIN
    INSERT INTO {FTS_TABLE} (rowid, text, idx) VALUES (new.id, new.text, {_IDX_SQL.format("new.index_name")});
END;
CREATE TRIGGER IF NOT EXISTS chunks_fts_delete AFTER DELETE ON chunks BEGIN
    INSERT INTO {FTS_TABLE} ({FTS_TABLE}, rowid, text, idx)
        VALUES ('delete', old.id, old.text, {_IDX_SQL.format("old.index_name")});
END;
CREATE TRIGGER IF NOT EXISTS chunks_fts_update AFTER UPDATE OF text, index_name ON chunks BEGIN
    INSERT INTO {FTS_TABLE} ({FTS_TABLE}, rowid, text, idx)
        VALUES ('delete', old.id, old.text, {_IDX_SQL.format("old.index_name")});
    INSERT INTO {FTS_TABLE} (rowid, text, idx) VALUES (new.id, new.text, {_IDX_SQL.format("new.index_name")});
END;
"""
_TRIGGERS = ("chunks_fts_insert", "chunks_fts_delete", "chunks_fts_update")


def index_token(index: str) -> str:
    """The ``idx`` token of ``index``'s rows (what ``_IDX_SQL`` computes in SQLite)."""
    return "x" + index.encode("utf-8").hex()


# Words too common to select anything. Dropping them keeps an OR query from matching most of the
# index (the cost of a lexical search grows with the rows its terms match) and keeps "every query
# term matched" meaningful. A query made only of them keeps them.
_STOPWORDS_TEXT = """
a about above after again against all am an and any are as at be because been before being below between
both but by can could did do does doing down during each few for from further had has have having he her
here hers herself him himself his how i if in into is it its itself just me more most my myself no nor not
now of off on once only or other our ours ourselves out over own same she should so some such than that
the their theirs them themselves then there these they this those through to too under until up very was
we were what when where which while who whom why will with would you your yours yourself yourselves
"""
STOPWORDS = frozenset(_STOPWORDS_TEXT.split())

# A token: a run of letters and digits, what FTS5's unicode61 tokenizer indexes (it splits at
# everything else: punctuation, spaces, control characters, and outside Latin letters, combining
# marks; the query is composed first, see lexical_query). Matching it is linear:
# each character is looked at once, and a word without any (only punctuation) selects nothing.
_TOKEN = re.compile(r"[^\W_]+")
#: The longest query text the lexical parser looks at, in characters (a pasted page is a query
#: about its beginning, and parsing it stays a few microseconds).
MAX_QUERY_CHARS = 4096
#: The most tokens one phrase may hold: a longer word (``a-a-a-...``, a pasted hash) keeps its
#: first ones. FTS5 loads the doclist of every token of a phrase, so this bounds one phrase's cost.
MAX_PHRASE_TOKENS = 16
#: The most tokens a whole lexical query may hold, across its phrases (words past it are left out):
#: a search's cost grows with the doclists it loads, one per token.
MAX_QUERY_TOKENS = 64


@dataclass(frozen=True)
class LexicalQuery:
    """A user's text as an FTS5 query: ``match`` is the OR of ``terms``, each a quoted phrase (and a
    query of its own, to count which terms a hit contains). Empty when the text holds nothing
    searchable (only punctuation): then there is no lexical search at all."""

    terms: tuple[str, ...]

    @property
    def match(self) -> str:
        return " OR ".join(self.terms)

    def match_in(self, index: str) -> str:
        """``match`` over ``index``'s rows only (empty when the query is)."""
        return in_index(index, self.match) if self.terms else ""

    @property
    def tokens(self) -> int:
        """How many tokens the phrases hold (``"qk 4471 b"`` is one phrase of three): how specific a
        query is, for ``lexical_match_min_terms``."""
        return sum(len(t[1:-1].split()) for t in self.terms)

    def __bool__(self) -> bool:
        return bool(self.terms)


def in_index(index: str, match: str) -> str:
    """The FTS5 query ``match`` (phrases of this module) over the text of ``index``'s rows only."""
    return f'idx : "{index_token(index)}" AND text : ({match})'


def lexical_query(text: str) -> LexicalQuery:
    """The safe FTS5 query for ``text`` (see the module docstring), linear in its length and looking
    at its first ``MAX_QUERY_CHARS`` characters only.

    Each whitespace-separated word becomes the phrase of its tokens, lower-cased and joined by
    spaces (``"XR-7720,"`` → ``"xr 7720"``, which FTS5 matches as it matches ``xr-7720``). A phrase
    then holds only letters, digits and spaces, so no character can be FTS5 syntax or end its string
    (a quote, a NUL) or fail to encode (a lone surrogate): any text gives a valid query or none.
    Repeated words count once; stopwords are dropped unless nothing else is left; a phrase keeps
    at most ``MAX_PHRASE_TOKENS`` tokens and the query at most ``MAX_QUERY_TOKENS``."""
    if len(text) > MAX_QUERY_CHARS:
        cut = text[MAX_QUERY_CHARS].isspace()
        text = text[:MAX_QUERY_CHARS]
        if not cut:  # a word cut in two would search for its first half: leave it out, if not alone
            parts = text.rsplit(None, 1)
            text = parts[0] if len(parts) == 2 else text
    # composed (NFC): FTS5 folds a Latin letter's accent within its token ("nai\u0308ve" is one token,
    # naive), where _TOKEN would split a decomposed one at its combining mark ("nai ve": no match)
    text = unicodedata.normalize("NFC", text)
    words: dict[str, int] = {}  # phrase text -> its tokens, in query order
    for raw in text.split():
        tokens = _TOKEN.findall(raw.lower())[:MAX_PHRASE_TOKENS]
        if tokens:
            words.setdefault(" ".join(tokens), len(tokens))
    content = {w: n for w, n in words.items() if w not in STOPWORDS} or words
    terms: list[str] = []
    budget = MAX_QUERY_TOKENS
    for word, n in content.items():
        if n > budget:
            break
        terms.append(f'"{word}"')
        budget -= n
    return LexicalQuery(tuple(terms))


def create_lexical_index(conn: sqlite3.Connection) -> bool:
    """Create the FTS5 table, its content view and triggers when absent, and fill it from the chunk
    rows already there: the migration of a shard written before the lexical index existed, or
    before it had the ``idx`` column (that table is dropped and built again). True when it was
    built now.

    The whole change is one transaction (one script between ``BEGIN IMMEDIATE`` and ``COMMIT``:
    ``executescript`` would commit each statement of a script without them): a process that dies
    part-way leaves the old table, never a new empty one that the next open would take as built."""
    row = conn.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (FTS_TABLE,)).fetchone()
    stale = row is not None and "idx" not in row[0]  # a table from before per-index search
    build = row is None or stale
    script = ["BEGIN IMMEDIATE;"]
    if stale:
        script += [f"DROP TRIGGER IF EXISTS {trigger};" for trigger in _TRIGGERS]
        script.append(f"DROP TABLE {FTS_TABLE};")
    script.append(FTS_DDL)
    if build:
        script.append(f"INSERT INTO {FTS_TABLE} ({FTS_TABLE}, rank) VALUES ('rank', 'bm25(1.0, 0.0)');")
        script.append(f"INSERT INTO {FTS_TABLE} ({FTS_TABLE}) VALUES ('rebuild');")
    script.append("COMMIT;")
    try:
        conn.executescript("\n".join(script))
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return build


def lexical_problems(conn: sqlite3.Connection) -> list[str]:
    """FTS5's own integrity check against the chunk rows (empty when they agree)."""
    try:
        conn.execute(f"INSERT INTO {FTS_TABLE} ({FTS_TABLE}, rank) VALUES ('integrity-check', 1)")
    except sqlite3.DatabaseError as e:
        return [f"the lexical index disagrees with the chunk rows: {e}"]
    return []
