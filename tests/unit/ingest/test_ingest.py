"""Chunkers (sentence and code), ids and hashes."""

from __future__ import annotations

import itertools
import time

import pytest

from ragserve.ingest import (
    SUPPORTED_LANGUAGES,
    CodeChunker,
    DocumentChunker,
    SentenceChunker,
    UnsupportedLanguageError,
    content_hash,
    hf_token_counter,
    new_doc_id,
    node_id_for,
)
from ragserve.ingest.sentence import sentence_spans


def words(text: str) -> int:
    return len(text.split())


# --- ids ------------------------------------------------------------------------------------
def test_hash_is_canonical_and_unambiguous() -> None:
    assert content_hash("t", {"a": 1, "b": 2}) == content_hash("t", {"b": 2, "a": 1})
    assert content_hash("t", {"a": 1}) != content_hash("t", {"a": 2})
    assert content_hash("t", {}) != content_hash("u", {})
    assert content_hash("t", None) == content_hash("t", {})
    # moving characters across the text/metadata boundary must not collide
    assert content_hash('ab{"', {}) != content_hash("ab", {'"': ""})
    assert len(content_hash("x", {})) == 64


def test_ids() -> None:
    assert new_doc_id() != new_doc_id() and len(new_doc_id()) == 32
    assert node_id_for("d", 0) == node_id_for("d", 0) != node_id_for("d", 1) != node_id_for("e", 1)


# --- sentences --------------------------------------------------------------------------------
def test_sentence_spans_keep_abbreviations_decimals_and_urls() -> None:
    text = "Dr. Smith paid $3.14 at example.com/a.b today. Mr. Jones, e.g. the baker, left! Did he? Yes."
    parts = [text[s:e].strip() for s, e in sentence_spans(text)]
    assert parts == [
        "Dr. Smith paid $3.14 at example.com/a.b today.",
        "Mr. Jones, e.g. the baker, left!",
        "Did he?",
        "Yes.",
    ]
    lines = "Line one\nLine two"
    assert [lines[s:e].strip() for s, e in sentence_spans(lines)] == ["Line one", "Line two"]


def _check(chunks, text: str, count, size: int, overlap: int) -> None:
    assert all(count(c.text) <= size for c in chunks)
    assert all(text[c.start_char : c.end_char] == c.text for c in chunks)
    assert [c.index for c in chunks] == list(range(len(chunks)))
    covered = set()
    for c in chunks:
        covered.update(range(c.start_char, c.end_char))
    assert all(i in covered for i, ch in enumerate(text) if not ch.isspace())
    for a, b in itertools.pairwise(chunks):
        shared = text[b.start_char : a.end_char] if b.start_char < a.end_char else ""
        assert count(shared) <= overlap


def test_sentence_chunks_pack_whole_sentences_with_overlap() -> None:
    sentences = [f"Sentence number {i} talks about topic {i % 5} here." for i in range(40)]
    text = " ".join(sentences)
    chunks = SentenceChunker(words, chunk_size=30, chunk_overlap=8).split(text)
    _check(chunks, text, words, 30, 8)
    assert len(chunks) > 5
    assert all(c.text.endswith(".") for c in chunks)  # chunks end at sentence ends
    assert sum(1 for a, b in itertools.pairwise(chunks) if b.start_char < a.end_char) >= len(chunks) - 1


def test_long_sentence_and_long_word_are_split() -> None:
    text = "short start. " + " ".join(f"w{i}" for i in range(100)) + " " + "x" * 500 + ". end."
    count = lambda t: len(t.split()) + sum(len(w) // 50 for w in t.split())  # noqa: E731 - long words cost more
    chunks = SentenceChunker(count, chunk_size=20, chunk_overlap=4).split(text)
    _check(chunks, text, count, 20, 4)


def test_real_embedding_tokenizer(embedding_model) -> None:
    count = hf_token_counter(embedding_model.tokenizer)
    text = (
        "Retrieval augmented generation combines search with generation. " * 3
        + "FAISS indexes dense vectors for similarity search! Is it fast? It is, e.g. on millions of vectors. "
    ) * 8
    chunks = SentenceChunker(count, chunk_size=64, chunk_overlap=16).split(text)
    _check(chunks, text, count, 64, 16)
    assert len(chunks) >= 4
    assert not any(c.text.endswith("e.g.") for c in chunks)


def test_the_token_counter_counts_as_the_tokenizer_does_one_text_or_many(embedding_model) -> None:
    """The counter reads the Rust tokenizer directly (one text, and a list in one call): the same
    counts as the model's tokenizer, with no special tokens and nothing cut, whatever the text."""
    tokenizer = embedding_model.tokenizer
    count = hf_token_counter(tokenizer)
    texts = [
        "",
        " ",
        "Retrieval augmented generation.",
        "naïve café, Zürich — 東京 🚀 \u200b",
        "word " * 2000,  # far past the model's 256-token window: counted in full
        "\n\n\t x \r\n",
        "a" * 5000,
    ]
    expected = [len(tokenizer.encode(t, add_special_tokens=False)) if t else 0 for t in texts]
    assert [count(t) for t in texts] == expected
    assert count.many(texts) == [len(tokenizer.encode(t, add_special_tokens=False)) for t in texts]
    assert expected[4] == 2000  # not cut at the window


def test_a_long_count_lets_other_threads_run(embedding_model) -> None:
    """A count runs on a worker thread beside the event loop: the tokenizer must let the GIL go while
    it works (``Tokenizer.encode`` does not; a 1.2 MB count stopped every other thread for 1.4 s)."""
    import threading

    count = hf_token_counter(embedding_model.tokenizer)
    text = "word! " * 100_000
    for counted in (lambda: count(text), lambda: count.many([text, text])):
        done = threading.Event()
        worker = threading.Thread(target=lambda c=counted, d=done: (c(), d.set()))
        started = last = time.perf_counter()
        worst = 0.0
        worker.start()
        while not done.is_set():
            time.sleep(0.001)
            now = time.perf_counter()
            worst, last = max(worst, now - last), now
        worker.join()
        took = time.perf_counter() - started
        assert worst < max(0.3, took / 3), (worst, took)


def test_the_batch_count_is_bounded_in_texts_and_characters(embedding_model, monkeypatch) -> None:
    """``many`` keeps each call of the Rust tokenizer to ``_BATCH`` texts and about ``_BATCH_CHARS``
    characters (every encoding of a call is held until it returns); a longer text goes alone."""
    from ragserve.ingest import chunks

    count = hf_token_counter(embedding_model.tokenizer)
    backend, sizes = count._backend, []

    class Recording:
        def encode_batch(self, texts, **kwargs):
            sizes.append((len(texts), sum(map(len, texts))))
            return backend.encode_batch(texts, **kwargs)

    monkeypatch.setattr(count, "_backend", Recording())
    monkeypatch.setattr(chunks, "_BATCH", 4)
    monkeypatch.setattr(chunks, "_BATCH_CHARS", 100)
    texts = ["one two"] * 6 + ["word " * 40, "x" * 300, "tail"]
    assert count.many(texts) == [len(embedding_model.tokenizer.encode(t, add_special_tokens=False)) for t in texts]
    assert all(n <= 4 for n, _ in sizes) and all(c <= 100 or n == 1 for n, c in sizes), sizes
    assert (1, 300) in sizes  # the long text alone


def test_the_sentence_chunker_makes_the_same_chunks_counting_in_batches_or_one_by_one(embedding_model) -> None:
    count = hf_token_counter(embedding_model.tokenizer)
    text = (
        "Retrieval augmented generation combines search with generation. It cites sources! Does it? "
        + "One very long sentence without a stop " * 60
        + ". Short. Another one, e.g. with an abbreviation. 東京は大きい。次の文。 "
    ) * 3
    one_by_one = SentenceChunker(lambda t: count(t), chunk_size=64, chunk_overlap=16).split(text)
    batched = SentenceChunker(count, chunk_size=64, chunk_overlap=16).split(text)
    assert batched == one_by_one and len(batched) > 5


def test_empty_text() -> None:
    assert SentenceChunker(words).split("   \n ") == []
    with pytest.raises(ValueError):
        SentenceChunker(words, chunk_size=10, chunk_overlap=10)


@pytest.mark.parametrize(
    "text",
    ["\x00" * 50, "\u200b\u200c\u200d\u2060" * 10, "\ufeff", "\u202e\u200f \n\t", "\U000e0041\U000e007f", "\xa0\u3000"],
)
def test_text_without_a_visible_character_has_nothing_to_index(text: str) -> None:
    """Text of NUL, zero-width, direction or tag characters is refused as text of spaces is, in
    both splitters; one visible character among them is indexed."""
    chunker = DocumentChunker(words, chunk_size=10, chunk_overlap=2)
    assert chunker.chunk(text, {}) == []
    assert chunker.chunk(text, {"split_type": "code", "language": "python"}) == []
    assert [c.text for c in chunker.chunk(text + "x", {})] != []


# --- code -------------------------------------------------------------------------------------
PYTHON = '''import os
import sys


# Adds two numbers.
def add(a, b):
    return a + b


def sub(a, b):
    """Subtract b from a."""
    return a - b


class Calculator:
    """A calculator with state."""

    def __init__(self):
        self.total = 0

    def push(self, value):
        self.total += value
        return self.total

    def reset(self):
        self.total = 0
        return self.total
'''

GO = """package main

import "fmt"

// Add adds two ints.
func Add(a, b int) int {
\treturn a + b
}

func Sub(a, b int) int {
\treturn a - b
}

func main() {
\tfmt.Println(Add(1, 2), Sub(3, 1))
}
"""


def test_python_chunks_are_whole_functions_and_methods() -> None:
    chunks = CodeChunker(words, chunk_size=14).split(PYTHON, "python")
    texts = [c.text for c in chunks]
    add = "# Adds two numbers.\ndef add(a, b):\n    return a + b"
    assert sum(add in t for t in texts) == 1  # the comment travels with its function
    assert sum('def sub(a, b):\n    """Subtract b from a."""\n    return a - b' in t for t in texts) == 1
    for method in (
        "def push(self, value):\n        self.total += value\n        return self.total",
        "def reset(self):\n        self.total = 0\n        return self.total",
    ):
        assert sum(method in t for t in texts) == 1  # the class split into its methods
    assert all(words(t) <= 14 for t in texts)
    assert all(PYTHON[c.start_char : c.end_char] == c.text for c in chunks)


def test_a_deeply_indented_method_that_fits_stays_whole() -> None:
    # far more bytes than tokens (the embedding model's tokenizer counts no indentation): still
    # counted, not split for its length alone
    pad = " " * 24
    method = "    def load(self):\n" + "".join(f"{pad}x = y\n" for _ in range(3)) + f"{pad}return x\n"
    first = "    def first(self):\n        a = b\n        return a\n\n"
    text = "class Loader:\n" + first + method
    assert len(method) > 14 * 8 and words(method) <= 14
    chunks = CodeChunker(words, chunk_size=14).split(text, "python")
    assert sum(method.strip() in c.text for c in chunks) == 1


def test_go_chunks_are_whole_functions() -> None:
    chunks = CodeChunker(words, chunk_size=16).split(GO, "golang")
    texts = [c.text for c in chunks]
    for fn in (
        "// Add adds two ints.\nfunc Add(a, b int) int {\n\treturn a + b\n}",
        "func Sub(a, b int) int {\n\treturn a - b\n}",
        "func main() {\n\tfmt.Println(Add(1, 2), Sub(3, 1))\n}",
    ):
        assert sum(fn in t for t in texts) == 1


def test_small_code_is_one_chunk_and_unicode_offsets_hold() -> None:
    code = 'def greet():\n    return "héllo wörld ✓"\n'
    chunks = CodeChunker(words, chunk_size=100).split(code, "py")
    assert len(chunks) == 1 and chunks[0].text == code.strip()


@pytest.mark.parametrize(
    ("language", "code"),
    [
        ("javascript", "function a() { return 1; }\nconst b = () => 2;\n"),
        ("typescript", "function a(x: number): number { return x; }\ninterface P { x: number }\n"),
        ("tsx", "const C = () => <div>hi</div>;\n"),
        ("java", "class A { int f() { return 1; } int g() { return 2; } }\n"),
        ("rust", "fn a() -> i32 { 1 }\nfn b() -> i32 { 2 }\n"),
        ("c", "int a(void) { return 1; }\nint b(void) { return 2; }\n"),
        ("cpp", "int a() { return 1; }\nnamespace n { int b() { return 2; } }\n"),
    ],
)
def test_other_languages(language: str, code: str) -> None:
    chunks = CodeChunker(words, chunk_size=8).split(code, language)
    assert chunks and all(code[c.start_char : c.end_char] == c.text for c in chunks)
    assert "".join(c.text for c in chunks).replace(" ", "").replace("\n", "") == code.replace(" ", "").replace("\n", "")


def test_oversized_leaf_falls_back_to_lines() -> None:
    code = "x = [\n" + "".join(f"    {i},\n" for i in range(60)) + "]\n"
    chunks = CodeChunker(words, chunk_size=10).split(code, "python")
    assert len(chunks) > 3 and all(words(c.text) <= 10 for c in chunks)


def test_broken_code_does_not_crash() -> None:
    code = "def broken(:\n    return ((\nclass\n"
    assert CodeChunker(words, chunk_size=50).split(code, "python")


@pytest.mark.parametrize("language", ["cobol", "", None, 3])
def test_unsupported_language_lists_the_supported_ones(language) -> None:
    with pytest.raises(UnsupportedLanguageError) as e:
        DocumentChunker(words).chunk("x = 1", {"split_type": "code", "language": language})
    assert all(lang in str(e.value) for lang in SUPPORTED_LANGUAGES)


def test_document_chunker_dispatch() -> None:
    chunker = DocumentChunker(words, chunk_size=14, chunk_overlap=2)
    assert len(chunker.chunk(PYTHON, {"split_type": "code", "language": "python"})) > 2
    assert (
        chunker.chunk("One sentence. Two sentences.", {"split_type": "sentence"})[0].text
        == "One sentence. Two sentences."
    )
    assert chunker.chunk("Plain text.", None)[0].text == "Plain text."


@pytest.mark.parametrize("shape", [".", "a ", "a. ", "?!", "\u3002", "ab" * 40 + "-"])
def test_pathological_runs_are_cut_into_windows_within_the_chunk_size(embedding_model, shape: str) -> None:
    """Runs of punctuation, one-letter words and a word longer than the tokenizer reads whole: every
    chunk within the size by the real tokenizer, the text covered in order, chunks well filled
    (windows grow back after a cut, so they are not left at a fraction of the size)."""
    count = hf_token_counter(embedding_model.tokenizer)
    text = shape * (20_000 // len(shape))
    chunks = SentenceChunker(count, chunk_size=64, chunk_overlap=8).split(text)
    _check(chunks, text, count, 64, 8)
    sizes = [count(c.text) for c in chunks[:-1]]
    assert sizes and min(sizes) >= 64 // 2, sizes[:20]
