"""Fitting system prompt, history, retrieved context and completion into the window (docs/architecture.md §5).

Everything is counted with the served model's counter over the messages as they will be sent, so
the request never overflows the window upstream, and ``max_tokens`` sent is never null. Messages
that carry sources are counted ``grounded``, as the engine is told to render them
(``FitResult.grounded`` → ``SamplingParams.grounded``): a plain-text prompt format ends a question
over sources with ``Answer:``, a chat with ``Assistant:``, and the count must be of the prompt the
model gets.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import ragserve.rag.prompt as rag_prompt
from ragserve.api.documents import NodeWithScore
from ragserve.api.messages import Message
from ragserve.errors import BadRequestError
from ragserve.ports import TokenCounter
from ragserve.rag.context import relevant, select_context


class PromptTooLongError(BadRequestError):
    """The required part of the prompt and the smallest completion do not fit the window: the
    client's to shorten (400, OpenAI's ``context_length_exceeded``)."""

    def __init__(self, prompt_tokens: int, min_completion: int, window: int):
        super().__init__(
            f"Prompt length exceeds context window: the prompt needs {prompt_tokens} tokens and at least "
            f"{min_completion} are reserved for the completion, but the context window is {window} tokens. "
            f"Shorten the messages or the system prompt.",
            param="messages",
            code="context_length_exceeded",
        )
        self.prompt_tokens = prompt_tokens
        self.min_completion = min_completion
        self.window = window


class ContextBudgetError(BadRequestError):
    """Relevant sources were retrieved but none fits what the window leaves for them, most often
    because ``max_tokens`` takes the rest (400, ``context_budget``). Answering without them would not
    be the grounded answer asked for, and calling that ``no_context`` would not be true."""

    def __init__(self, fitted: FitResult, *, param: str, requested_max_tokens: int | None):
        lower = ""
        if requested_max_tokens is not None and fitted.max_tokens_for_sources:
            lower = f"lower {param} (now {requested_max_tokens}) to at most about {fitted.max_tokens_for_sources}, or "
        super().__init__(
            f"No retrieved source fits the prompt: {fitted.relevant_sources} relevant source(s) were found, "
            f"but {fitted.context_budget} tokens are left for sources and the smallest needs "
            f"{fitted.smallest_source_tokens}. To answer from the index, {lower}shorten the messages or the "
            "system prompt; a request without index_name is answered without sources.",
            param=param if requested_max_tokens is not None else "messages",
            code="context_budget",
        )


@dataclass
class FitResult:
    messages: list[Message]
    nodes_used: list[NodeWithScore]
    nodes_skipped: list[NodeWithScore] = field(default_factory=list)
    history_kept: int = 0
    history_dropped: int = 0
    max_tokens: int = 0
    prompt_tokens: int = 0
    context_tokens: int = 0
    history_tokens: int = 0
    window: int = 0
    exact: bool = True
    #: What sources and history may take together, the margin for estimated counts kept.
    usable: int = 0
    #: Nodes that reached the threshold, the tokens left for them, and when none fitted: what the
    #: cheapest one needs and about the largest max_tokens that would leave room for it (None: none).
    relevant_sources: int = 0
    context_budget: int = 0
    smallest_source_tokens: int = 0
    max_tokens_for_sources: int | None = None

    def room_for(self, prompt_tokens: int) -> bool:
        """Whether these messages with more added to their sources (``prompt_tokens`` in all, as
        counted) still fit: sources and history within ``usable``, and ``max_tokens`` left."""
        fixed = self.prompt_tokens - self.context_tokens - self.history_tokens
        return prompt_tokens - fixed <= self.usable and prompt_tokens + self.max_tokens <= self.window

    @property
    def grounded(self) -> bool:
        """Whether ``messages`` carry sources: what the engine is to be told
        (``SamplingParams.grounded``), as ``prompt_tokens`` was counted."""
        return bool(self.nodes_used)


def _message_cost(counter: TokenCounter, message: Message, empty: int) -> int:
    """What one message adds to a prompt: its count inside a chat minus the empty chat's."""
    return max(0, counter.count_messages([message]) - empty)


def fit(
    *,
    counter: TokenCounter,
    window: int,
    system: Sequence[Message],
    history: Sequence[Message],
    query: str,
    nodes: Sequence[NodeWithScore],
    requested_max_tokens: int | None,
    default_max_tokens: int = 256,
    min_completion_tokens: int = 16,
    context_ratio: float = 0.5,
    similarity_threshold: float = 0.5,
    safety_ratio: float | None = None,
    history_min_messages: int = 0,
    history_max_messages: int = 200,
    max_context_tokens: int | None = None,
) -> FitResult:
    """``max_context_tokens``: what the sources may take at most, below the window's share (what the
    model can afford, ``ragserve.rag.context_size``); None: the share alone. When not even the best
    source fits it, the best one that fits the share is taken alone: a small budget means few
    sources, never none."""
    candidates = found = relevant(nodes, similarity_threshold)
    min_completion = min(min_completion_tokens, requested_max_tokens or min_completion_tokens)

    # 1. the required part: system + query (+ the context framing when context will be used)
    base = counter.count_messages(rag_prompt.build_rag_messages(system, [], query, []))
    if base + min_completion > window:
        raise PromptTooLongError(base, min_completion, window)
    framing = 0
    if candidates:
        empty_source = NodeWithScore(doc_id="", node_id="", text="", score=1.0)
        with_source = rag_prompt.build_rag_messages(system, [], query, [empty_source])
        framing = counter.count_messages(with_source, grounded=True) - base
        if base + framing + min_completion > window:
            candidates, framing = [], 0
    required = base + framing

    # 2. the completion reserve
    reserve = min(requested_max_tokens or default_max_tokens, window - required)

    # 3. the free budget, shared between context and history
    safety = safety_ratio if safety_ratio is not None else (1.0 if counter.exact else 0.8)
    usable = max(0, math.floor((window - required - reserve) * safety))
    share = math.floor(usable * context_ratio)
    context_budget = share if max_context_tokens is None else max(0, min(share, max_context_tokens))

    # 4. context: best nodes first, skipping those that do not fit. A node's cost is asked for in
    # the selection and twice in the totals: counted once (tokenizing is most of fit's time)
    costs: dict[int, int] = {}

    def node_cost(node: NodeWithScore) -> int:
        key = id(node)  # the nodes live as long as this call
        if key not in costs:
            costs[key] = counter.count_text("\n\n" + rag_prompt.format_source(9, node))
        return costs[key]

    selected, skipped = select_context(
        candidates, threshold=similarity_threshold, budget_tokens=context_budget, cost=node_cost
    )
    if not selected and context_budget < share:  # the cap, not the window, left no source
        context_budget = share  # the best source that fits the share, alone; or the error's numbers
        best = next((n for n in skipped if node_cost(n) <= share), None)
        if best is not None:
            selected, skipped = [best], [n for n in skipped if n is not best]
    context_used = sum(node_cost(n) for n in selected)

    # 5. history: newest first, whole messages; unused context budget flows here
    history_budget = usable - context_used
    empty = counter.count_messages([])
    kept: list[Message] = []
    spent = 0
    for message in reversed(history):
        if len(kept) >= history_max_messages:
            break
        cost = _message_cost(counter, message, empty)
        if spent + cost > history_budget and len(kept) >= history_min_messages:
            break
        kept.insert(0, message)
        spent += cost
    protected = min(history_min_messages, len(kept))

    # 6. count the assembled request; shed until it fits (counts are not perfectly additive)
    while True:
        messages = rag_prompt.build_rag_messages(system, kept, query, selected)
        prompt = counter.count_messages(messages, grounded=bool(selected))
        if prompt + reserve <= window:
            break
        if len(kept) > protected:
            kept.pop(0)
        elif prompt + min_completion <= window:
            reserve = window - prompt
            break
        elif selected:
            skipped.append(selected.pop())
        elif kept:
            kept.pop(0)
            protected = min(protected, len(kept))
        else:
            raise PromptTooLongError(prompt, min_completion, window)

    smallest, room = 0, None
    if found and not selected:  # what it would take to fit one (the caller says so: ContextBudgetError)
        smallest = min(node_cost(n) for n in found)
        if framing:  # else the system prompt and query leave no room for a source at all
            room = window - required - math.ceil(smallest / max(context_ratio * safety, 1e-9)) - 1
            room = room if room >= min_completion else None

    return FitResult(
        messages=messages,
        nodes_used=selected,
        nodes_skipped=skipped,
        history_kept=len(kept),
        history_dropped=len(history) - len(kept),
        max_tokens=reserve,
        prompt_tokens=prompt,
        context_tokens=sum(node_cost(n) for n in selected) + (framing if selected else 0),
        history_tokens=sum(_message_cost(counter, m, empty) for m in kept),
        window=window,
        exact=counter.exact,
        usable=usable,
        relevant_sources=len(found),
        context_budget=context_budget,
        smallest_source_tokens=smallest,
        max_tokens_for_sources=room,
    )


def fit_passthrough(
    *,
    counter: TokenCounter,
    window: int,
    messages: Sequence[Message],
    requested_max_tokens: int | None,
    default_max_tokens: int = 256,
    min_completion_tokens: int = 16,
) -> tuple[int, int]:
    """(prompt tokens, clamped max_tokens) for a request forwarded unchanged."""
    prompt = counter.count_messages(messages)
    min_completion = min(min_completion_tokens, requested_max_tokens or min_completion_tokens)
    if prompt + min_completion > window:
        raise PromptTooLongError(prompt, min_completion, window)
    return prompt, min(requested_max_tokens or default_max_tokens, window - prompt)
