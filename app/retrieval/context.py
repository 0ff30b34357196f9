"""Which retrieved nodes go into the prompt: the best ones above the threshold that fit the budget."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from app.api.documents import NodeWithScore


def relevant(nodes: Sequence[NodeWithScore], threshold: float) -> list[NodeWithScore]:
    """Nodes scoring at least ``threshold``, best first."""
    return sorted((n for n in nodes if n.score >= threshold), key=lambda n: n.score, reverse=True)


def select_context(nodes: Sequence[NodeWithScore], *, threshold: float, budget_tokens: int,
                   cost: Callable[[NodeWithScore], int]) -> tuple[list[NodeWithScore], list[NodeWithScore]]:
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
