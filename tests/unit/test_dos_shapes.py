"""Every parser of user text we own is linear: 1 MB of each worst shape (runs of each punctuation
class, of spaces, of ".", of initials, alternations, hyphenated words, NULs, control characters and
lone surrogates) takes well under a couple of seconds. The code before took tens of seconds on some
of these shapes at 20-40 KB (a backtracking regex on the event loop held the whole ingress), so
the bound is generous and still catches a quadratic path; the sentence splitter is also checked
to give the same spans as a plain reference on small random texts."""

from __future__ import annotations

import itertools
import sys
import time
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ragserve.ingest.sentence import SentenceChunker, sentence_spans
from ragserve.store.lexical import MAX_PHRASE_TOKENS, MAX_QUERY_TOKENS, lexical_query

MB = 1_000_000
# CPU seconds for a megabyte: about 8x or more what a linear pass costs on a quiet host (0.1-0.6 s),
# so a noisy neighbour does not fail it (a shape took 3.5x its usual CPU time in a full run), while a
# quadratic pass over a megabyte (10^12 steps) would take far longer.
BOUND_S = 5.0

# The units a worst shape repeats: each punctuation class alone, whitespace, the sentence splitter's
# cases (terminal runs, closers, initials, abbreviations), alternations with letters, hyphenated
# words, and characters that are special to FTS5, SQLite or UTF-8.
UNITS = [
    ".",
    "!",
    "?",
    "…",
    "。",
    ",",
    ";",
    ":",
    "-",
    "_",
    "*",
    '"',
    "'",
    "”",
    ")",
    "]",
    "(",
    "[",
    "/",
    "\\",
    " ",
    "\t",
    "\n",
    "\r\n",
    "\u2028",
    ". ",
    ".\n",
    '."',
    '." ',
    ".)",
    "!?",
    "A. ",
    "e.g. ",
    "Dr. ",
    "a.",
    "a. ",
    "a.b",
    "a-",
    "-a",
    "a_",
    "a-b ",
    "1.",
    "x\n",
    " \n",
    "\x00",
    "a\x00",
    "\x01",
    "\x1f",
    "\x7f",
    "\u200b",
    "\ufeff",
    "\ud800",
    "a\udfff",
    "🙂",
    "é",
]


def timed(fn: Callable[[str], object], text: str) -> float:
    """CPU seconds of this thread for ``fn(text)``: what the shape costs, however busy the machine,
    and without a tracer's cost (``make coverage`` measures coverage, which makes every traced line of
    a per-character loop several times slower than it runs in the server)."""
    tracer = sys.gettrace()
    sys.settrace(None)
    try:
        t0 = time.thread_time()
        fn(text)
        return time.thread_time() - t0
    finally:
        sys.settrace(tracer)


def of_size(unit: str, size: int = MB) -> str:
    return unit * (size // len(unit))


def layouts(unit: str, size: int = MB) -> list[str]:
    """The run alone, and inside a word (a backtracking pattern is often quadratic only when the
    run is followed by something it cannot take)."""
    run = of_size(unit, size - 2)
    return [run, "a" + run + "a"]


def word_count(text: str) -> int:
    return len(text.split())


@pytest.mark.parametrize("unit", UNITS, ids=ascii)
def test_the_lexical_query_parser_is_fast_and_bounded_on_every_shape(unit: str) -> None:
    for text in layouts(unit):
        assert timed(lexical_query, text) < BOUND_S
        query = lexical_query(text)
        assert query.tokens <= MAX_QUERY_TOKENS
        assert all(len(t[1:-1].split()) <= MAX_PHRASE_TOKENS for t in query.terms)
        assert all(c.isalnum() or c == " " for t in query.terms for c in t[1:-1])  # nothing FTS5 could misread


@pytest.mark.parametrize("unit", UNITS, ids=ascii)
def test_sentence_splitting_is_linear_on_every_shape(unit: str) -> None:
    for text in layouts(unit):
        assert timed(sentence_spans, text) < BOUND_S


@pytest.mark.parametrize("unit", ["A. ", ". ", "! ", ".", "-a", "\n", "a.\n", "e.g. ", "\x00", "\ud800"], ids=ascii)
def test_sentence_chunking_is_linear_on_the_splitters_worst_shapes(unit: str) -> None:
    chunker = SentenceChunker(word_count, 256, 32)
    text = of_size(unit, MB // 2)  # the splitting and packing (with a cheap count): still 10x past quadratic
    assert timed(chunker.split, text) < BOUND_S


shape_units = st.text(
    alphabet=st.sampled_from(list(".!?\"')] \n\t-_,A\x00\x01\u200b\ud800aé”")), min_size=1, max_size=6
)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(unit=shape_units)
def test_generated_shapes_stay_linear(unit: str) -> None:
    for text in layouts(unit, MB // 2):
        assert timed(sentence_spans, text) < BOUND_S
        assert timed(lexical_query, text) < BOUND_S


def reference_spans(text: str) -> list[tuple[int, int]]:
    """The splitting rule written plainly (quadratic, for small texts): an end is a run of ".!?",
    then closing quotes or brackets, then whitespace; or a newline. A "." after an abbreviation or
    a single letter is no end; whitespace-only pieces join the next sentence."""
    from ragserve.ingest.sentence import _ABBREVIATIONS

    spans, start, i = [], 0, 0
    while i < len(text):
        if text[i] == "\n":
            end = i + 1
        elif text[i] in ".!?":
            j = i
            while j < len(text) and text[j] in ".!?":
                j += 1
            while j < len(text) and text[j] in "\"'”’)]":
                j += 1
            if j == len(text) or not text[j].isspace():
                i = j
                continue
            end = j
            words = text[start:i].split()
            stem = words[-1].lower().rstrip(".") if words else ""
            if text[i] == "." and (stem in _ABBREVIATIONS or (len(stem) == 1 and stem.isalpha())):
                i = j
                continue
        else:
            i += 1
            continue
        if text[start:end].strip():
            spans.append((start, end))
            start = end
        i = end
    if text[start:].strip():
        spans.append((start, len(text)))
    return spans


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([*".!?\"')]” \n\taAxe", "e.g", "Dr", "approx", "vs"]), max_size=30).map("".join))
@example(".approx . ")  # spaces before the dot: the word read is ".approx", not its cut end "approx"
@example("Mapprox . b")
@example("a.. ")  # a run of dots after an initial: its first dot is the one that may end the word
@example("e.g. . x")  # the word's own dots before spaces and a dot
@example("x . . b")  # a word of dots alone is no abbreviation
def test_sentence_spans_match_the_plain_rule(text: str) -> None:
    assert sentence_spans(text) == reference_spans(text)


@pytest.mark.parametrize(("language", "unit"), [("c", "a;"), ("python", "["), ("javascript", "{"), ("python", "x=1;")])
def test_code_chunking_counts_each_segment_once(embedding_model, language: str, unit: str) -> None:
    """Many tiny statements (or brackets): each segment is counted once, in batches, instead of the
    growing merged text at every step (100 KB took 13-38 s with the real tokenizer, now about 1)."""
    from ragserve.ingest.chunks import hf_token_counter
    from ragserve.ingest.code import CodeChunker

    count = hf_token_counter(embedding_model.tokenizer)
    chunker = CodeChunker(count, 256, 32)
    text = of_size(unit, 100_000)
    t0 = time.thread_time()
    chunks = chunker.split(text, language)
    assert time.thread_time() - t0 < 5.0
    assert "".join(c.text for c in chunks) == text.strip()  # every byte kept, once
    assert all(count(c.text) <= 256 for c in chunks)


NESTED = [
    ("python", "x = " + "[" * 50_000 + "]" * 50_000),
    ("python", "x = " + "a+" * 50_000 + "a"),
    ("javascript", "x = " + "{a:" * 33_000 + "1" + "}" * 33_000),
    ("cpp", "A" + "<A" * 50_000),
    ("java", "class A{int f(){return " + "a?" * 50_000 + "b" + ":c" * 50_000 + ";}}"),
    ("rust", "fn f(){" + "{" * 50_000 + "}" * 50_000 + "}"),
]


@pytest.mark.parametrize(("language", "text"), NESTED, ids=lambda v: v if len(v) < 12 else ascii(v[:12]))
def test_code_chunking_of_deep_nesting_is_linear(embedding_model, language: str, text: str) -> None:
    """Balanced nesting 100 levels deep and more: a node too long to fit is split uncounted (counting
    each level's node whole cost the depth times the file: 100 KB took 10-25 s), and a parse past its
    time (C++'s ``A<A<...``, which tree-sitter parses at ~9 s a MB holding the GIL) stops and the
    file is split by lines."""
    from ragserve.ingest.chunks import hf_token_counter
    from ragserve.ingest.code import CodeChunker

    count = hf_token_counter(embedding_model.tokenizer)
    chunker = CodeChunker(count, 256, 32)
    t0 = time.thread_time()
    chunks = chunker.split(text, language)
    assert time.thread_time() - t0 < 5.0
    assert chunks and all(count(c.text) <= 256 for c in chunks)
    assert chunks[0].start_char == 0 and chunks[-1].end_char == len(text.rstrip())
    # nothing left out but the whitespace between chunks
    assert all(not text[a.end_char : b.start_char].strip() for a, b in itertools.pairwise(chunks))


def test_a_parse_past_its_time_is_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    from ragserve.ingest import code

    data = ("A" + "<A" * 100_000).encode()
    monkeypatch.setattr(code, "PARSE_SECONDS", 0.01)
    monkeypatch.setattr(code, "PARSE_SECONDS_PER_MB", 0.0)
    t0 = time.thread_time()
    assert code.parse_bounded("cpp", data) is None
    assert time.thread_time() - t0 < 0.5  # stopped, not run to its end (~1.8 s)
    monkeypatch.setattr(code, "PARSE_SECONDS", 5.0)
    tree = code.parse_bounded("python", b"def f(x):\n    return x + 1\n")
    assert tree is not None and tree.root_node.end_byte > 0
