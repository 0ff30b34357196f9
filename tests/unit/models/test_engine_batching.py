"""The embedded transformers engine serving concurrent requests in shared decode steps, on a tiny
randomly initialised Gemma 3 and a character tokenizer installed with ``_install`` (nothing is
downloaded; the packaged Gemma's own check is in test_engine_transformers.py, slow).

What a client sees must not depend on the company its request keeps: each concurrent chat or
stream gets the answer, finish reason and usage it gets alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from ragserve.api.generation import GenerationDelta, GenerationResult
from ragserve.api.sampling import SamplingParams
from ragserve.errors import EngineError
from ragserve.models.transformers_engine import DEFAULT_MAX_BATCH, TransformersEngine
from ragserve.testing.contracts.engine import EngineContract
from tests.unit.models.stand_ins import Breakable, CharTokenizer, tiny_gemma

WAIT_S = 60  # a liveness bound, never a speed one


@pytest.fixture(scope="module")
def model() -> Any:
    return tiny_gemma()


def installed(model: Any, prompt_format: str = "chat", **engine_args: Any) -> TransformersEngine:
    engine = TransformersEngine(
        "tiny", "/nonexistent", engine_args={"prefill_chunk": 8, **engine_args}, prompt_format=prompt_format
    )
    engine._install(CharTokenizer(), model)
    return engine


@pytest.fixture
async def engines(model: Any) -> AsyncIterator[Callable[..., TransformersEngine]]:
    made: list[TransformersEngine] = []

    def make(prompt_format: str = "chat", **engine_args: Any) -> TransformersEngine:
        made.append(installed(model, prompt_format, **engine_args))
        return made[-1]

    yield make
    for engine in made:
        await engine.stop()


def ask(question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": question}]


async def streamed(engine: TransformersEngine, messages: Any, params: SamplingParams) -> GenerationResult:
    deltas = [d async for d in engine.chat_stream(messages, params)]
    last = deltas[-1]
    assert all(d.finish_reason is None for d in deltas[:-1])
    return GenerationResult(
        text="".join(d.text for d in deltas),
        finish_reason=last.finish_reason or "",
        prompt_tokens=last.prompt_tokens or 0,
        completion_tokens=last.completion_tokens or 0,
    )


def outcome(result: GenerationResult) -> tuple[str, str, int, int]:
    return result.text, result.finish_reason, result.prompt_tokens, result.completion_tokens


@pytest.mark.parametrize("prompt_format", ["chat", "completion"])
async def test_concurrent_requests_each_get_their_answer_alone(engines: Any, prompt_format: str) -> None:
    """Greedy chats and streams of different lengths and budgets, one cut by a stop string and one
    sampled with a seed, sent together, each equal to the same request sent alone. In the completion
    format the answer rule also ends answers (the engine cancels its row, as for a stop string)."""
    engine = engines(prompt_format)
    requests: list[tuple[Any, SamplingParams, bool]] = [
        (ask("What is a vector?"), SamplingParams(max_tokens=16), False),
        (ask("Name three colours of the rainbow, please."), SamplingParams(max_tokens=24), True),
        (ask("Why?"), SamplingParams(max_tokens=8, temperature=0.8, top_p=0.9, seed=7), True),
        (ask("Where is the pump on line three, and who serviced it in May?"), SamplingParams(max_tokens=30), False),
    ]
    # a stop string that cuts the fourth answer (chosen from its uncut text)
    uncut = await engine.chat(requests[3][0], requests[3][1])
    assert len(uncut.text) >= 6, "the tiny model's answer is too short to cut"
    stop = uncut.text[4:6]
    requests[3] = (requests[3][0], SamplingParams(max_tokens=30, stop=[stop]), False)

    def send(messages: Any, params: SamplingParams, stream: bool) -> Awaitable[GenerationResult]:
        return streamed(engine, messages, params) if stream else engine.chat(messages, params)

    alone = [outcome(await send(*r)) for r in requests]
    assert alone[3][1] == "stop" and len(alone[3][0]) < len(uncut.text.strip())
    assert engine._batcher is not None
    engine._batcher.peak = 0
    together = [outcome(r) for r in await asyncio.gather(*(send(*r) for r in requests))]
    assert together == alone
    assert engine._batcher.peak >= 2  # they shared decode steps


async def test_a_stream_closed_early_leaves_the_batch_without_disturbing_the_others(engines: Any) -> None:
    engine = engines(max_batch=2)
    engine._eos_ids = frozenset()  # the tiny model may write its <eos> anywhere: here nothing ends early
    other = ask("And the other one?")
    alone = outcome(await engine.chat(other, SamplingParams(max_tokens=20)))
    assert engine._batcher is not None
    steps = engine._batcher.steps
    stream = engine.chat_stream(ask("Tell me everything."), SamplingParams(max_tokens=5000))
    first = await anext(stream)
    assert first.finish_reason is None
    beside = asyncio.ensure_future(engine.chat(other, SamplingParams(max_tokens=20)))
    await asyncio.sleep(0)
    await stream.aclose()  # the client left
    assert outcome(await asyncio.wait_for(beside, WAIT_S)) == alone
    assert engine._batcher.steps - steps < 5000  # the abandoned request did not run on to its budget


async def test_a_failed_step_is_a_500_for_its_requests_and_the_next_is_served(model: Any) -> None:
    breakable = Breakable(model)
    engine = TransformersEngine("tiny", "/nonexistent", engine_args={"prefill_chunk": 8}, prompt_format="chat")
    engine._install(CharTokenizer(), breakable)
    engine._eos_ids = frozenset()
    try:
        question = ask("What broke?")
        alone = outcome(await engine.chat(question, SamplingParams(max_tokens=12)))
        both = [
            asyncio.ensure_future(engine.chat(ask(f"Question {n}?"), SamplingParams(max_tokens=2000))) for n in range(2)
        ]
        while engine._batcher is not None and engine._batcher.peak < 2:  # both are decoding together
            await asyncio.sleep(0.01)
        breakable.fail = lambda input_ids: input_ids.shape[0] == 2
        for task in both:
            with pytest.raises(EngineError) as err:
                await asyncio.wait_for(task, WAIT_S)
            assert err.value.status == 500 and "RuntimeError: the step broke" in err.value.message
        assert outcome(await engine.chat(question, SamplingParams(max_tokens=12))) == alone
    finally:
        await engine.stop()


async def test_stop_ends_waiting_and_running_requests_with_a_503(model: Any) -> None:
    engine = installed(model, max_batch=1)
    engine._eos_ids = frozenset()
    running = engine.chat_stream(ask("Go on."), SamplingParams(max_tokens=5000))
    await anext(running)
    waiting = asyncio.ensure_future(engine.chat(ask("And me?"), SamplingParams(max_tokens=5)))
    await asyncio.sleep(0.05)
    await engine.stop()
    with pytest.raises(EngineError) as err:
        await asyncio.wait_for(waiting, WAIT_S)
    assert err.value.status == 503
    with pytest.raises(EngineError) as err:
        await asyncio.wait_for(_drain(running), WAIT_S)
    assert err.value.status == 503
    with pytest.raises(EngineError) as err:  # and a request after stop is refused, not queued
        await engine.chat(ask("Anyone?"), SamplingParams(max_tokens=5))
    assert err.value.status == 503


async def _drain(stream: AsyncIterator[GenerationDelta]) -> None:
    async for _ in stream:
        pass


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"max_batch": 0}, "max_batch must be a whole number of at least 1, not 0"),
        ({"max_batch": "8"}, "max_batch must be a whole number"),
        ({"max_batch": True}, "max_batch must be a whole number"),
        ({"prefill_chunk": 2.5}, "prefill_chunk must be a whole number"),
        ({"batch": 4}, "unknown engine_args"),
    ],
)
def test_engine_args_are_checked(args: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TransformersEngine("tiny", "/nonexistent", engine_args=args)


def test_the_batch_bound_is_an_engine_arg(model: Any) -> None:
    assert TransformersEngine("tiny", "/nonexistent").max_batch == DEFAULT_MAX_BATCH
    engine = installed(model, max_batch=3)
    assert engine._batcher is not None and engine._batcher.max_batch == 3
    asyncio.run(engine.stop())


class TestTinyEngineContract(EngineContract):
    """The engine contract, served by the batch loop on the tiny model: a stream closed early leaves
    the batch (nothing is being served once it has)."""

    @pytest.fixture
    async def engine(self, engines: Any) -> TransformersEngine:
        engine = engines()
        engine._eos_ids = frozenset()
        return engine

    @pytest.fixture
    def generation_stopped(self, engine: TransformersEngine) -> Callable[[], Awaitable[bool]]:
        async def stopped() -> bool:
            for _ in range(WAIT_S * 100):
                if engine._batcher is not None and engine._batcher.running == 0:
                    return True
                await asyncio.sleep(0.01)
            return False

        return stopped
