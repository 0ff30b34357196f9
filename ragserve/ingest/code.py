"""Code chunking over tree-sitter syntax trees.

A chunk is a run of whole top-level syntax nodes (functions, classes, declarations), small
neighbours (imports, comments, short statements) merged up to ``chunk_size`` tokens; a node too
large is split into its children (a class into its methods), and only as a last resort by lines.
The text before a node (its comments, decorators' blank lines) travels with the node.
"""

from __future__ import annotations

import importlib
import threading
import time
from collections.abc import Callable
from typing import Any

from ragserve.ingest.chunks import Chunk, ChunkingError, TokenCount, count_each, number

# language -> (grammar module, function returning the language pointer)
_GRAMMARS: dict[str, tuple[str, str]] = {
    "python": ("tree_sitter_python", "language"),
    "javascript": ("tree_sitter_javascript", "language"),
    "typescript": ("tree_sitter_typescript", "language_typescript"),
    "tsx": ("tree_sitter_typescript", "language_tsx"),
    "go": ("tree_sitter_go", "language"),
    "java": ("tree_sitter_java", "language"),
    "rust": ("tree_sitter_rust", "language"),
    "c": ("tree_sitter_c", "language"),
    "cpp": ("tree_sitter_cpp", "language"),
}
_ALIASES = {
    "py": "python",
    "python3": "python",
    "js": "javascript",
    "jsx": "javascript",
    "node": "javascript",
    "ts": "typescript",
    "golang": "go",
    "rs": "rust",
    "c++": "cpp",
    "cxx": "cpp",
    "cc": "cpp",
    "h": "c",
    "hpp": "cpp",
}
SUPPORTED_LANGUAGES: tuple[str, ...] = tuple(_GRAMMARS)


class UnsupportedLanguageError(ChunkingError):
    def __init__(self, language: str | None):
        shown = "missing" if not language else repr(language)
        super().__init__(
            f"code splitting needs metadata.language; {shown} is not supported. "
            f"Supported languages: {', '.join(SUPPORTED_LANGUAGES)}"
        )


def normalise_language(language: Any) -> str:
    if not isinstance(language, str) or not language.strip():
        raise UnsupportedLanguageError(None)
    name = language.strip().lower()
    name = _ALIASES.get(name, name)
    if name not in _GRAMMARS:
        raise UnsupportedLanguageError(language)
    return name


_parsers: dict[str, Any] = {}
_parsers_lock = threading.Lock()


def _parser(language: str) -> Any:
    """A new parser (cheap; parsers are not shared between threads) over a language loaded once."""
    with _parsers_lock:
        if language not in _parsers:
            from tree_sitter import Language

            module, func = _GRAMMARS[language]
            _parsers[language] = Language(getattr(importlib.import_module(module), func)())
        lang = _parsers[language]
    from tree_sitter import Parser

    return Parser(lang)


#: The CPU time a parse may take: ``PARSE_SECONDS`` plus ``PARSE_SECONDS_PER_MB`` a MB of code.
#: tree-sitter parses ordinary code at 0.3-0.5 s a MB here, but some shapes cost far more (C++'s
#: ``A<A<A<...``: ~9 s a MB), and it holds the GIL throughout: every other thread of the process,
#: the event loop's too, waits (py-tree-sitter #111). Its progress callback, called every few bytes,
#: runs a little Python, which lets other threads in, and stops a parse past its time; such a file
#: is then split by lines, as a node nested too deep is.
PARSE_SECONDS = 0.25
PARSE_SECONDS_PER_MB = 1.5
#: Bytes handed to the parser a read.
_READ_BYTES = 1 << 16


def parse_bounded(language: str, data: bytes) -> Any | None:
    """``data``'s syntax tree, or None when parsing it took more than its CPU time (see above)."""
    parser = _parser(language)
    budget = PARSE_SECONDS + PARSE_SECONDS_PER_MB * len(data) / 1e6
    start = time.thread_time()  # this thread's: a busy machine does not cut an ordinary file short

    def past_time(_offset: int, _has_error: bool) -> bool:
        return time.thread_time() - start > budget

    try:
        return parser.parse(lambda offset, _point: data[offset : offset + _READ_BYTES], progress_callback=past_time)
    except ValueError:  # "Parsing failed": stopped by past_time
        return None


#: Syntax-tree levels followed when splitting; deeper structure is split by lines instead.
MAX_DEPTH = 100
#: How far a node is counted, in bytes a token of the chunk size (8 KB for 256 tokens): code
#: averages 3-4 bytes a token, and even deeply indented code, whose indentation the embedding
#: model's tokenizer does not count, stays under 20.
COUNTED_BYTES_PER_TOKEN = 32


class CodeChunker:
    def __init__(self, count_tokens: TokenCount, chunk_size: int = 256, chunk_overlap: int = 32):
        from ragserve.ingest.sentence import SentenceChunker

        self.count = count_tokens
        self.chunk_size = chunk_size
        self._lines = SentenceChunker(count_tokens, chunk_size, min(chunk_overlap, chunk_size - 1))

    def split(self, text: str, language: str) -> list[Chunk]:
        lang = normalise_language(language)
        if not text.strip():
            return []
        data = text.encode("utf-8")
        tree = parse_bounded(lang, data)
        if tree is None:
            return number([(c.start_char, c.end_char) for c in self._by_lines(text)], text)
        to_char = _offset_mapper(text, data)
        segments: list[tuple[int, int]] = []
        self._segments(tree.root_node, 0, len(data), data, segments)
        char_spans = [(to_char(s), to_char(e)) for s, e in segments]
        spans: list[tuple[int, int]] = []
        for s, e in self._merge(text, char_spans):
            if self.count(text[s:e]) <= self.chunk_size:
                spans.append((s, e))
            else:  # an unsplittable node (a huge literal, a long leaf): by lines, then words
                spans.extend((s + c.start_char, s + c.end_char) for c in self._by_lines(text[s:e]))
        return number(spans, text)

    def _segments(
        self, node: Any, start: int, end: int, data: bytes, out: list[tuple[int, int]], depth: int = 0
    ) -> None:
        """Byte spans covering [start, end) along ``node``'s children; each child owns the text
        before it; oversized children recurse into their own children. Below ``MAX_DEPTH`` levels a
        node is kept whole (and later split by lines), so deeply nested code cannot exhaust the stack."""
        children = [c for c in node.children if c.end_byte > c.start_byte]
        if not children or depth >= MAX_DEPTH:
            out.append((start, end))
            return
        segments: list[tuple[Any, int, int]] = []  # (child, start, end)
        pos = start
        for i, child in enumerate(children):
            if "comment" in child.type and i < len(children) - 1:
                continue  # a comment belongs with the node that follows it
            seg_end = max(end if i == len(children) - 1 else child.end_byte, pos)
            segments.append((child, pos, seg_end))
            pos = seg_end
        # the children that could be split are counted in one batch (one call per child cost
        # about 0.1 ms of Python each: seconds for a file of many small statements), each only as
        # far as COUNTED_BYTES_PER_TOKEN bytes a token of the chunk size: counting every level's
        # nodes whole cost the depth times the file (100 levels of nested brackets: 100x a flat
        # file's time). A prefix over the chunk size means the node is; a node longer than the
        # prefix whose prefix fits is whitespace, nearly all (the embedding model's tokenizer counts
        # none), and is split: ``_merge`` joins its parts again where they fit.
        splittable = [(c, s, e) for c, s, e in segments if c.child_count]
        longest = self.chunk_size * COUNTED_BYTES_PER_TOKEN
        counts = count_each(
            self.count, [data[s : min(e, s + longest)].decode("utf-8", errors="ignore") for _, s, e in splittable]
        )
        oversized = {
            id(c) for (c, s, e), n in zip(splittable, counts, strict=True) if n > self.chunk_size or e - s > longest
        }
        for child, s, e in segments:
            if id(child) in oversized:
                self._segments(child, s, e, data, out, depth + 1)
            else:
                out.append((s, e))
        if pos < end:
            out.append((pos, end))

    def _merge(self, text: str, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """Adjacent segments merged greedily while their counts add up to at most the chunk size.
        Each segment is counted once (in one batch): counting the growing merged text at every
        step made a file of many small statements cost a chunk's count per statement (100 KB of
        ``a;`` took 13 s). ``split`` checks every merged chunk with a real count."""
        spans = [(s, e) for s, e in spans if e > s]
        merged: list[tuple[int, int]] = []
        total = 0
        for (s, e), n in zip(spans, count_each(self.count, [text[s:e] for s, e in spans]), strict=True):
            if merged and total + n <= self.chunk_size:
                merged[-1] = (merged[-1][0], e)
                total += n
            else:
                merged.append((s, e))
                total = n
        return merged

    def _by_lines(self, text: str) -> list[Chunk]:
        lines = text.splitlines(keepends=True)
        out: list[tuple[int, int]] = []
        start, pos, total = 0, 0, 0
        for line, n in zip(lines, count_each(self.count, lines), strict=True):
            if pos > start and total + n > self.chunk_size:
                out.append((start, pos))
                start, total = pos, 0
            pos += len(line)
            total += n
        out.append((start, len(text)))
        chunks: list[Chunk] = []
        for s, e in out:
            if self.count(text[s:e]) <= self.chunk_size:
                chunks.append(Chunk(text[s:e], len(chunks), s, e))
            else:
                chunks.extend(
                    Chunk(c.text, len(chunks) + k, s + c.start_char, s + c.end_char)
                    for k, c in enumerate(self._lines.split(text[s:e]))
                )
        return chunks


def _offset_mapper(text: str, data: bytes) -> Callable[[int], int]:
    """Byte offset → character offset (tree-sitter reports bytes)."""
    if len(data) == len(text):
        return lambda b: b
    table = [0] * (len(data) + 1)
    b = 0
    for i, ch in enumerate(text):
        n = len(ch.encode("utf-8"))
        for k in range(n):
            table[b + k] = i
        b += n
    table[len(data)] = len(text)
    return lambda off: table[off]
