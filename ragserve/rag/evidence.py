"""Evidence: the passages of the retrieved sources that best support an answer to the question.

Extractive and cheap (docs/architecture.md §4), in three steps:

1. ``candidates``: each source's text cut into sentences (wrapped lines read as one, markup lines
   left out, a short sentence joined to the one before it).
2. ``shortlist``: the *windows* (a sentence with the next one of its source: a fact sentence, "The
   default is only 1 worker.", rarely names its subject, which the sentence before it does) that
   hold most of the query's terms, weighted by their rarity among the sentences
   (``term_overlap``); and how much of the question the sources mention at all (``coverage``,
   for the answerability rule, ``ragserve.rag.answerable``). The service embeds the shortlisted
   sentences in one small batch beside the query.
3. ``assess``: each shortlisted window scored by its cosine to the query (its vector is the
   normalised sum of its sentences', so windows cost no second embedding) and its terms; the best
   that do not overlap are the evidence.

Every passage is the source's own text: ``Evidence.text == source_nodes[source - 1].text[start:end]``.

Pure (no I/O, no models) and linear in the sources' length: sentences come from the ingest
splitter (``sentence_spans``, linear), line breaks are classified in one pass over the lines, and
every regex here matches runs of one character class or a bounded shape.
"""

from __future__ import annotations

import functools
import math
import re
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ragserve.api.documents import Evidence, NodeWithScore
from ragserve.ingest.sentence import sentence_spans
from ragserve.memo import remembered
from ragserve.store.lexical import STOPWORDS

#: A passage with fewer words is no evidence (a heading, a code fragment, "No.").
MIN_WORDS = 4
#: A sentence of fewer words joins the one before it in its paragraph ("Warn if cookie headers are
#: larger than this many bytes. Defaults to 4093.": the short one holds the fact, the one before
#: says what of).
MERGE_WORDS = 8
#: A longer sentence (a paragraph without stops, a table) is cut at whitespace into pieces of at
#: most this many characters: evidence is read at a glance, and the embedder reads only its first
#: 256 word pieces anyway.
MAX_SENTENCE_CHARS = 400
#: A window of two sentences is scored only up to this length; a longer pair is scored as one sentence.
MAX_WINDOW_CHARS = 600
#: The most sentences read for one answer, from the sources in order (best first): bounds the work
#: of counting terms when a request has many sources.
MAX_CANDIDATES = 256
#: ...and reads at most this much of the sources' text, the best source first (a GPU model's context
# of 32,768 tokens is about 130,000 characters): a request's evidence costs a bounded time whatever
# the sources hold.
MAX_READ_CHARS = 262_144
#: How many windows the query's terms shortlist for the embedder: at most twice as many sentences
#: embedded, about 200 word pieces for 5 sources of Flask's documentation, ~0.1 s of one CPU core
#: (docs/quality.md); every sentence of them would be ~900, as costly as embedding the sources again.
SHORTLIST = 12
#: The part of a query its terms are read from (as the lexical parser does, ``ragserve.store.lexical``).
MAX_QUERY_CHARS = 4096
#: How the score weighs a window's cosine to the query against the share of the query's weighted
#: terms it holds (chosen on the questions over Flask's documentation: docs/quality.md).
COSINE_WEIGHT = 0.7

#: How much of a window's score is whether it holds what the question asks for (``answer_kinds``:
#: a number for "how many", a command or code for "how do I"), when the question asks for one.
ANSWER_KIND_WEIGHT = 0.15

_WORD = re.compile(r"[^\W_]+")


def _words(text: str) -> frozenset[str]:
    """The whitespace-separated words of ``text``: how the word lists below are written."""
    return frozenset(text.split())


# What a question asks for, read from its words (lower case, as ``_WORD`` finds them):
# a quantity ("how many", "which port", "what version", "the default size") ...
_NUMBER_WORDS = _words(
    """
many much long big large old often far fast port ports version versions code number numbers size
limit maximum minimum max min year years date timeout seconds minutes hours days bytes percent
length count duration
"""
)
# A number said in words ("two years", "a dozen", "twice").
_NUMBER_NAMES = _words(
    """
one two three four five six seven eight nine ten eleven twelve fifteen twenty thirty forty fifty
sixty hundred thousand million billion dozen once twice half
"""
)
# ... or a way to do something ("how do I", "how can I", "how to", "what command", "steps").
_HOW_TO = ("how do ", "how can ", "how should ", "how to ", "how would ")
_HOW_TO_WORDS = _words(
    """
command commands steps install run configure enable set setup
"""
)
# A passage holds a way to do something: a command (a line that starts with a shell or Python
# prompt), a code block (its directive, fence or "::"), or a call (``name(``). Inline literals are
# not enough: reStructuredText marks every name that way.
_CODE_LINE = re.compile(r"^[ \t]*(?:\$ |>>> |\.\. code-block::|\.\. code::|\.\. sourcecode::|```|~~~)|::[ \t]*$", re.M)
_CALL = re.compile(r"[A-Za-z0-9_]\(")
#: Words of how a question is asked, not of what it asks about ("how long", "too large", "what
#: kind of", "explain what", "how does it work", "how long does it last", "a good way", "which tool
#: does the documentation recommend"): a sentence that answers rarely repeats them.
_QUESTION_WORDS_TEXT = """
long large big small many much often far old kind way ways explain describe tell mean means meaning
define definition difference example examples give need please work works happen happens last lasts
take takes good best better right proper properly correct correctly possible tool tools thing things
documentation docs document documents documented manual guide get gets getting use uses using used
make makes want wants show know see find let like try
"""
# Stems of words that qualify what a question asks rather than name it ("by default"): left out of
# its coverage (they still help find the passage that says "Default: 31 days").
_QUALIFIERS = frozenset({"defaul"})
# What a word with an apostrophe leaves before or after it ("doesn" of "doesn't", "ll" of "we'll").
_CONTRACTED = _words("don doesn didn isn aren wasn weren won wouldn shouldn couldn hasn haven hadn ll ve re")
QUESTION_WORDS = frozenset(_QUESTION_WORDS_TEXT.split())
# An RST role before its target (":attr:`x`"): a try starts only at a ":" and reads one run of
# letters, so finding them all is linear.
_ROLE = re.compile(r":[a-z]+:(?=`)")
_MARKUP = str.maketrans({"`": " ", "~": " ", "_": " ", "*": " "})
# A line that starts a block of its own in Markdown or reStructuredText: a list item, a heading, a
# quote, a table row, a fence, a directive, a shell prompt. The line break before it is a real one.
_BLOCK_START = ("-", "*", "+", "#", ">", "|", "```", "~~~", "..", "$ ")
_UNDERLINE = frozenset("=-~^*+#`'\".:_")
# Directives whose text may start on their own line (``.. note:: Read this.``): what follows the
# marker is prose. Every other directive's argument (``.. admonition:: How to generate good secret
# keys``, ``.. code-block:: sh``) is a title or an option, not something the documents say.
_PROSE_DIRECTIVES = _words(
    """
note warning tip important caution attention danger error hint seealso versionadded versionchanged
deprecated
"""
)

# A line that opens a code block: the block belongs to the passage just above it.
_CODE_DIRECTIVES = frozenset({"code-block", "code", "sourcecode"})  # a fence may close one: ":" only
# Directives that document a name (Sphinx's domain directives, "py:data", have a ":" in theirs).
_API_DIRECTIVES = _words(
    """
data function class method attribute module exception option envvar confval
"""
)
#: A section title read with its passages is cut at this length.
MAX_TITLE_CHARS = 120
# A line of a code block that is a command: a shell or Python prompt.
_PROMPTS = ("$ ", ">>> ", "> ")


@dataclass(frozen=True)
class Candidate:
    """A sentence of a source: ``text == nodes[source - 1].text[start:end]``. ``gap``: when the
    next candidate is the next sentence of the same source with only whitespace between (their
    window is scored), that whitespace; else None."""

    source: int  # 1-based, as the answer cites it
    node_id: str
    start: int
    end: int
    text: str
    gap: str | None = None
    title: str = ""  # the heading (or API directive's name) of its section in the source, if it has one
    #: Its passage of its source: with what scoring reads of it when the source was read whole
    #: (``_reading``), else without (read when scored); None for a candidate made elsewhere.
    passage: Passage | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Assessment:
    """What the sources say to a question: the best passages, and ``coverage``, the weighted share
    of the question's terms that some sentence holds (1.0 when it has none)."""

    evidence: list[Evidence]
    coverage: float
    #: The best window's score without what the question asks for (``ANSWER_KIND_WEIGHT``): how
    #: well a passage says what the question is about, which the answerability rule reads (a
    #: question the documents do not cover still finds a passage with a command or a number).
    support: float = 0.0
    #: The names the question gives (``names``: "PostgreSQL", "CORS", "gRPC") that no passage of
    #: the sources mentions (the chat service then keeps only those no other chunk of the index
    #: holds either): the question is about something the documents do not cover.
    missing: list[str] = field(default_factory=list)


def _directive(s: str) -> tuple[str, str] | None:
    """(name, argument) of a directive line ``s`` (without its indentation): ``.. note:: Read
    this.`` is ("note", "Read this."); None for any other line, a comment or a link target
    (``.. _x: url``) among them."""
    if not s.startswith(".. "):
        return None
    name, marker, argument = s[3:].partition("::")
    return (name.strip(), argument.strip()) if marker else None


def _is_underline(line: str) -> bool:
    """An RST heading's over- or underline (``=====``): one punctuation character repeated."""
    s = line.strip()
    return len(s) >= 3 and s[0] in _UNDERLINE and s.count(s[0]) == len(s)


def _starts_block(line: str) -> bool:
    s = line.lstrip()
    if s.startswith(_BLOCK_START):
        return True
    digits = len(s) - len(s.lstrip("0123456789"))
    return 0 < digits < len(s) and s[digits] in ".)"  # "1. step", "2) step"


def _markup_blanked(line: str, s: str, heading: bool) -> str:
    """``line`` (same length) with what is not prose blanked: a heading (``heading``: an RST title
    over its underline; a Markdown ``#`` line), a code fence and an RST underline (a title says what a section is
    about, never what it says), a directive's marker (``.. note::``; a link target or a comment,
    ``.. _x: url``, whole; a directive's argument too, a title or a language, except where it is
    the first words of an admonition's text, ``_PROSE_DIRECTIVES``). ``s``: the line without its
    indentation."""
    if heading or s.startswith(("#", "```", "~~~")):
        return " " * len(line)
    if s.startswith(".. ") or s == "..":
        directive = _directive(s)
        if directive is None or directive[0].lower() not in _PROSE_DIRECTIVES:
            return " " * len(line)
        marker = line.find("::")
        return " " * (marker + 2) + line[marker + 2 :]
    return line


def reading_text(text: str) -> str:
    """``text`` with the line breaks inside a paragraph read as spaces (same length, so offsets
    stay the text's). A break stays where a paragraph ends (a blank line), a block starts (a list
    item, a heading, a table row, a fence), the indentation goes back (a list item's wrapped lines
    are indented more than its first), in a fenced code block, or where a line is a heading or its
    underline: wrapped prose becomes whole sentences, structure stays lines. Each line's facts are
    found once (it is also the next line of the one before)."""
    lines = text.split("\n")
    bodies = [line.lstrip() for line in lines]
    unders = [bool(body) and _is_underline(body) for body in bodies]
    out: list[str] = []
    fenced = False  # inside a Markdown code fence: every line is a line
    last = len(lines) - 1
    for i, line in enumerate(lines):
        body, under = bodies[i], unders[i]
        nxt, n_body, n_under = (lines[i + 1], bodies[i + 1], unders[i + 1]) if i < last else ("", "", False)
        if not body:  # a blank line: kept as it is, and a paragraph's end
            out.append(line)
            if i < last:
                out.append("\n")
            continue
        # an RST title: a line over an underline at least as long (a code fence's "```" is shorter)
        out.append(_markup_blanked(line, body, under or (n_under and len(nxt) >= len(line.rstrip()))))
        if body.startswith(("```", "~~~")):
            fenced = not fenced
        if i == last:
            break
        hard = (
            not n_body
            or fenced
            or under
            or n_under
            or body.startswith(("#", "|", "```", "~~~", ".."))
            or _starts_block(n_body)
            or len(nxt) - len(n_body) < len(line) - len(body)
        )
        out.append("\n" if hard else " ")
    return "".join(out)


def prompt_text(text: str) -> str:
    """``text`` as a model reads it in a prompt: without the lines that are markup, not content (a
    code directive, ``.. code-block:: sh``, and its options, ``:caption: x``; a code fence's
    ```` ```lang ```` line; a comment or link target, ``.. _x: url``), the marker of a directive
    whose text follows it (``.. note:: Read this.`` is "Read this."), and blank lines at its ends.
    A small model copies such a line as its answer. Each line read once."""
    out: list[str] = []
    options = False  # the lines right after a directive: its ":name: value" options
    for line in text.split("\n"):
        s = line.strip()
        if options and s.startswith(":") and s.find(":", 1) > 1:
            continue
        options = False
        if s.startswith(("```", "~~~")):
            continue
        if s.startswith(".. ") or s == "..":
            directive = _directive(s)
            options = directive is not None
            if directive is not None and directive[0].lower() in _PROSE_DIRECTIVES and directive[1]:
                out.append(line[: len(line) - len(line.lstrip())] + directive[1])
            continue
        out.append(line)
    return "\n".join(out).strip("\n")


def _pieces(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """``[start, end)`` trimmed of whitespace and cut at whitespace into pieces of at most
    ``MAX_SENTENCE_CHARS`` (a piece without whitespace is cut where it reaches the limit).
    ``text`` is the reading text (``reading_text``), whose blanked markup is whitespace."""
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    out: list[tuple[int, int]] = []
    while end - start > MAX_SENTENCE_CHARS:
        limit = start + MAX_SENTENCE_CHARS
        cut = max(text.rfind(" ", start + 1, limit + 1), text.rfind("\n", start + 1, limit + 1))
        if cut <= start:
            cut = limit
        out.append((start, cut))
        start = cut
        while start < end and text[start].isspace():
            start += 1
    if end > start:
        out.append((start, end))
    return out


def terms(text: str) -> list[str]:
    """The words of ``text`` that say what it is about: lower-cased, stopwords and
    ``QUESTION_WORDS`` dropped, each cut to a crude stem (``_stem``). ``MAX_CONTENT_LENGTH`` is
    three words, as a reader would say it. Single letters and what is left of a contraction ("I'm",
    "doesn't": "m", "doesn", "t") are not words of the subject."""
    return [
        _stem_remembered(w) if len(w) <= MAX_REMEMBERED_WORD else _stem(w)
        for w in _WORD.findall(text.lower())
        if len(w) > 1 and w not in STOPWORDS and w not in QUESTION_WORDS and w not in _CONTRACTED
    ]


#: What the memos of ``term_set`` and ``model_text`` may hold each (``ragserve.memo.TextMemo``, in
#: about bytes), for texts of at most ``TEXT_MEMO_MAX_CHARS`` (a window with its title): a source's
#: sentences and windows come back with every question that retrieves it again, and reading them
#: again was a seventh of the ingress's CPU in a repeated chat (docs/benchmarks.md, issue 28).
TEXT_MEMO_UNITS = 8 * 1024 * 1024
TEXT_MEMO_MAX_CHARS = MAX_WINDOW_CHARS + MAX_TITLE_CHARS + 8
#: What a set's slot and a short string's object cost besides its characters, about.
_TERM_UNITS = 64


def _weigh_terms(value: frozenset[str]) -> int:
    return sum(len(t) + _TERM_UNITS for t in value)


def _weigh_text(value: str) -> int:
    return len(value)


@remembered(TEXT_MEMO_UNITS, TEXT_MEMO_MAX_CHARS, _weigh_terms)
def term_set(text: str) -> frozenset[str]:
    """The set of ``terms(text)``."""
    return frozenset(terms(text))


def _stem(word: str) -> str:
    """A crude stem, enough to match a question's words with a sentence's: "cached", "caches",
    "caching" and "cache" are "cach"; "configured" and "configuration" are "config"; "settings"
    and "setting" are "sett"."""
    if len(word) > 4 and word.endswith("es"):
        word = word[:-2]
    elif len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        word = word[:-1]
    if len(word) > 5 and word.endswith("ing"):
        word = word[:-3]
    elif len(word) > 4 and word.endswith("ed"):
        word = word[:-2]
    if len(word) > 3 and word.endswith("e"):
        word = word[:-1]
    return word[:6]


#: Stems of words up to this long are remembered (``_stem_remembered``, 65,536 of them): a source's
#: words recur in every sentence and question read, and a stem is a pure function of its word.
MAX_REMEMBERED_WORD = 24
_stem_remembered = functools.lru_cache(maxsize=1 << 16)(_stem)


def passages(text: str) -> list[tuple[int, int]]:
    """The ``[start, end)`` passages of ``text`` worth scoring, in order: its sentences (wrapped
    lines read as one, markup lines blanked, long ones cut in pieces), a sentence of fewer than
    ``MERGE_WORDS`` words joined to the one before it in the same paragraph, what a passage
    announces (``_joins``: the command, code block or list after a ":") joined to it, and then those
    of fewer than ``MIN_WORDS`` words left out (headings, fragments)."""
    reading = reading_text(text)
    units: list[list[int]] = []  # [start, end, words, what it may join: _OPEN or _BLOCK_NEXT]
    for s, e in sentence_spans(reading):
        for start, end in _pieces(reading, s, e):
            words = len(_WORD.findall(reading, start, end))
            last = units[-1] if units else None
            if last and last[3] and end - last[0] <= MAX_WINDOW_CHARS and _joins(text, last, start):
                # what a passage announces (a command, a code block, a list) joins it, and the
                # block's next prompt lines ("$ pip install waitress") or list items too
                last[1:] = [end, last[2] + words, _BLOCK_NEXT]
            elif (
                last
                and words < MERGE_WORDS
                and end - last[0] <= MAX_SENTENCE_CHARS
                and "\n" not in reading[last[1] : start]
            ):
                last[1:] = [end, last[2] + words, last[3]]
            else:
                units.append([start, end, words, _OPEN])
    return [(start, end) for start, end, words, _ in units if words >= MIN_WORDS]


_OPEN = 1  # a passage that may be joined by what it announces
_BLOCK_NEXT = 2  # a passage that ends in what it announced: its next prompt line or list item joins it


def _opens_block(line: str) -> bool:
    """A directive's line (``.. code-block:: sh``, ``.. note::``) or a fence: what a passage that
    ends with ":" announces may lie past it (never past a heading, prose, a link target)."""
    s = line.strip()
    return s.startswith(("```", "~~~")) or _directive(s) is not None


def _is_item(text: str, start: int) -> bool:
    """Whether ``text`` has a list item at ``start``: "- x", "* x", "+ x", "1. x", "2) x"."""
    head = text[start : start + 12]
    if head[:2] in ("- ", "* ", "+ "):
        return True
    digits = len(head) - len(head.lstrip("0123456789"))
    return 0 < digits < 10 and head[digits : digits + 2] in (". ", ") ")


def _joins(text: str, last: list[int], start: int) -> bool:
    """Whether the passage at ``start`` joins ``last`` (``[start, end, words, state]``, see
    ``passages``): after a passage that ends with ":", what follows past blank lines and
    ``_opens_block`` lines only; after any passage, a code block
    that a code directive or fence opens right below it; then the next line that starts with a
    prompt or is a list item. Reads at most ``MAX_WINDOW_CHARS`` of the gap."""
    if start - last[1] > MAX_WINDOW_CHARS:
        return False
    gap = text[last[1] : start].split("\n")
    if last[3] == _BLOCK_NEXT:  # the next line, or past one blank line (a loose list)
        nxt = text.startswith(_PROMPTS, start) or _is_item(text, start)
        return len(gap) <= 3 and not "".join(gap).strip() and nxt
    if not all(not line.strip() or _opens_block(line) for line in gap):
        return False
    if text[last[1] - 1] == ":":
        return True
    return any((d := _directive(line.strip())) is not None and d[0] in _CODE_DIRECTIVES for line in gap)


#: What the memo of sources' layouts (``_layout``: their passages, section titles and keys) and the
#: memo of their readings (``_reading``: what scoring reads of each passage) may hold (bytes, as
#: ``sys.getsizeof`` counts them), for sources of at most ``SOURCE_MEMO_MAX_CHARS``: the same chunks
#: answer many questions, and reading them again (cutting, marking up, counting terms) was most of
#: a repeated chat's evidence (docs/benchmarks.md, issue 28).
SOURCE_MEMO_UNITS = 32 * 1024 * 1024
READING_MEMO_UNITS = 48 * 1024 * 1024
SOURCE_MEMO_MAX_CHARS = 16_384


@dataclass(frozen=True, slots=True)
class Reading:
    """What scoring reads of a passage or a window: its words with its section's title before them
    (``model_text``), their ``terms`` (``term_set``), and whether its text holds a number and code
    (``holds_kind``)."""

    model: str
    terms: frozenset[str]
    kinds: tuple[bool, bool]


def _read(title: str, text: str) -> Reading:
    """``text`` read as scoring reads it, for a source read whole (its memo holds the readings)."""
    model = model_text.__wrapped__(f"{title} {text}")
    return Reading(model, frozenset(terms(model)), _kinds_held(text))


def _read_one(title: str, text: str) -> Reading:
    """``text`` read as scoring reads it, when its source is not read whole: through the memos of
    each text's model text and terms."""
    model = model_text(f"{title} {text}")
    return Reading(model, term_set(model), _kinds_held(text))


@dataclass(frozen=True, slots=True)
class Passage:
    """A passage of a source (``passages``) and, once its source is read whole, what scoring reads
    of it."""

    start: int
    end: int
    key: str  # its words in lower case: the same sentence in a later source is read once
    title: str  # its section's (``section_titles``), or ""
    follows: bool  # only whitespace lies between the passage before it and this one
    #: What scoring reads of it alone, and of it with the next passage when that follows it and
    #: the two fit ``MAX_WINDOW_CHARS`` (their window). None: read when scored.
    alone: Reading | None = None
    pair: Reading | None = None


_PASSAGE_UNITS = sys.getsizeof(Passage(0, 0, "", "", False)) + 2 * sys.getsizeof(1 << 20)
_READING_UNITS = sys.getsizeof(Reading("", frozenset(), (False, False))) + sys.getsizeof((False, False))


def _weigh_layout(value: tuple[Passage, ...]) -> int:
    titles = {id(p.title): p.title for p in value}  # a section's title is one string for its passages
    return (
        sys.getsizeof(value)
        + sum(_PASSAGE_UNITS + sys.getsizeof(p.key) for p in value)
        + sum(sys.getsizeof(t) for t in titles.values())
    )


def _weigh_reading(value: tuple[Passage, ...]) -> int:
    units = _weigh_layout(value)
    for p in value:
        for r in (p.alone, p.pair):
            if r is not None:
                units += _READING_UNITS + sys.getsizeof(r.model) + sys.getsizeof(r.terms)
                units += sum(sys.getsizeof(t) for t in r.terms)
    return units


@remembered(SOURCE_MEMO_UNITS, SOURCE_MEMO_MAX_CHARS, _weigh_layout)
def _layout(text: str) -> tuple[Passage, ...]:
    """Each of ``passages(text)`` with its section's title, its key and whether it follows the one
    before it (not read yet)."""
    spans = passages(text)
    heads = section_titles(text)
    out = []
    h = 0
    for i, (start, end) in enumerate(spans):
        while h < len(heads) and heads[h][0] <= start:
            h += 1
        follows = i > 0 and not text[spans[i - 1][1] : start].strip()
        key = " ".join(text[start:end].split()).lower()
        out.append(Passage(start, end, key, heads[h - 1][1] if h else "", follows))
    return tuple(out)


@remembered(READING_MEMO_UNITS, SOURCE_MEMO_MAX_CHARS, _weigh_reading)
def _reading(text: str) -> tuple[Passage, ...]:
    """A source's passages, each read alone and with the next: remembered, so a source that answers
    again is not read again."""
    layout = _layout(text)
    out = []
    for i, p in enumerate(layout):
        nxt = layout[i + 1] if i + 1 < len(layout) else None
        pair = nxt is not None and nxt.follows and nxt.end - p.start <= MAX_WINDOW_CHARS
        out.append(
            Passage(
                p.start,
                p.end,
                p.key,
                p.title,
                p.follows,
                _read(p.title, text[p.start : p.end]),
                _read(p.title, text[p.start : nxt.end]) if pair and nxt is not None else None,
            )
        )
    return tuple(out)


def candidates(nodes: Sequence[NodeWithScore], max_sentences: int = MAX_CANDIDATES) -> list[Candidate]:
    """The passages of ``nodes`` (in their order, the best source first) to score: each text once
    (overlapping chunks repeat sentences: the first source keeps it), at most ``max_sentences``,
    from the first ``MAX_READ_CHARS`` of their text. A source of at most ``SOURCE_MEMO_MAX_CHARS`` of
    which this request uses at least half is read whole and remembered (``_reading``); the
    passages of another are read when scored."""
    rows: list[tuple[int, str, str, Passage]] = []
    gaps: list[str | None] = []
    seen: set[str] = set()
    budget = MAX_READ_CHARS
    full = False
    for number, node in enumerate(nodes, start=1):
        if budget <= 0 or full:
            break
        text = node.text[:budget]
        budget -= len(text)
        previous = False  # the last candidate is this source's passage just before this one
        layout = _layout(text)  # a source longer than the memo's bound: cut afresh
        used: list[int] = []
        for j, p in enumerate(layout):
            if p.key in seen:
                previous = False
                continue
            seen.add(p.key)
            if len(rows) + len(used) >= max_sentences:
                full = True
                break
            if previous and p.follows:  # a window never spans a heading
                gaps[-1] = text[layout[used[-1]].end : p.start]
            used.append(j)
            gaps.append(None)
            previous = True
        # read whole (and remembered) when this request uses at least half of it: reading what
        # it does not use (passages an earlier source holds too, or past the cap) then costs at
        # most as much again; else only the passages used are read, when scored
        whole = len(text) <= SOURCE_MEMO_MAX_CHARS and (2 * len(used) >= len(layout) or text in _reading.memo)
        read = _reading(text) if whole else layout
        rows.extend((number, node.node_id, text, read[j]) for j in used)
    return [
        Candidate(number, node_id, p.start, p.end, text[p.start : p.end], gap, p.title, p)
        for (number, node_id, text, p), gap in zip(rows, gaps, strict=True)
    ]


def section_titles(text: str) -> list[tuple[int, str]]:
    """``(offset, title)`` of each section ``text`` opens, in order: an RST title (a line over its
    underline), a Markdown ``#`` heading, an API directive's name (``.. py:data:: MAX_CONTENT_LENGTH``,
    ``.. function:: x``: what the text under it describes). A passage under one is read with it
    (``embed_text``): "Default: 31 days" says what of only under ``PERMANENT_SESSION_LIFETIME``.
    Each line read once; a title is cut at ``MAX_TITLE_CHARS``."""
    out: list[tuple[int, str]] = []
    offset = 0
    lines = text.split("\n")
    for i, line in enumerate(lines):
        s = line.strip()
        title = ""
        if s.startswith("#"):
            title = s.lstrip("#").strip()
        elif (directive := _directive(s)) is not None:
            if ":" in directive[0] or directive[0] in _API_DIRECTIVES:
                title = directive[1]
        elif (
            s
            and i + 1 < len(lines)
            and _is_underline(lines[i + 1])
            and len(lines[i + 1].rstrip()) >= len(line.rstrip())
        ):
            title = s
        if title:
            out.append((offset, title[:MAX_TITLE_CHARS]))
        offset += len(line) + 1
    return out


def embed_text(c: Candidate) -> str:
    """What the embedder reads of a candidate: its section's title, then its words (``model_text``)."""
    return model_text(f"{c.title}: {c.text}" if c.title else c.text)


@remembered(TEXT_MEMO_UNITS, TEXT_MEMO_MAX_CHARS, _weigh_text)
def model_text(passage: str) -> str:
    """What the embedder and the term count read of a passage: its words without the markup
    around them (RST roles ``:attr:``, backticks, ``~``; ``MAX_CONTENT_LENGTH`` as three words)."""
    return _ROLE.sub(" ", passage).translate(_MARKUP)


def _weights(query: str, held_by: Sequence[frozenset[str]]) -> tuple[dict[str, float], list[set[str]]]:
    """The query's terms weighted by rarity among texts whose ``term_set`` each of ``held_by`` is
    (a term no text holds weighs most), and the query terms each text holds."""
    wanted = set(terms(query[:MAX_QUERY_CHARS]))
    held = [wanted.intersection(h) for h in held_by]
    df = Counter(t for h in held for t in h)
    n = len(held_by)
    return {t: math.log(1.0 + (n + 1) / (df[t] + 1)) for t in wanted}, held


def term_overlap(query: str, texts: Sequence[str]) -> list[float]:
    """For each text, the share of the query's terms it holds, each weighted by how rare it is
    among ``texts`` (a word every sentence has, like the project's name, says little; a term no
    sentence has weighs most, so a question about something absent scores low everywhere). 0..1;
    0 everywhere when the query has no terms."""
    return _overlap(query, [term_set(t) for t in texts])


def _overlap(query: str, held_by: Sequence[frozenset[str]]) -> list[float]:
    """``term_overlap`` of texts whose term sets are ``held_by``."""
    weight, held = _weights(query, held_by)
    total = sum(weight.values())
    return [sum(weight[t] for t in h) / total if total else 0.0 for h in held]


# What may open a sentence or a quotation: the capital after it is the sentence's, not a name's.
_SENTENCE_OPENERS = ".?!:;\n\"'(\u201c\u2018\u00ab[-*"
#: Acronyms of formats and protocols every technical text may or may not spell out ("What URL does
#: the server listen on?" when its sources show http://127.0.0.1:5000): not names of a subject.
GENERIC_ACRONYMS = _words(
    "api apis url urls uri http https json xml html css sql cli gui ui id ids ip os pdf csv yaml toml ok faq "
    "tcp udp dns ssl tls ssh ftp io cpu gpu ram"
)


# A quoted title ("What is “Employee Handbook” about?"): the words of a document's name, which its
# metadata holds and its text may not. Bounded, so a try at each quote reads at most 200 characters.
_QUOTED = re.compile('\u201c[^\u201d\n]{0,200}\u201d|"[^"\n]{0,200}"')


def _questions_only(text: str) -> str:
    """The sentences of ``text`` that ask (end with "?"), when some do: "I use Ubuntu. Which Python
    versions are supported?" asks about Python versions, and says what the asker uses besides.
    Every sentence when none asks ("deploy flask on kubernetes"). Linear: one split at "?"."""
    if "?" not in text:
        return text
    parts = text.split("?")
    asked = []
    for part in parts[:-1]:  # each ends with "?"; its question is what follows the last other stop
        cut = max(part.rfind(". "), part.rfind("! "), part.rfind("\n"))
        asked.append(part[cut + 1 :] + "?")
    return " ".join(asked)


def names(query: str) -> list[str]:
    """The words of ``query`` that name something, as its writer spelled them: an acronym
    ("CORS"), a word with a capital inside ("PostgreSQL", "gRPC", "OAuth"), or a capitalised word
    that does not start a sentence or a quotation ("Kubernetes", "Stripe"), in the sentences that
    ask (``_questions_only``: "I use Ubuntu." is context, not the subject), outside quotation marks
    (a document's title); not single letters,
    stopwords, ``QUESTION_WORDS`` or ``GENERIC_ACRONYMS``; in a question written in capitals or in
    Title Case only a word with a capital inside. Read from its first ``MAX_QUERY_CHARS``."""
    out: list[str] = []
    text = _QUOTED.sub(" ", _questions_only(query[:MAX_QUERY_CHARS]))
    words = [m for m in _WORD.finditer(text) if len(m.group()) > 1 and not m.group().isdigit()]
    content = [m.group() for m in words if m.group().lower() not in STOPWORDS]
    # a question in capitals ("HOW DO I …") or in Title Case ("How Do I Make …") capitalises every
    # word: only a capital inside a word (PostgreSQL, gRPC) still says it is a name
    shouting = len(content) >= 2 and all(w.isupper() for w in content)
    titled = len(content) >= 2 and all(w[0].isupper() for w in content)
    for m in words:
        w = m.group()
        lower = w.lower()
        if lower in STOPWORDS or lower in QUESTION_WORDS or lower in GENERIC_ACRONYMS:
            continue
        before = text[max(0, m.start() - 32) : m.start()].rstrip()  # what ends the text before it
        starts = not before or before[-1] in _SENTENCE_OPENERS
        inner = any(ch.isupper() for ch in w[1:]) and any(ch.islower() for ch in w)
        acronym = w.isupper()
        if inner or (not (shouting or titled) and (acronym or (w[0].isupper() and not starts))):
            out.append(w)
    return out


def missing_names(query: str, texts: Sequence[str]) -> list[str]:
    """The ``names`` of ``query`` that none of ``texts`` holds as a word (stemmed as ``terms`` does)."""
    wanted = {_stem(n.lower()): n for n in names(query)}
    if not wanted:
        return []
    held: set[str] = set()
    for t in texts:
        held.update(
            _stem_remembered(w) if len(w) <= MAX_REMEMBERED_WORD else _stem(w) for w in _WORD.findall(t.lower())
        )  # every word: a name may be any word
        if held.issuperset(wanted):
            return []
    return [n for stem, n in wanted.items() if stem not in held]


def coverage(query: str, texts: Sequence[str]) -> float:
    """The weighted share (as in ``term_overlap``) of the query's terms that some text holds: low
    when the question is about something the sources never mention. A term no text holds weighs
    as much as the rarest one some text holds, no more: an everyday word the sources say otherwise
    ("switch on" for "enable", "interfaces" for "IPs") must not outweigh the question's subject
    that they do hold. "By default" qualifies what is asked (``_QUALIFIERS``): the sentence with the
    value rarely says "default". 1.0 for a query without terms."""
    return _coverage(query, [term_set(t) for t in texts])


def _coverage(query: str, held_by: Sequence[frozenset[str]]) -> float:
    """``coverage`` of texts whose term sets are ``held_by``."""
    weight, held = _weights(query, held_by)
    weight = {t: w for t, w in weight.items() if t not in _QUALIFIERS}
    if not weight:
        return 1.0
    found = set().union(*held) if held else set()
    present = [w for t, w in weight.items() if t in found]
    if not present:
        return 0.0
    cap = max(present)
    absent = sum(min(w, cap) for t, w in weight.items() if t not in found)
    return sum(present) / (sum(present) + absent)


def answer_kinds(query: str) -> tuple[bool, bool]:
    """What ``query`` asks for: (a number, a way to do something), as ``_NUMBER_WORDS``, ``_HOW_TO``
    and ``_HOW_TO_WORDS`` read it. Read from its first ``MAX_QUERY_CHARS``."""
    q = query[:MAX_QUERY_CHARS].lower()
    words = set(_WORD.findall(q))
    number = bool(words & _NUMBER_WORDS) and not q.lstrip().startswith(("why ", "is ", "are ", "does ", "do ", "can "))
    how_to = any(q.lstrip().startswith(h) or f" {h}" in q for h in _HOW_TO) or bool(words & _HOW_TO_WORDS)
    return number, how_to


def holds_kind(text: str, kinds: tuple[bool, bool]) -> bool:
    """Whether ``text`` holds what the question asks for (``answer_kinds``): a number (a digit or a
    number's name), or code (a command, a code block, a call)."""
    return _holds(_kinds_held(text), kinds)


def _kinds_held(text: str) -> tuple[bool, bool]:
    """Whether ``text`` holds (a number, code), as ``holds_kind`` reads them."""
    number = _has_digit(text) or not _NUMBER_NAMES.isdisjoint(_WORD.findall(text.lower()))
    return number, _CODE_LINE.search(text) is not None or _CALL.search(text) is not None


_ASCII_DIGIT = re.compile("[0-9]")


def _has_digit(text: str) -> bool:
    """Whether some character of ``text`` is a digit (``str.isdigit``: "²" and "٣" too); an ASCII
    text is searched by the regex, not one character at a time."""
    return _ASCII_DIGIT.search(text) is not None or (not text.isascii() and any(map(str.isdigit, text)))


def _holds(held: tuple[bool, bool], kinds: tuple[bool, bool]) -> bool:
    return (kinds[0] and held[0]) or (kinds[1] and held[1])


@dataclass(frozen=True)
class Window:
    """A passage scored as evidence: a candidate alone, or with the next sentence of its source."""

    first: int  # index of its first candidate
    last: int  # of its last (== first alone)
    text: str  # the source's text from the first's start to the last's end


@dataclass(frozen=True)
class Shortlist:
    """What ``shortlist`` keeps of the candidates for the embedder: the best ``windows`` by the
    query's terms they hold (``overlap``, 0..1), the candidates whose vectors they need
    (``to_embed``, indexes into ``found``), and the question's ``coverage`` by every candidate."""

    found: list[Candidate]
    windows: list[Window]
    overlap: list[float]
    to_embed: list[int]
    coverage: float
    typed: list[bool] = field(default_factory=list)  # each window holds what the question asks for
    asks_kind: bool = False  # the question asks for a number or a way to do something
    missing: list[str] = field(default_factory=list)  # names the question gives that no candidate holds


def _window_spans(found: Sequence[Candidate]) -> list[tuple[int, int]]:
    """``(first, last)`` of each window: each candidate with the next sentence of its source (when
    it follows it and the two fit ``MAX_WINDOW_CHARS``), else alone."""
    out = []
    for i, c in enumerate(found):
        nxt = found[i + 1] if c.gap is not None and i + 1 < len(found) else None
        out.append((i, i + 1) if nxt is not None and nxt.end - c.start <= MAX_WINDOW_CHARS else (i, i))
    return out


def _window(found: Sequence[Candidate], first: int, last: int) -> Window:
    c = found[first]
    return Window(first, last, c.text if last == first else c.text + (c.gap or "") + found[last].text)


def _alone(c: Candidate) -> Reading:
    """What scoring reads of ``c`` alone: remembered with its source, else read now."""
    r = c.passage.alone if c.passage is not None else None
    return r if r is not None else _read_one(c.title, c.text)


def shortlist(query: str, found: Sequence[Candidate], size: int = SHORTLIST, asked: str | None = None) -> Shortlist:
    """The ``size`` windows of ``found`` that hold most of the query's weighted terms (ties: the
    earlier source and sentence, so a question sharing no word with its sources still gets the
    best source's first sentences), and the candidates to embed for them. Embedding every sentence
    of five sources costs as much as embedding the sources again (~0.5 s of a CPU core for 5 × 256
    tokens, docs/quality.md): the terms choose, the embedder orders the few chosen. ``asked``: the
    question whose coverage and names the answerability rule reads, when it is not ``query`` (a
    follow-up retrieved with earlier turns joined to it is judged on its newest turn alone).

    What it reads of each window (its model text's terms, whether it holds a number or code) is
    remembered with its source (``_reading``): a question costs set intersections, not reading."""
    asked = query if asked is None else asked
    alone = [_alone(c) for c in found]
    spans = _window_spans(found)
    readings = []
    for first, last in spans:
        if first == last:
            readings.append(alone[first])
            continue
        c = found[first]
        pair = c.passage.pair if c.passage is not None else None
        readings.append(pair if pair is not None else _read_one(c.title, _window(found, first, last).text))
    overlap = _overlap(query, [r.terms for r in readings])
    kinds = answer_kinds(query)
    typed = [_holds(r.kinds, kinds) for r in readings]
    best = sorted(range(len(spans)), key=lambda i: -(overlap[i] + ANSWER_KIND_WEIGHT * typed[i]))[:size]
    return Shortlist(
        list(found),
        [_window(found, *spans[i]) for i in best],
        [overlap[i] for i in best],
        sorted({j for i in best for j in spans[i]}),
        _coverage(asked, [r.terms for r in alone]),
        [typed[i] for i in best],
        any(kinds),
        missing_names(asked, [r.model for r in alone]),
    )


def assess(query_vector: np.ndarray, short: Shortlist, vectors: np.ndarray, limit: int) -> Assessment:
    """The ``limit`` best shortlisted windows that do not overlap, as ``Evidence`` (best first;
    ties: the earlier source and sentence), and the question's coverage. A window's score, 0..1:
    ``COSINE_WEIGHT`` × the cosine to ``query_vector`` of its vector (its sentences' L2-normalised
    vectors summed and normalised again; a negative cosine counts as 0) + the rest × its share of
    the query's weighted terms. ``vectors`` holds one row per ``short.to_embed``, in its order."""
    if vectors.shape[0] != len(short.to_embed):
        raise ValueError(f"{vectors.shape[0]} vectors for {len(short.to_embed)} candidates")
    if not short.windows:
        return Assessment([], short.coverage, missing=short.missing)
    row = {j: k for k, j in enumerate(short.to_embed)}
    summed = np.stack(
        [vectors[row[w.first]] + (vectors[row[w.last]] if w.last != w.first else 0.0) for w in short.windows]
    )
    unit = summed / np.maximum(np.linalg.norm(summed, axis=1, keepdims=True), 1e-12)
    cosines = np.clip(unit @ query_vector, 0.0, 1.0)
    kind = ANSWER_KIND_WEIGHT if short.asks_kind else 0.0
    typed = short.typed or [False] * len(short.windows)
    plain = [COSINE_WEIGHT * float(c) + (1.0 - COSINE_WEIGHT) * o for c, o in zip(cosines, short.overlap, strict=True)]
    scored = [round((1.0 - kind) * p + kind * t, 4) for p, t in zip(plain, typed, strict=True)]
    chosen: list[int] = []
    taken: set[int] = set()  # candidates inside a window already chosen
    for i in sorted(range(len(short.windows)), key=lambda i: (-scored[i], short.windows[i].first)):
        w = short.windows[i]
        if len(chosen) >= limit:
            break
        if w.first in taken or w.last in taken:
            continue
        chosen.append(i)
        taken.update((w.first, w.last))
    evidence = []
    for i in chosen:
        w = short.windows[i]
        first, last = short.found[w.first], short.found[w.last]
        node, start, end = first.node_id, first.start, last.end
        evidence.append(Evidence(text=w.text, source=first.source, node_id=node, start=start, end=end, score=scored[i]))
    return Assessment(evidence, short.coverage, round(max(plain), 4), short.missing)
