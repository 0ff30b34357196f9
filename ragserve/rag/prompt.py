"""The RAG prompt: retrieved context as numbered sources in one system message.

One system message, because many chat templates reject a second one; numbered sources, so the
model can cite ``[1]`` and a client can map the citation to ``source_nodes``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ragserve.api.documents import Evidence, NodeWithScore
from ragserve.api.messages import message_text
from ragserve.rag.evidence import prompt_text

CONTEXT_INSTRUCTIONS = (
    "Answer the user's question using the numbered sources below. Cite the sources you use as [1], [2]. "
    "If the sources do not contain the answer, say so instead of guessing."
)
SOURCES_HEADING = "Sources:"
#: What introduces the evidence repeated after the sources (``with_evidence``).
EVIDENCE_HEADING = "The passage that best answers the question:"
_LABEL_KEYS = ("title", "source", "file_name", "filename", "url", "path")


def source_label(node: NodeWithScore) -> str:
    for key in _LABEL_KEYS:
        value = node.metadata.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return node.doc_id


def format_source(number: int, node: NodeWithScore) -> str:
    """One source entry, its text as a model reads it (``prompt_text``: no markup lines); its token
    count is the node's marginal cost in the budget."""
    return f"[{number}] ({source_label(node)})\n{prompt_text(node.text).strip()}"


def format_context(nodes: Sequence[NodeWithScore]) -> str:
    return "\n\n".join(format_source(i, n) for i, n in enumerate(nodes, start=1))


def context_system_message(system_texts: Sequence[str], nodes: Sequence[NodeWithScore]) -> dict[str, str] | None:
    """The client's system texts, then the instructions and the sources; None if both are empty."""
    parts = [t for t in system_texts if t.strip()]
    if nodes:
        parts.append(f"{CONTEXT_INSTRUCTIONS}\n\n{SOURCES_HEADING}\n{format_context(nodes)}")
    return {"role": "system", "content": "\n\n".join(parts)} if parts else None


def build_rag_messages(
    system: Sequence[dict[str, Any]], history: Sequence[dict[str, Any]], query: str, nodes: Sequence[NodeWithScore]
) -> list[dict[str, Any]]:
    """[system + context] + history + [the query as the last user message]. With ``nodes`` the
    query is a question over them: the engine is told so (``SamplingParams.grounded``, from
    ``FitResult.grounded``), and the budget counts it so."""
    messages: list[dict[str, Any]] = []
    head = context_system_message([message_text(m) for m in system], nodes)
    if head is not None:
        messages.append(head)
    messages.extend(history)
    messages.append({"role": "user", "content": query})
    return messages


def with_evidence(messages: Sequence[dict[str, Any]], evidence: Sequence[Evidence]) -> list[dict[str, Any]]:
    """``messages`` (as ``build_rag_messages`` made them, sources in the first system message) with
    ``evidence`` repeated at the end of that message, each passage (its lines without their
    indentation, blank lines left out: a list stays a list) followed by the number of its source:
    the last thing before the question, where a small model looks for what to answer. Unchanged
    without evidence or without a system message."""
    if not evidence or not messages or messages[0].get("role") != "system":
        return list(messages)
    passages = "\n".join(_lines(e.text) + f" [{e.source}]" for e in evidence)
    head = dict(messages[0])
    head["content"] = f"{message_text(head)}\n\n{EVIDENCE_HEADING}\n{passages}"
    return [head, *messages[1:]]


def _lines(text: str) -> str:
    return "\n".join(line.strip() for line in prompt_text(text).splitlines() if line.strip())
