"""Whether what was retrieved is strong enough to answer, and the answer when it is not.

Two thresholds (docs/architecture.md §4): below ``similarity_threshold`` nothing is relevant and a
chat passes through (``no_context``). Above it, sources may be about the question's subject
without answering it: on real documentation, a question the documents cannot answer ("How do I
deploy a Flask application on Kubernetes?") retrieves sources as close by cosine as one they answer
(docs/quality.md), and a small model given them improvises. So the model is called only when

- a source holds every term of the query (``keyword_match``), or
- the best source's cosine score reaches ``answerable_threshold`` (a strong match);

else not when the question names something (an acronym, a product, a proper name:
``ragserve.rag.evidence.names``) that no source mentions, nor any other chunk of the index (the
service looks the names up: ``Assessment.missing``); "How do I connect Flask to PostgreSQL?" over
documentation that never says PostgreSQL; else when

- the sources mention what the question asks about: the ``coverage`` of its terms (weighted by
  their rarity, ``ragserve.rag.evidence``) reaches ``answerable_coverage``, or
- a passage says what the question is about: the best evidence score, without the share for
  holding what the question asks for (``Assessment.support``), reaches ``answerable_evidence`` (a
  paraphrase that shares few words with its answer);

otherwise the answer says plainly that the indexed documents do not cover the question and lists
the closest sources, without a model call. The thresholds were chosen on questions over real
documentation (docs/quality.md). Pure: the service passes what it retrieved and assessed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ragserve.api.documents import NodeWithScore
from ragserve.rag.evidence import Assessment
from ragserve.rag.prompt import source_label

#: The answer when the documents do not cover the question; the closest sources follow it, one a line.
NOT_COVERED_ANSWER = "The indexed documents do not cover this question. The closest sources are:"
#: How many of the closest sources a "not covered" answer lists (and sends as ``source_nodes``).
NOT_COVERED_SOURCES = 3


@dataclass(frozen=True)
class AnswerabilityRule:
    """The settings ``answerable_threshold``, ``answerable_coverage``, ``answerable_evidence``;
    ``enabled`` False (the setting ``answerability: false``) answers every relevant retrieval."""

    enabled: bool
    score: float
    coverage: float
    evidence: float


def answerable(nodes: Sequence[NodeWithScore], assessment: Assessment | None, rule: AnswerabilityRule) -> bool:
    """Whether to answer from ``nodes`` (the relevant sources, any order) with the model (see the
    module's docstring). ``assessment`` None (it could not be computed) answers: without it
    nothing says the sources fall short."""
    if not rule.enabled or assessment is None:
        return True
    if not nodes:
        return False
    if any(n.keyword_match for n in nodes) or max(n.score for n in nodes) >= rule.score:
        return True
    if assessment.missing:  # the question names something no source mentions
        return False
    if assessment.coverage >= rule.coverage:
        return True
    return assessment.support >= rule.evidence


def closest(nodes: Sequence[NodeWithScore]) -> list[NodeWithScore]:
    """The sources a "not covered" answer lists: the ``NOT_COVERED_SOURCES`` best by score."""
    return sorted(nodes, key=lambda n: n.score, reverse=True)[:NOT_COVERED_SOURCES]


def not_covered_answer(sources: Sequence[NodeWithScore]) -> str:
    """``NOT_COVERED_ANSWER`` and the sources numbered as in ``source_nodes``, one a line."""
    lines = [NOT_COVERED_ANSWER]
    for number, node in enumerate(sources, start=1):
        label = source_label(node)
        lines.append(f"[{number}] {label}" + ("" if label == node.doc_id else f" ({node.doc_id})"))
    return "\n".join(lines)
