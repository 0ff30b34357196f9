"""Which retrieved nodes go into the prompt: the best ones above the threshold that fit the budget."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ragserve.api.documents import NodeWithScore


def passes_threshold(node: NodeWithScore, threshold: float) -> bool:
    """A node is relevant when its cosine score reaches ``threshold``, or when retrieval found every
    term of the query in it (``keyword_match``: a part number or a name matched word for word, whose
    cosine score may be low; see the setting ``lexical_match_min_terms``)."""
    return node.score >= threshold or bool(node.keyword_match)


def relevant(nodes: Sequence[NodeWithScore], threshold: float) -> list[NodeWithScore]:
    """Nodes that pass ``threshold`` (``passes_threshold``), best cosine score first."""
    return sorted((n for n in nodes if passes_threshold(n, threshold)), key=lambda n: n.score, reverse=True)


def select_context(
    nodes: Sequence[NodeWithScore], *, threshold: float, budget_tokens: int, cost: Callable[[NodeWithScore], int]
) -> tuple[list[NodeWithScore], list[NodeWithScore]]:
    """(selected, skipped): highest score first; a node that does not fit what is left is skipped and
    the next one tried, so one long node does not starve the rest."""
    selected: list[NodeWithScore] = []
    skipped: list[NodeWithScore] = []
    left = budget_tokens
    for node in relevant(nodes, threshold):
        c = cost(node)
        if c <= left:
            selected.append(node)
            left -= c
        else:
            skipped.append(node)
    return selected, skipped
