"""The answer's ``[n]`` markers, checked against the numbered sources the model was given.

The prompt numbers the sources ``[1]``..``[N]`` in the order of ``source_nodes`` (``prompt.py``), so
a marker maps to a node by position. A marker naming no supplied source (``[0]``, ``[N+1]``) is a
model's invention: it is reported as invalid rather than dropped silently, so a client can tell.
``[n]`` inside Markdown code (an inline code span, a fenced block, closed or not) is code, not a
citation (``a[1]``). Every scan is linear in the answer's length.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ragserve.api.documents import NodeWithScore
from ragserve.api.openai import Citation, InvalidCitation
from ragserve.rag.prompt import source_label

# "[1]", "[1, 2]", "[1][2]" (two matches); not "[a]" nor a link "[text](url)"'s text. Linear: from
# a "[", each step of the repetition can only match one way (a comma must separate the numbers).
_MARKER = re.compile(r"\[(\d{1,4}(?:\s*,\s*\d{1,4})*)\](?!\()")
_SENTENCE_END = re.compile(r"[.!?\n]")
# CommonMark: a fence is a line of 3+ backticks or tildes after at most 3 spaces (a backtick one's
# info string holds no backtick); it closes at a line of at least as many of the same character
# and nothing else, or at the end of the text.
_FENCE_LINE = re.compile(r"^ {0,3}(`{3,}|~{3,})([^\n]*)", re.M)
_BACKTICKS = re.compile(r"`+")


def _fenced_blocks(text: str) -> list[tuple[int, int]]:
    """The ``[start, end)`` spans of fenced code blocks, an unclosed one running to the end: one
    pass over the lines that look like fences."""
    spans: list[tuple[int, int]] = []
    opening: re.Match[str] | None = None
    for line in _FENCE_LINE.finditer(text):
        fence, rest = line.group(1), line.group(2)
        if opening is None:
            if not (fence[0] == "`" and "`" in rest):  # "```a```" is an inline span
                opening = line
        elif fence[0] == opening.group(1)[0] and len(fence) >= len(opening.group(1)) and not rest.strip(" \t"):
            spans.append((opening.start(), line.end()))
            opening = None
    if opening is not None:
        spans.append((opening.start(), len(text)))
    return spans


def _code_spans(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """Inline code spans in ``text[start:end]``: a run of n backticks up to the next run of exactly
    n (an opening run with none after it is literal). Linear: the next run of each length is found
    once, from the right."""
    runs = [(m.start(), m.end()) for m in _BACKTICKS.finditer(text, start, end)]
    following: list[int | None] = [None] * len(runs)
    last: dict[int, int] = {}
    for i in range(len(runs) - 1, -1, -1):
        length = runs[i][1] - runs[i][0]
        following[i] = last.get(length)
        last[length] = i
    spans: list[tuple[int, int]] = []
    i = 0
    while i < len(runs):
        j = following[i]
        if j is None:
            i += 1
        else:
            spans.append((runs[i][0], runs[j][1]))
            i = j + 1
    return spans


def code_regions(text: str) -> list[tuple[int, int]]:
    """Where ``text`` (Markdown) is code, in order: fenced blocks and the inline spans between them."""
    regions: list[tuple[int, int]] = []
    pos = 0
    for start, end in [*_fenced_blocks(text), (len(text), len(text))]:
        regions += _code_spans(text, pos, start)
        if end > start:
            regions.append((start, end))
        pos = end
    return regions


def _without_code(text: str) -> str:
    """``text`` with its code blanked out (NUL, same length): markers are searched for in this, so
    that one inside code (``a[1]``), or partly inside, is not found; positions stay the text's."""
    pieces, pos = [], 0
    for start, end in code_regions(text):
        pieces += [text[pos:start], "\0" * (end - start)]
        pos = end
    pieces.append(text[pos:])
    return "".join(pieces)


def _claim_start(text: str, marker_start: int, floor: int) -> int:
    """Where the claim a marker supports begins: after the previous sentence end (a marker placed
    after the full stop supports the sentence before it) or the previous marker, whichever is later."""
    i = marker_start
    while i > floor and text[i - 1].isspace():
        i -= 1
    if i > floor and text[i - 1] in ".!?":
        i -= 1  # "...the pump. [1]": the stop ends the cited sentence
    start = floor
    for m in _SENTENCE_END.finditer(text, floor, i):
        start = m.end()
    while start < marker_start and text[start].isspace():
        start += 1
    return start


def parse_citations(answer: str, sources: Sequence[NodeWithScore]) -> tuple[list[Citation], list[InvalidCitation]]:
    """(citations of supplied sources, invalid markers), in the order they appear. Each carries the
    span ``[start, end)`` of the answer it supports: the claim before the marker, marker included."""
    valid: list[Citation] = []
    invalid: list[InvalidCitation] = []
    floor = 0
    for m in _MARKER.finditer(_without_code(answer)):
        start, end = _claim_start(answer, m.start(), floor), m.end()
        for number in map(int, m.group(1).split(",")):
            if 1 <= number <= len(sources):
                node = sources[number - 1]
                valid.append(
                    Citation(
                        marker=number,
                        node_id=node.node_id,
                        doc_id=node.doc_id,
                        index_name=node.index_name,
                        start=start,
                        end=end,
                    )
                )
            else:
                invalid.append(InvalidCitation(marker=number, start=start, end=end))
        floor = end
    return valid, invalid


def sources_footer(sources: Sequence[NodeWithScore], citations: Sequence[Citation]) -> str:
    """A plain-text "Sources:" list for the end of the answer (``sources_in_content``): the sources
    cited, or every source supplied when none was, numbered as in the prompt."""
    cited = sorted({c.marker for c in citations})
    numbers = cited or list(range(1, len(sources) + 1))
    lines = []
    for n in numbers:
        node = sources[n - 1]
        label = source_label(node)
        lines.append(f"[{n}] {label}" + ("" if label == node.doc_id else f" ({node.doc_id})"))
    return "\n\nSources:\n" + "\n".join(lines) if lines else ""
