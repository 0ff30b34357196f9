"""The answer's ``[n]`` markers, checked against the numbered sources the model was given.

The prompt numbers the sources ``[1]``..``[N]`` in the order of ``source_nodes`` (``prompt.py``), so
a marker maps to a node by position. A marker naming no supplied source (``[0]``, ``[N+1]``) is a
model's invention: it is reported as invalid rather than dropped silently, so a client can tell.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from app.api.documents import NodeWithScore
from app.api.openai import Citation, InvalidCitation
from app.retrieval.prompt import source_label

# "[1]", "[1, 2]", "[1][2]" (two matches); not "[a]" nor a link "[text](url)"'s text
_MARKER = re.compile(r"\[(\d{1,4}(?:\s*,\s*\d{1,4})*)\](?!\()")
_SENTENCE_END = re.compile(r"[.!?\n]")


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
    for m in _MARKER.finditer(answer):
        start = _claim_start(answer, m.start(), floor)
        for number in (int(n) for n in m.group(1).split(",")):
            if 1 <= number <= len(sources):
                node = sources[number - 1]
                valid.append(
                    Citation(marker=number, node_id=node.node_id, doc_id=node.doc_id, start=start, end=m.end())
                )
            else:
                invalid.append(InvalidCitation(marker=number, start=start, end=m.end()))
        floor = m.end()
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
