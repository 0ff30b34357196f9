"""Chat-completion planning: bypass decision and message split (docs/architecture.md §4)."""

from app.chat.plan import (
    EMPTY_QUERY_MESSAGE,
    ChatError,
    ChatPlan,
    Passthrough,
    PassthroughReason,
    RagParams,
    RagPlan,
    plan,
    split_messages,
    unknown_index,
)

__all__ = [
    "EMPTY_QUERY_MESSAGE",
    "ChatError",
    "ChatPlan",
    "Passthrough",
    "PassthroughReason",
    "RagParams",
    "RagPlan",
    "plan",
    "split_messages",
    "unknown_index",
]
