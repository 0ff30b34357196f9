"""Bypass and split rules of docs/architecture.md §4, with every example of the RAGEngine algorithm."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from ragserve.api.openai import ChatCompletionRequest
from ragserve.rag.plan import EMPTY_QUERY_MESSAGE, ChatError, Passthrough, PassthroughReason, RagPlan, plan

INDEXES = {"docs_index", "my_index"}


def _plan(body: dict[str, Any]):
    return plan(ChatCompletionRequest.model_validate(body), lambda name: name in INDEXES)


def test_no_index_is_passthrough_and_keeps_unknown_fields() -> None:
    result = _plan(
        {
            "model": "gpt-4",
            "messages": [{"role": "user", "content": "Hello, how are you?"}],
            "logit_bias": {"50256": -100},
            "presence_penalty": 0.5,
        }
    )
    assert isinstance(result, Passthrough)
    assert result.reason is PassthroughReason.NO_INDEX
    assert result.body["logit_bias"] == {"50256": -100}
    assert result.body["presence_penalty"] == 0.5


def test_tools_are_passthrough_without_rag_fields() -> None:
    result = _plan(
        {
            "model": "gpt-4",
            "index_name": "my_index",
            "context_token_ratio": 0.4,
            "top_k": 3,
            "messages": [{"role": "user", "content": "What's the weather?"}],
            "tools": [{"type": "function", "function": {"name": "get_weather"}}],
        }
    )
    assert isinstance(result, Passthrough)
    assert result.reason is PassthroughReason.TOOLS
    assert "index_name" not in result.body
    assert "context_token_ratio" not in result.body
    assert "top_k" not in result.body
    assert result.body["tools"][0]["function"]["name"] == "get_weather"


def test_functions_are_passthrough() -> None:
    result = _plan(
        {
            "index_name": "my_index",
            "messages": [{"role": "user", "content": "hi"}],
            "functions": [{"name": "f", "parameters": {}}],
        }
    )
    assert isinstance(result, Passthrough) and result.reason is PassthroughReason.TOOLS


@pytest.mark.parametrize("role", ["function", "tool"])
def test_unsupported_role_is_passthrough(role: str) -> None:
    result = _plan(
        {
            "model": "gpt-4",
            "index_name": "my_index",
            "messages": [
                {"role": role, "content": "Weather data: 75°F", "name": "get_weather", "tool_call_id": "c1"},
                {"role": "user", "content": "Thanks!"},
            ],
        }
    )
    assert isinstance(result, Passthrough)
    assert result.reason is PassthroughReason.UNSUPPORTED_ROLE
    assert result.body["messages"][0]["tool_call_id"] == "c1"


def test_image_content_is_passthrough() -> None:
    result = _plan(
        {
            "model": "gpt-4",
            "index_name": "my_index",
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What's in this image?"},
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                    ],
                }
            ],
        }
    )
    assert isinstance(result, Passthrough)
    assert result.reason is PassthroughReason.NON_TEXT_CONTENT
    assert result.body["messages"][0]["content"][1]["image_url"]["url"].startswith("data:image/png")


def test_simple_query() -> None:
    result = _plan(
        {
            "model": "gpt-4",
            "index_name": "docs_index",
            "messages": [
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "What is KAITO?"},
            ],
        }
    )
    assert isinstance(result, RagPlan)
    assert result.query == "What is KAITO?"
    assert result.system == [{"role": "system", "content": "You are a helpful assistant."}]
    assert result.history == []
    assert result.params.indexes == ("docs_index",)


def test_multi_turn() -> None:
    result = _plan(
        {
            "model": "gpt-4",
            "index_name": "docs_index",
            "messages": [
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "What is KAITO?"},
                {"role": "assistant", "content": "KAITO is a Kubernetes operator for AI workloads."},
                {"role": "user", "content": "How do I install it?"},
            ],
        }
    )
    assert isinstance(result, RagPlan)
    assert result.query == "How do I install it?"
    assert result.system == [{"role": "system", "content": "You are a helpful assistant."}]
    assert result.history == [
        {"role": "user", "content": "What is KAITO?"},
        {"role": "assistant", "content": "KAITO is a Kubernetes operator for AI workloads."},
    ]


def test_consecutive_user_messages_joined_with_blank_line() -> None:
    result = _plan(
        {
            "model": "gpt-4",
            "index_name": "docs_index",
            "messages": [
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "What is KAITO?"},
                {"role": "assistant", "content": "KAITO is a Kubernetes operator."},
                {"role": "user", "content": "Tell me more about it."},
                {"role": "user", "content": "Specifically about GPU support."},
            ],
        }
    )
    assert isinstance(result, RagPlan)
    assert result.query == "Tell me more about it.\n\nSpecifically about GPU support."
    assert [m["role"] for m in result.history] == ["user", "assistant"]


def test_text_parts_are_joined_for_the_query() -> None:
    result = _plan(
        {
            "index_name": "docs_index",
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "first"}, {"type": "text", "text": "second"}]}
            ],
        }
    )
    assert isinstance(result, RagPlan)
    assert result.query == "first\nsecond"


def test_no_user_message_after_assistant_is_400_with_exact_message() -> None:
    result = _plan(
        {
            "model": "gpt-4",
            "index_name": "docs_index",
            "messages": [
                {"role": "user", "content": "What is KAITO?"},
                {"role": "assistant", "content": "KAITO is a Kubernetes operator."},
            ],
        }
    )
    assert isinstance(result, ChatError)
    assert result.status == 400
    assert result.message == EMPTY_QUERY_MESSAGE == "There must be a user prompt since the latest assistant message."


def test_unknown_index_is_404() -> None:
    result = _plan({"index_name": "nope", "messages": [{"role": "user", "content": "q"}]})
    assert isinstance(result, ChatError)
    assert result.status == 404
    assert result.message == "No such index: 'nope' exists."


def test_developer_message_is_system_part() -> None:
    result = _plan(
        {
            "index_name": "docs_index",
            "messages": [
                {"role": "developer", "content": "Answer in French."},
                {"role": "user", "content": "q"},
            ],
        }
    )
    assert isinstance(result, RagPlan)
    assert result.system == [{"role": "developer", "content": "Answer in French."}]


def test_rag_params_are_carried() -> None:
    result = _plan(
        {
            "index_name": "docs_index",
            "top_k": 7,
            "similarity_threshold": 0.3,
            "context_token_ratio": 0.6,
            "metadata_filter": {"author": "x"},
            "messages": [{"role": "user", "content": "q"}],
        }
    )
    assert isinstance(result, RagPlan)
    assert (result.params.top_k, result.params.similarity_threshold) == (7, 0.3)
    assert result.params.context_token_ratio == 0.6
    assert result.params.metadata_filter == {"author": "x"}
    assert "metadata_filter" not in result.body and "index_name" not in result.body


@pytest.mark.parametrize(
    ("messages", "fragment"),
    [
        ([{"role": "user"}], "messages[0]: 'content' is required for role 'user'"),
        (
            [{"role": "system", "content": "s"}, {"role": "user", "content": "   "}],
            "messages[1]: user content must not be empty",
        ),
        ([{"role": "user", "content": []}], "messages[0]: user content must not be an empty list"),
        ([{"role": "user", "content": [{"type": "text"}]}], "messages[0].content[0]: a text part needs 'text'"),
        ([{"role": "", "content": "x"}], "messages[0]: 'role' is required"),
    ],
)
def test_malformed_messages_are_400_naming_the_message(messages: list[dict[str, Any]], fragment: str) -> None:
    result = _plan({"index_name": "docs_index", "messages": messages})
    assert isinstance(result, ChatError)
    assert result.status == 400
    assert fragment in result.message


def test_malformed_messages_are_rejected_on_passthrough_too() -> None:
    result = _plan({"messages": [{"role": "user"}]})
    assert isinstance(result, ChatError) and result.status == 400


def test_assistant_without_content_is_fine() -> None:
    result = _plan(
        {
            "index_name": "docs_index",
            "messages": [
                {"role": "user", "content": "a"},
                {"role": "assistant", "content": None},
                {"role": "user", "content": "b"},
            ],
        }
    )
    assert isinstance(result, RagPlan)
    assert result.query == "b"


@pytest.mark.parametrize(
    "body",
    [
        {"messages": []},
        {"messages": [{"role": "user", "content": "x"}], "context_token_ratio": 0.9},
        {"messages": [{"role": "user", "content": "x"}], "context_token_ratio": 0.1},
        {"messages": [{"role": "user", "content": "x"}], "n": 2},
        {"messages": [{"role": "user", "content": "x"}], "metadata_filter": {"a": [1]}},
        {"messages": [{"role": "user", "content": "x"}], "index_name": "../etc"},
        {"messages": [{"role": "user", "content": "x"}], "stop": ["a", "b", "c", "d", "e"]},
    ],
)
def test_invalid_bodies_fail_validation(body: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        ChatCompletionRequest.model_validate(body)


def test_max_completion_tokens_wins() -> None:
    req = ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "x"}], "max_tokens": 10, "max_completion_tokens": 20}
    )
    assert req.requested_max_tokens() == 20
    assert req.stop_list() == []
