"""The lexical side of a shard: an SQLite FTS5 index over chunk text, and user text as a safe query.

Why FTS5 inside the shard's own database: its rows are written by triggers on ``chunks``, so every
write path (upsert, delete, drop, load's swap, orphan purge) keeps it exact *in the same
transaction* as the chunk rows, and it is exactly as durable as they are; a snapshot needs nothing
extra either (an export carries chunk text, and importing it writes the rows, which index them).

Why a query builder: FTS5 has a query syntax (``"``, ``*``, ``NEAR``, ``AND``/``OR``/``NOT``,
``-``, ``:`` and parentheses), and user questions contain all of them. Every word of the user's
text becomes one quoted phrase (quotes doubled), so nothing the user types is syntax; the phrases
are OR-ed, as BM25 ranking expects (a chunk need not contain every word).
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass

FTS_TABLE = "chunks_fts"

# External-content FTS5 over chunks.text, kept exact by triggers (see the module docstring). The
# update trigger fires only when the text changes: renaming a chunk's index (a load's swap) does
# not touch the lexical index, whose rowids are the chunk ids.
FTS_DDL = f"""
CREATE VIRTUAL TABLE IF NOT EXISTS {FTS_TABLE} USING fts5(
    text, content='chunks', content_rowid='id', tokenize='porter unicode61');
CREATE TRIGGER IF NOT EXISTS chunks_fts_insert AFTER INSERT ON chunks BEGIN
    INSERT INTO {FTS_TABLE} (rowid, text) VALUES (new.id, new.text);
END;
CREATE TRIGGER IF NOT EXISTS chunks_fts_delete AFTER DELETE ON chunks BEGIN
    INSERT INTO {FTS_TABLE} ({FTS_TABLE}, rowid, text) VALUES ('delete', old.id, old.text);
END;
CREATE TRIGGER IF NOT EXISTS chunks_fts_update AFTER UPDATE OF text ON chunks BEGIN
    INSERT INTO {FTS_TABLE} ({FTS_TABLE}, rowid, text) VALUES ('delete', old.id, old.text);
    INSERT INTO {FTS_TABLE} (rowid, text) VALUES (new.id, new.text);
END;
"""

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

# A word: a run of characters that are not whitespace. Its letters and digits are what FTS5's
# unicode61 tokenizer indexes; a word without any (only punctuation) selects nothing and is dropped.
_WORD = re.compile(r"\S+")
_TOKEN_CHAR = re.compile(r"[^\W_]", re.UNICODE)
_TOKEN = re.compile(r"[^\W_]+", re.UNICODE)
_EDGE_PUNCT = re.compile(r"^[\W_]+|[\W_]+$", re.UNICODE)
#: Longest lexical query, in words: a pasted page is a query about its first words, not a DoS.
MAX_QUERY_TERMS = 64


@dataclass(frozen=True)
class LexicalQuery:
    """A user's text as an FTS5 query: ``match`` is the OR of ``terms``, each a quoted phrase (and a
    query of its own, to count which terms a hit contains). Empty when the text holds nothing
    searchable (only punctuation): then there is no lexical search at all."""

    terms: tuple[str, ...]

    @property
    def match(self) -> str:
        return " OR ".join(self.terms)

    @property
    def tokens(self) -> int:
        """How many tokens the phrases hold (``"qk-4471-b"`` is one phrase of three): how specific a
        query is, for ``lexical_match_min_terms``."""
        return sum(len(_TOKEN.findall(t)) for t in self.terms)

    def __bool__(self) -> bool:
        return bool(self.terms)


def _phrase(word: str) -> str:
    return '"' + word.replace('"', '""') + '"'


def lexical_query(text: str) -> LexicalQuery:
    """The safe FTS5 query for ``text`` (see the module docstring). Words are lower-cased and
    stripped of edge punctuation (``"XR-7720,"`` → ``xr-7720``, a phrase FTS5 tokenizes into
    ``xr 7720``); repeated words count once; stopwords are dropped unless nothing else is left."""
    words: list[str] = []
    for raw in _WORD.findall(text):
        word = _EDGE_PUNCT.sub("", raw.lower())
        if word and _TOKEN_CHAR.search(word) and word not in words:
            words.append(word)
    content = [w for w in words if w not in STOPWORDS] or words
    return LexicalQuery(tuple(_phrase(w) for w in content[:MAX_QUERY_TERMS]))


def create_lexical_index(conn: sqlite3.Connection) -> bool:
    """Create the FTS5 table and its triggers when absent; a table created over existing chunk rows
    is filled from them (the migration of a shard written before the lexical index existed).
    True when it was created now."""
    exists = (
        conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (FTS_TABLE,)).fetchone()
        is not None
    )
    conn.executescript(FTS_DDL)
    if not exists:
        conn.execute(f"INSERT INTO {FTS_TABLE} ({FTS_TABLE}) VALUES ('rebuild')")
    return not exists


def lexical_problems(conn: sqlite3.Connection) -> list[str]:
    """FTS5's own integrity check against the chunk rows (empty when they agree)."""
    try:
        conn.execute(f"INSERT INTO {FTS_TABLE} ({FTS_TABLE}, rank) VALUES ('integrity-check', 1)")
    except sqlite3.DatabaseError as e:
        return [f"the lexical index disagrees with the chunk rows: {e}"]
    return []
