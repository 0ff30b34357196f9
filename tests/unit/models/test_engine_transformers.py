"""The embedded transformers engine with the REAL packaged Gemma 3 270M (slow: it loads a model).

The conversion cache lives in ``<repo>/data/test-cache/models`` (git-ignored, shared with the
integration tests), so the GGUF is converted once per machine. Assertions are on plumbing (token
counts, finish reasons, streaming, cancellation), never on the wording of the small model's answers.
"""

from __future__ import annotations

import asyncio
import itertools
import pickle
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from ragserve.api.generation import GenerationDelta
from ragserve.api.sampling import SamplingParams
from ragserve.errors import BadRequestError
from ragserve.models.transformers_engine import TransformersEngine
from ragserve.testing.contracts.engine import EngineContract

pytestmark = pytest.mark.slow

MODEL_CACHE = Path(__file__).resolve().parents[3] / "data" / "test-cache" / "models"
MESSAGES = [
    {"role": "system", "content": "Answer in one short sentence."},
    {"role": "user", "content": "What does a vector database store?"},
]


@pytest.fixture(scope="module")
def engine() -> Iterator[TransformersEngine]:
    e = TransformersEngine(None, MODEL_CACHE)
    asyncio.run(e.start())
    yield e
    asyncio.run(e.stop())


def test_start_converts_once_and_caches_the_converted_model(engine: TransformersEngine) -> None:
    assert engine.load_info["source"] in {"converted", "cache"}
    cached = engine.converted_dir
    assert cached is not None and (cached / "config.json").exists()
    assert any(cached.glob("*.safetensors")) and (cached / "tokenizer.json").exists()
    leftovers = [p.name for p in cached.parent.iterdir() if p.name.startswith(".tmp-")]
    assert leftovers == []  # the cache was written to a temporary directory and renamed into place
    assert engine.context_window() == 32768
    assert engine.token_counter().exact
    rate = engine.prefill_tokens_per_s()  # measured at start: sizes a chat's context (docs/architecture.md §5)
    assert rate is not None and rate > 0 and engine.load_info["prefill_tokens_per_s"] == rate


def test_a_second_instance_starts_from_the_cache_fast(engine: TransformersEngine) -> None:
    second = TransformersEngine(None, MODEL_CACHE)
    t0 = time.perf_counter()
    asyncio.run(second.start())
    elapsed = time.perf_counter() - t0
    try:
        assert second.load_info["source"] == "cache"
        assert elapsed < 60, f"a cached start took {elapsed:.1f}s"
    finally:
        asyncio.run(second.stop())


async def test_chat_reports_real_usage(engine: TransformersEngine) -> None:
    result = await engine.chat(MESSAGES, SamplingParams(max_tokens=8))
    assert isinstance(result.text, str)
    assert result.finish_reason in {"length", "stop"}
    assert 0 < result.completion_tokens <= 8
    assert result.prompt_tokens == engine.token_counter().count_messages(MESSAGES)
    if result.finish_reason == "length":
        assert result.completion_tokens == 8


async def test_stream_is_the_same_greedy_answer_in_pieces(engine: TransformersEngine) -> None:
    params = SamplingParams(max_tokens=8, temperature=0)
    whole = await engine.chat(MESSAGES, params)
    deltas: list[GenerationDelta] = [d async for d in engine.chat_stream(MESSAGES, params)]
    assert len(deltas) >= 3
    assert all(d.finish_reason is None and d.prompt_tokens is None for d in deltas[:-1])
    assert "".join(d.text for d in deltas) == whole.text
    last = deltas[-1]
    assert (last.finish_reason, last.prompt_tokens, last.completion_tokens) == (
        whole.finish_reason,
        whole.prompt_tokens,
        whole.completion_tokens,
    )


async def test_seeded_sampling_is_reproducible(engine: TransformersEngine) -> None:
    params = SamplingParams(max_tokens=6, temperature=0.9, top_p=0.95, seed=1234)
    first = await engine.chat(MESSAGES, params)
    second = await engine.chat(MESSAGES, params)
    assert first.text == second.text


async def test_stop_string_cuts_the_answer_there(engine: TransformersEngine) -> None:
    base = await engine.chat(MESSAGES, SamplingParams(max_tokens=12))
    words = [w for w in base.text.split() if len(w) >= 2]
    if not words:
        pytest.skip("the model answered with no word to stop on")
    stop = words[min(1, len(words) - 1)][:2]
    cut = await engine.chat(MESSAGES, SamplingParams(max_tokens=12, stop=[stop]))
    assert cut.text == base.text[: base.text.index(stop)].rstrip()  # completion-format answers are trimmed
    assert cut.finish_reason == "stop" and cut.completion_tokens <= base.completion_tokens


async def test_concurrent_greedy_chats_are_their_answers_one_at_a_time(engine: TransformersEngine) -> None:
    """Three different questions sent together share decode steps (continuous batching) and each
    gets exactly the answer, finish reason and usage it gets alone."""
    questions = ["What does a vector database store?", "Who wrote Hamlet?", "What is the capital of France?"]
    chats = [[{"role": "user", "content": q}] for q in questions]
    params = SamplingParams(max_tokens=10, temperature=0)
    alone = [await engine.chat(chat, params) for chat in chats]
    assert engine._batcher is not None
    engine._batcher.peak = 0
    together = await asyncio.gather(*(engine.chat(chat, params) for chat in chats))
    assert [(r.text, r.finish_reason, r.prompt_tokens, r.completion_tokens) for r in together] == [
        (r.text, r.finish_reason, r.prompt_tokens, r.completion_tokens) for r in alone
    ]
    assert engine._batcher.peak >= 2  # they were decoded in the same steps


async def test_passthrough_serves_text_and_rejects_tools(engine: TransformersEngine) -> None:
    body = {"messages": MESSAGES, "max_tokens": 4}
    response = await engine.passthrough(body, 16)
    assert response.model == engine.model_id
    assert response.usage is not None
    assert response.usage.prompt_tokens == engine.token_counter().count_messages(MESSAGES)
    chunks = [c async for c in engine.passthrough_stream({**body, "stream": True}, 16)]
    assert chunks[-1].choices[0].finish_reason in {"length", "stop"}
    with pytest.raises(BadRequestError) as err:
        await engine.passthrough({**body, "tools": [{"type": "function", "function": {"name": "get_weather"}}]}, 16)
    assert err.value.status == 400 and "not supported by the embedded transformers engine" in err.value.message


async def test_openai_engine_counts_with_a_local_tokenizer_when_it_has_one(engine: TransformersEngine) -> None:
    """A remote model whose tokenizer is on this machine is counted with it, not estimated."""
    from ragserve.models.openai_engine import OpenAIEngine
    from ragserve.testing.fake_openai import FakeOpenAI

    local = str(engine.converted_dir)
    with FakeOpenAI(model=local, max_model_len=2048) as fake:
        remote = OpenAIEngine(fake.url, None, None, 5.0)
        await remote.start()
        counter = remote.token_counter()
        await remote.stop()
    assert counter.name.startswith("hf:")
    assert counter.count_text("hello world") == engine.token_counter().count_text("hello world")
    assert counter.exact is False  # right tokens, but without a chat template the layout is a guess


def test_token_counter_survives_pickling(engine: TransformersEngine) -> None:
    """The generator ships its counter to the ingress (Ray pickles it)."""
    counter = engine.token_counter()
    clone = pickle.loads(pickle.dumps(counter))
    assert clone.count_messages(MESSAGES) == counter.count_messages(MESSAGES)
    assert clone.render(MESSAGES).startswith("<bos>Answer in one short sentence.\n\nUser: ")


def test_the_packaged_base_model_is_prompted_as_plain_text(engine: TransformersEngine) -> None:
    """It has no chat template (a base model): the completion format, with <bos> and no turn markers."""
    assert engine.prompt_format == "completion"
    prompt = engine.token_counter().render(MESSAGES)
    assert prompt == "<bos>Answer in one short sentence.\n\nUser: What does a vector database store?\nAssistant:"
    assert engine.token_counter().count_messages(MESSAGES) == len(
        engine._tokenizer(prompt, add_special_tokens=False).input_ids
    )


async def test_chat_format_can_be_forced_and_renders_gemma_turns() -> None:
    forced = TransformersEngine(None, MODEL_CACHE, prompt_format="chat")
    await forced.start()
    try:
        assert forced.prompt_format == "chat"
        assert forced.token_counter().render(MESSAGES).startswith("<bos><start_of_turn>user\n")
    finally:
        await forced.stop()


class TestTransformersEngineContract(EngineContract):
    """The embedded engine with the real packaged model: a stream closed early leaves the batch at
    the next step, so the next request is served at once rather than beside the abandoned one's 200
    tokens."""

    @pytest.fixture
    def generation_stopped(self, engine: TransformersEngine) -> Callable[[], Awaitable[bool]]:
        async def stopped() -> bool:
            t0 = time.perf_counter()
            result = await engine.chat(MESSAGES, SamplingParams(max_tokens=2))
            return result.completion_tokens <= 2 and time.perf_counter() - t0 < 10

        return stopped


def test_the_answer_text_decoded_token_by_token_is_the_whole_decode_at_every_token(engine: TransformersEngine) -> None:
    """The engine decodes each new token beside the one before (``IncrementalDecoder``), not every
    token so far: with Gemma's own tokenizer the text after each token is what decoding them all
    gives, for prose, code, runs of spaces and newlines, emoji, CJK and runs of characters written
    in byte tokens, with skipped special tokens between (while a character is incomplete, Gemma's
    decode shows its whole run of byte tokens as U+FFFD: those steps are not compared)."""
    from ragserve.models.detokenize import IncrementalDecoder

    tokenizer = engine._tokenizer
    texts = [
        "The pump is serviced every 30 minutes, isn't it? Yes.",
        "def f(x):\n    return {'a': [1, 2]}  # done\n\n\n",
        "   leading   spaces and\ttabs\t\tend   ",
        "Emoji 😀🚀 and 中文字符 and ﬁ ligature, Ελληνικά, עברית.",
        "<start_of_turn>model\nNot special here<end_of_turn>",
        "ꙮꙮꙮ ok 🫨🫨🫨🫨 𓀀𓀁𓀂 runs of characters written in byte tokens",
    ]
    pad, end_of_turn = tokenizer.pad_token_id, tokenizer.convert_tokens_to_ids("<end_of_turn>")
    assert {pad, end_of_turn} <= engine._silent  # skipped wherever they are: kept out of the window
    for text, between in itertools.product(texts, (3, 14, 40)):
        ids = list(tokenizer(text, add_special_tokens=False).input_ids)
        ids = ids[:3] + [pad, end_of_turn] * between + ids[3:]  # skipped special tokens between
        decoder = IncrementalDecoder(lambda t: tokenizer.decode(t, skip_special_tokens=True), engine._silent)
        for i, token in enumerate(ids):
            got, whole = decoder.add(token), tokenizer.decode(ids[: i + 1], skip_special_tokens=True)
            if "\ufffd" not in whole:  # a character split in byte tokens shows as U+FFFD until complete
                assert got == whole, (text, i)
        assert decoder.text == tokenizer.decode(ids, skip_special_tokens=True)
