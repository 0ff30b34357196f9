"""Sentence chunking sized in tokens of the embedding model.

Chunks are whole sentences packed up to ``chunk_size`` tokens, consecutive chunks sharing whole
trailing sentences worth up to ``chunk_overlap`` tokens, so a fact cut at a boundary is still found
whole in one chunk. Sizes are in the *embedding model's* tokens because that model truncates
anything longer than its window silently (256 word pieces for all-MiniLM-L6-v2).
"""

from __future__ import annotations

import re

from ragserve.ingest.chunks import Chunk, TokenCount, count_each, number

# Candidate ends: terminal punctuation (with closing quotes/brackets), or a newline; an end of
# punctuation counts only before whitespace (checked after the match). Every match is the longest
# at its start and nothing backtracks, so finding them all is linear in the text (the lookahead
# ``(?=\s)`` this had made a long run of "." quadratic: each of its starts rescanned the run).
_BOUNDARY = re.compile(r"[.!?]+[\"'”’)\]]*|\n")
_WORD = re.compile(r"\S+")
_ABBREVIATIONS = frozenset(
    {
        "e.g",
        "i.e",
        "etc",
        "vs",
        "dr",
        "mr",
        "mrs",
        "ms",
        "prof",
        "sr",
        "jr",
        "st",
        "no",
        "fig",
        "inc",
        "ltd",
        "co",
        "corp",
        "approx",
        "dept",
        "est",
        "al",
        "cf",
        "u.s",
        "u.k",
        "jan",
        "feb",
        "mar",
        "apr",
        "jun",
        "jul",
        "aug",
        "sep",
        "sept",
        "oct",
        "nov",
        "dec",
        "mt",
        "p",
        "pp",
        "vol",
        "ch",
        "sec",
        "eq",
    }
)
# The longest word that can be an abbreviation: the word before a "." is read back this far only.
_LONGEST_ABBREVIATION = max(len(a) for a in _ABBREVIATIONS)


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """[start, end) spans of sentences and lines; abbreviations and initials do not end sentences.
    Linear in ``len(text)`` for every shape of text: each character is matched once, the word
    before a "." is read back over the spaces and dots between it and the dot (each walked once in
    the whole text) and then a bounded distance, and whether a sentence has content yet is kept
    as it grows instead of being asked again of its whole text."""
    spans: list[tuple[int, int]] = []
    start = 0
    checked = 0  # text[start:checked] is all whitespace (when checked > start)
    size = len(text)
    for m in _BOUNDARY.finditer(text):
        first, end = m.start(), m.end()
        if text[first] != "\n":
            if end == size or not text[end].isspace():
                continue  # "3.14", "e.g.x", or the very end: not a boundary
            if text[first] == "." and _is_abbreviation(text, start, first):
                continue
        if checked < end and not text[checked:end].isspace():
            spans.append((start, end))
            start = end
        checked = end
    if text[start:].strip():
        spans.append((start, size))
    return spans


def _is_abbreviation(text: str, start: int, dot: int) -> bool:
    """Whether the word of ``text[start:dot]`` before the "." at ``dot`` is an abbreviation or an
    initial (that "." does not end a sentence). Spaces may stand between the word and the dot
    ("approx ."), and the word may end in dots of its own ("e.g. .", "A... b"): it is the word with
    those dots taken off that is read. Only its last ``_LONGEST_ABBREVIATION + 1`` characters are
    read: a longer word is neither, and its cut end is still longer than any abbreviation.

    Linear over a whole text: what is walked back over is the spaces after the last non-space
    character before this boundary, and the dots that end there (a run of dots is one boundary, so
    those dots end the word or are the boundary before): each is walked once, by the next boundary
    that starts with a dot, since walking stops at ``start`` and a sentence end moves ``start``."""
    end = dot
    while end > start and text[end - 1].isspace():
        end -= 1
    while end > start and text[end - 1] == ".":
        end -= 1
    if end == start or text[end - 1].isspace():
        return False  # no word before the dot, or a word of dots alone
    stem = text[max(start, end - _LONGEST_ABBREVIATION - 1) : end].split()[-1].lower()
    return stem in _ABBREVIATIONS or (len(stem) == 1 and stem.isalpha())


class SentenceChunker:
    def __init__(self, count_tokens: TokenCount, chunk_size: int = 256, chunk_overlap: int = 32):
        if chunk_size < 1 or not 0 <= chunk_overlap < chunk_size:
            raise ValueError("need chunk_size >= 1 and 0 <= chunk_overlap < chunk_size")
        self.count = count_tokens
        self.chunk_size = chunk_size
        self.chunk_overlap = chunk_overlap

    def split(self, text: str) -> list[Chunk]:
        if not text or not text.strip():
            return []
        units: list[tuple[int, int, int]] = []  # (start, end, tokens), each unit <= chunk_size
        spans = sentence_spans(text)
        # every sentence counted in one call where the counter has a batch form (``count_each``)
        for (s, e), n in zip(spans, count_each(self.count, [text[s:e] for s, e in spans]), strict=True):
            if n <= self.chunk_size:
                units.append((s, e, n))
            else:
                units.extend(self._split_long(text, s, e))
        return number(self._pack(text, units), text)

    def _split_long(self, text: str, start: int, end: int) -> list[tuple[int, int, int]]:
        """A sentence over the limit: windows of whole words; a word over the limit: characters."""
        out: list[tuple[int, int, int]] = []
        cur_start, cur_end, cur_n = -1, -1, 0
        words = list(_WORD.finditer(text, start, end))
        # each distinct word counted once, in batches (``count_each``): one call a word was ~15 µs
        # and the tokenizer's batch ~10 µs a word, seconds for 1 MB of "a "
        distinct = list(dict.fromkeys(m.group() for m in words))
        counts = dict(zip(distinct, count_each(self.count, distinct), strict=True))
        for m in words:
            n = counts[m.group()]
            if n > self.chunk_size:
                if cur_start >= 0:
                    out.append((cur_start, cur_end, cur_n))
                    cur_start, cur_n = -1, 0
                out.extend(self._split_chars(text, m.start(), m.end()))
                continue
            if cur_start >= 0 and cur_n + n > self.chunk_size:
                out.append((cur_start, cur_end, cur_n))
                cur_start, cur_n = -1, 0
            if cur_start < 0:
                cur_start = m.start()
            cur_end, cur_n = m.end(), cur_n + n
        if cur_start >= 0:
            out.append((cur_start, cur_end, cur_n))
        return out

    def _split_chars(self, text: str, start: int, end: int) -> list[tuple[int, int, int]]:
        """Windows of characters of at most ``chunk_size`` tokens. A window over the limit is cut in
        proportion to its excess (then by a quarter while still over), and the window after it
        starts from the size that fitted: about two counts a window, where shrinking by a quarter
        from twice the chunk size took five (1 MB of "." is 4,600 windows)."""
        out = []
        pos = start
        step = self.chunk_size * 2
        while pos < end:
            step = min(end - pos, max(step, 1))
            n = self.count(text[pos : pos + step])
            while step > 1 and n > self.chunk_size:
                step = max(1, min(step * 3 // 4, step * self.chunk_size // n))
                n = self.count(text[pos : pos + step])
            out.append((pos, pos + step, n))
            pos += step
            if n < self.chunk_size // 2:  # room to spare: try a larger window next
                step *= 2
        return out

    def _pack(self, text: str, units: list[tuple[int, int, int]]) -> list[tuple[int, int]]:
        """Greedy packing of units with whole-unit overlap; every chunk is verified by a real count."""
        chunks: list[tuple[int, int]] = []
        i = 0
        while i < len(units):
            j, total = i, 0
            while j < len(units) and total + units[j][2] <= self.chunk_size:
                total += units[j][2]
                j += 1
            j = max(j, i + 1)
            # token counts are not perfectly additive across sentence joins: verify and shrink
            while j > i + 1 and self.count(text[units[i][0] : units[j - 1][1]]) > self.chunk_size:
                j -= 1
            chunks.append((units[i][0], units[j - 1][1]))
            if j >= len(units):
                break
            # overlap: trailing whole units of this chunk worth <= chunk_overlap tokens
            # (and leaving room for the next unit, so every chunk brings something new)
            k, overlap = j, 0
            room = min(self.chunk_overlap, self.chunk_size - units[j][2])
            while k - 1 > i and overlap + units[k - 1][2] <= room:
                overlap += units[k - 1][2]
                k -= 1
            i = k
        return chunks
