"""The contract every generation engine keeps (Haystack-style: one suite, run by each engine's tests).

A test module subclasses :class:`EngineContract` and provides two fixtures: ``engine`` (started) and
``generation_stopped``, an async callable that tells, from the engine's own evidence, that a stream
closed early stopped generating (an aborted vLLM request, a dropped upstream connection, a free
generation thread). What is checked is what the chat pipeline relies on: usage is counted, a
prompt over the window is the client's 400, tools are refused where the engine cannot serve them,
and closing a stream early stops generation.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from ragserve.api.sampling import SamplingParams
from ragserve.errors import BadRequestError, ServiceError
from ragserve.models.engine import GenerationEngine

MESSAGES = [
    {"role": "system", "content": "Answer in one short sentence."},
    {"role": "user", "content": "What does a vector database store?"},
]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


class EngineContract:
    async def test_usage_is_counted(self, engine: GenerationEngine) -> None:
        result = await engine.chat(MESSAGES, SamplingParams(max_tokens=4))
        assert result.prompt_tokens > 0 and 0 < result.completion_tokens <= 4
        assert result.usage().total_tokens == result.prompt_tokens + result.completion_tokens
        deltas = [d async for d in engine.chat_stream(MESSAGES, SamplingParams(max_tokens=4))]
        last = deltas[-1]
        assert last.finish_reason in {"stop", "length"} and last.usage() is not None
        assert last.prompt_tokens == result.prompt_tokens
        assert last.completion_tokens is not None
        assert last.completion_tokens == sum(1 for _ in deltas) - 1 or last.completion_tokens <= 4
        response = await engine.passthrough({"messages": MESSAGES, "max_tokens": 4}, 16)
        assert response.usage is not None and response.usage.prompt_tokens > 0

    async def test_a_prompt_over_the_window_is_the_clients_400(self, engine: GenerationEngine) -> None:
        window = engine.context_window()
        assert window is not None
        with pytest.raises(ServiceError) as err:
            await engine.chat([{"role": "user", "content": "word " * (window + 8)}], SamplingParams(max_tokens=4))
        assert err.value.status == 400

    async def test_tools_are_refused_where_they_cannot_be_served(self, engine: GenerationEngine) -> None:
        body: dict[str, Any] = {"messages": MESSAGES, "max_tokens": 4, "tools": TOOLS}
        if engine.serves_rich_requests:
            response = await engine.passthrough(body, 16)
            assert response.choices
            return
        with pytest.raises(BadRequestError) as err:
            await engine.passthrough(body, 16)
        assert err.value.status == 400 and "tools" in err.value.message
        with pytest.raises(BadRequestError):
            [c async for c in engine.passthrough_stream({**body, "stream": True}, 16)]

    async def test_closing_a_stream_early_stops_generation(
        self, engine: GenerationEngine, generation_stopped: Callable[[], Awaitable[bool]]
    ) -> None:
        stream = engine.chat_stream(MESSAGES, SamplingParams(max_tokens=200))
        first = await anext(stream)
        assert first.finish_reason is None
        await stream.aclose()
        assert await generation_stopped()
