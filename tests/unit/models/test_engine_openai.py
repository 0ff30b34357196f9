"""The OpenAI engine against a real HTTP fake upstream: bodies sent, streams relayed, errors mapped."""

from __future__ import annotations

import asyncio
import pickle
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest

from ragserve.api.generation import GenerationDelta
from ragserve.api.sampling import SamplingParams
from ragserve.errors import EngineError
from ragserve.models.openai_engine import OpenAIEngine, normalise_base_url
from ragserve.serve_port import free_port
from ragserve.testing.contracts.engine import EngineContract
from ragserve.testing.fake_openai import FakeOpenAI, split_answer

ANSWER = "Retrieval grounds the answer in the sources [1]."
MESSAGES = [{"role": "system", "content": "Use the context."}, {"role": "user", "content": "What is RAG?"}]


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(answer=ANSWER, model="fake-model", max_model_len=4096) as f:
        yield f


@pytest.fixture(autouse=True)
def _clean(fake: FakeOpenAI) -> Iterator[None]:
    fake.reset()
    fake.chunk_delay_s = 0.0
    yield
    fake.chunk_delay_s = 0.0


@pytest.fixture
async def engine(fake: FakeOpenAI) -> AsyncIterator[OpenAIEngine]:
    e = OpenAIEngine(fake.url, None, None, timeout_s=5.0)
    await e.start()
    yield e
    await e.stop()


async def collect(stream: AsyncIterator[Any]) -> list[Any]:
    return [item async for item in stream]


@pytest.mark.parametrize(
    "url",
    ["http://h:8000", "http://h:8000/", "http://h:8000/v1", "http://h:8000/v1/", "http://h:8000/v1/chat/completions"],
)
def test_base_url_is_normalised(url: str) -> None:
    assert normalise_base_url(url) == "http://h:8000/v1"


async def test_start_takes_model_and_window_from_the_model_list(engine: OpenAIEngine, fake: FakeOpenAI) -> None:
    assert engine.model_id == "fake-model"
    assert engine.context_window() == 4096
    assert fake.models_requests == 1


async def test_configured_model_and_window(fake: FakeOpenAI) -> None:
    e = OpenAIEngine(fake.url + "/v1", "my-model", None, 5.0, context_window=1024)
    await e.start()
    assert (e.model_id, e.context_window()) == ("my-model", 1024)
    await e.stop()
    capped = OpenAIEngine(fake.url, None, None, 5.0, context_window=100_000)
    await capped.start()
    assert capped.context_window() == 4096  # never more than the server's max_model_len
    await capped.stop()


async def test_a_model_the_upstream_does_not_list_gets_no_window_from_it(fake: FakeOpenAI) -> None:
    e = OpenAIEngine(fake.url, "other-model", None, 5.0)
    await e.start()
    assert (e.model_id, e.context_window()) == ("other-model", None)
    await e.stop()


async def test_token_counter_for_a_non_openai_model_is_not_exact(engine: OpenAIEngine) -> None:
    counter = engine.token_counter()
    assert counter.exact is False  # an estimate: the budget keeps its safety margin
    assert counter.count_messages(MESSAGES) > counter.count_text("What is RAG?") > 0
    clone = pickle.loads(pickle.dumps(counter))  # the generator ships it to the ingress
    assert (clone.exact, clone.count_messages(MESSAGES)) == (False, counter.count_messages(MESSAGES))


async def test_chat_sends_sampling_parameters_and_returns_usage(engine: OpenAIEngine, fake: FakeOpenAI) -> None:
    result = await engine.chat(
        MESSAGES, SamplingParams(max_tokens=32, temperature=0.2, top_p=0.9, stop=["\n\n"], seed=7)
    )
    assert result.text == ANSWER and result.finish_reason == "stop"
    assert result.completion_tokens == len(split_answer(ANSWER)) and result.prompt_tokens > 0
    assert fake.requests[-1] == {
        "model": "fake-model",
        "messages": MESSAGES,
        "max_tokens": 32,
        "stream": False,
        "temperature": 0.2,
        "top_p": 0.9,
        "stop": ["\n\n"],
        "seed": 7,
    }


async def test_chat_length_finish_and_unset_parameters_are_not_sent(engine: OpenAIEngine, fake: FakeOpenAI) -> None:
    result = await engine.chat(MESSAGES, SamplingParams(max_tokens=2))
    assert result.finish_reason == "length" and result.completion_tokens == 2
    assert set(fake.requests[-1]) == {"model", "messages", "max_tokens", "stream"}


async def test_chat_stream_yields_deltas_in_order_then_finish_and_usage(engine: OpenAIEngine, fake: FakeOpenAI) -> None:
    deltas: list[GenerationDelta] = await collect(engine.chat_stream(MESSAGES, SamplingParams(max_tokens=64)))
    assert [d.text for d in deltas[:-1]] == split_answer(ANSWER)
    last = deltas[-1]
    assert (last.text, last.finish_reason) == ("", "stop")
    assert last.completion_tokens == len(split_answer(ANSWER)) and last.prompt_tokens
    assert all(d.finish_reason is None for d in deltas[:-1])
    sent = fake.requests[-1]
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}


async def test_chat_stream_relays_chunks_as_they_arrive(engine: OpenAIEngine, fake: FakeOpenAI) -> None:
    fake.chunk_delay_s = 0.05
    t0 = time.perf_counter()
    arrivals = [time.perf_counter() - t0 async for _ in engine.chat_stream(MESSAGES, SamplingParams(max_tokens=64))]
    assert arrivals[0] < arrivals[-1] - 0.15  # the first piece came long before the last one


async def test_passthrough_forwards_the_body_unchanged_but_for_the_model(
    engine: OpenAIEngine, fake: FakeOpenAI
) -> None:
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 16,
        "logit_bias": {"1": 2},
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
        "user": "u-1",
    }
    response = await engine.passthrough(dict(body), 16)
    assert fake.requests[-1] == {**body, "model": "fake-model"}
    assert response.choices[0].message.content == ANSWER
    assert response.object == "chat.completion" and response.usage is not None and response.usage.completion_tokens > 0
    await engine.passthrough({**body, "model": "client-model"}, 16)
    assert fake.requests[-1]["model"] == "client-model"


async def test_passthrough_stream_relays_upstream_chunks(engine: OpenAIEngine, fake: FakeOpenAI) -> None:
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 16,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    chunks = [c.model_dump(exclude_unset=True) for c in await collect(engine.passthrough_stream(body, 16))]
    assert fake.requests[-1] == {**body, "model": "fake-model"}
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == ANSWER
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == len(split_answer(ANSWER))


async def test_upstream_http_error_keeps_status_and_message(engine: OpenAIEngine, fake: FakeOpenAI) -> None:
    fake.fail_next(status=500, message="upstream exploded")
    with pytest.raises(EngineError) as err:
        await engine.chat(MESSAGES, SamplingParams(max_tokens=8))
    assert (err.value.status, err.value.message) == (500, "upstream exploded")
    fake.fail_next(status=503, message="model is loading")
    with pytest.raises(EngineError) as err:
        await collect(engine.chat_stream(MESSAGES, SamplingParams(max_tokens=8)))
    assert (err.value.status, err.value.message) == (503, "model is loading")
    fake.fail_next(status=429, message="slow down")
    with pytest.raises(EngineError) as err:
        await collect(engine.passthrough_stream({"messages": MESSAGES, "max_tokens": 8, "stream": True}, 16))
    assert (err.value.status, err.value.message) == (429, "slow down")
    assert (await engine.chat(MESSAGES, SamplingParams(max_tokens=8))).text == ANSWER  # and it recovers


async def test_timeout_is_504(fake: FakeOpenAI) -> None:
    e = OpenAIEngine(fake.url, "fake-model", None, timeout_s=0.3)
    fake.delay_next(1.5)
    t0 = time.perf_counter()
    with pytest.raises(EngineError) as err:
        await e.chat(MESSAGES, SamplingParams(max_tokens=8))
    assert err.value.status == 504 and "timed out" in err.value.message
    assert time.perf_counter() - t0 < 1.4
    await e.stop()


async def test_refused_connection_is_502_and_start_tolerates_it() -> None:
    e = OpenAIEngine(f"http://127.0.0.1:{free_port()}/v1", None, None, timeout_s=2.0)
    await e.start()  # logged, not raised: the upstream may come up later
    assert e.context_window() is None
    with pytest.raises(EngineError) as err:
        await e.chat(MESSAGES, SamplingParams(max_tokens=8))
    assert err.value.status == 502 and "cannot connect" in err.value.message
    with pytest.raises(EngineError) as err:
        await collect(e.chat_stream(MESSAGES, SamplingParams(max_tokens=8)))
    assert err.value.status == 502
    await e.stop()


async def test_stream_cut_mid_way_raises_502_from_the_iterator(engine: OpenAIEngine, fake: FakeOpenAI) -> None:
    fake.cut_stream_next(after_chunks=2)
    received: list[str] = []
    with pytest.raises(EngineError) as err:
        async for delta in engine.chat_stream(MESSAGES, SamplingParams(max_tokens=64)):
            received.append(delta.text)
    assert err.value.status == 502
    assert received == split_answer(ANSWER)[:2]  # what came before the cut was delivered
    fake.cut_stream_next(after_chunks=1)
    chunks: list[dict[str, Any]] = []
    with pytest.raises(EngineError) as err:
        async for chunk in engine.passthrough_stream({"messages": MESSAGES, "max_tokens": 8, "stream": True}, 16):
            chunks.append(chunk)
    assert err.value.status == 502 and len(chunks) == 2


async def test_malformed_stream_event_is_502(engine: OpenAIEngine, fake: FakeOpenAI) -> None:
    fake.garble_stream_next(after_chunks=1)
    with pytest.raises(EngineError) as err:
        await collect(engine.chat_stream(MESSAGES, SamplingParams(max_tokens=64)))
    assert err.value.status == 502 and "malformed" in err.value.message


async def test_in_band_stream_error_keeps_its_status(engine: OpenAIEngine, fake: FakeOpenAI) -> None:
    fake.error_event_next(after_chunks=1, status=500, message="CUDA out of memory")
    received: list[str] = []
    with pytest.raises(EngineError) as err:
        async for delta in engine.chat_stream(MESSAGES, SamplingParams(max_tokens=64)):
            received.append(delta.text)
    assert (err.value.status, err.value.message) == (500, "CUDA out of memory")
    assert received == split_answer(ANSWER)[:1]


async def test_consumer_leaving_early_leaves_the_engine_usable(engine: OpenAIEngine, fake: FakeOpenAI) -> None:
    fake.chunk_delay_s = 0.05
    stream = engine.chat_stream(MESSAGES, SamplingParams(max_tokens=64))
    first = await anext(stream)
    await stream.aclose()
    assert first.text == split_answer(ANSWER)[0]
    fake.chunk_delay_s = 0.0
    assert (await engine.chat(MESSAGES, SamplingParams(max_tokens=64))).text == ANSWER


async def test_api_key_is_sent_as_bearer_token() -> None:
    with FakeOpenAI(answer="ok", api_key="sekret") as f:
        good = OpenAIEngine(f.url, None, "sekret", 5.0)
        await good.start()
        assert (await good.chat(MESSAGES, SamplingParams(max_tokens=4))).text == "ok"
        assert f.request_headers[-1]["authorization"] == "Bearer sekret"
        bad = OpenAIEngine(f.url, "fake-model", "wrong", 5.0)
        with pytest.raises(EngineError) as err:
            await bad.chat(MESSAGES, SamplingParams(max_tokens=4))
        assert err.value.status == 401 and err.value.message == "Invalid API key"
        await good.stop()
        await bad.stop()


async def test_concurrent_requests_share_the_pool(engine: OpenAIEngine, fake: FakeOpenAI) -> None:
    results = await asyncio.gather(*(engine.chat(MESSAGES, SamplingParams(max_tokens=64)) for _ in range(16)))
    assert {r.text for r in results} == {ANSWER} and len(fake.requests) == 16


async def test_small_requests_are_not_delayed_by_nagle(engine: OpenAIEngine) -> None:
    """Nagle's algorithm plus delayed ACKs would add about 40 ms to each round trip."""
    await engine.chat(MESSAGES, SamplingParams(max_tokens=4))  # warm connection
    latencies = []
    for _ in range(20):
        t0 = time.perf_counter()
        await engine.chat(MESSAGES, SamplingParams(max_tokens=4))
        latencies.append(time.perf_counter() - t0)
    assert statistics.median(latencies) < 0.03


class TestOpenAIEngineContract(EngineContract):
    """The remote engine against the fake upstream: it forwards tools (the upstream decides), and a
    stream closed early drops the connection, which the upstream sees as an abandoned stream."""

    @pytest.fixture
    def generation_stopped(self, fake: FakeOpenAI) -> Callable[[], Awaitable[bool]]:
        fake.chunk_delay_s = 0.05  # the stream is still going when the consumer leaves

        async def stopped() -> bool:
            for _ in range(100):
                if fake.abandoned_streams:
                    return fake.abandoned_streams == 1
                await asyncio.sleep(0.02)
            return False

        return stopped


@pytest.mark.parametrize(
    ("chunks", "lines"),
    [
        ([b"data: a\n\n", b"data: b\r\n\r\n"], ["data: a", "", "data: b", ""]),
        ([b"data: a\r", b"\ndata: b\r", b"\r"], ["data: a", "data: b", ""]),  # \r\n split across chunks
        ([b"da", b"ta: \xe2\x80", b"\xa8x\n"], ["data: \u2028x"]),  # UTF-8 split; U+2028 is no line break
        ([b"data: x"], ["data: x"]),  # no final line break
        ([], []),
        ([b"a\rb\nc\r\nd"], ["a", "b", "c", "d"]),
        ([b"data: " + b"y" * 300_000 + b"\n"], ["data: " + "y" * 300_000]),  # no line-length limit
    ],
)
def test_sse_lines_split_as_the_spec_says(chunks: list[bytes], lines: list[str]) -> None:
    from ragserve.models.openai_engine import _lines

    async def read() -> list[str]:
        async def stream():
            for c in chunks:
                yield c

        return [line async for line in _lines(stream())]

    assert asyncio.run(read()) == lines


@pytest.mark.parametrize(
    ("env", "url", "proxy"),
    [
        ({}, "http://llm:8000/v1", None),
        ({"HTTP_PROXY": "http://proxy:3128"}, "http://llm:8000/v1", "http://proxy:3128"),
        ({"https_proxy": "http://proxy:3128"}, "https://api.example.com/v1", "http://proxy:3128"),
        ({"HTTP_PROXY": "http://proxy:3128"}, "https://api.example.com/v1", None),  # no proxy for https
        ({"HTTP_PROXY": "http://proxy:3128", "NO_PROXY": "127.0.0.1,.svc"}, "http://llm.ns.svc:80/v1", None),
        ({"HTTP_PROXY": "http://proxy:3128", "NO_PROXY": "127.0.0.1,.svc"}, "http://127.0.0.1:8000/v1", None),
    ],
)
def test_the_environment_proxy_is_honoured_as_httpx_did(monkeypatch, env, url, proxy) -> None:
    """The engine reads HTTP(S)_PROXY and NO_PROXY once, when its session is made."""
    from ragserve.models.openai_engine import env_proxy

    for var in ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert env_proxy(url) == proxy

    async def session_proxy() -> str | None:
        engine = OpenAIEngine(url, "m", None, 5.0)
        try:
            return engine._http()._default_proxy and str(engine._http()._default_proxy)
        finally:
            await engine.stop()

    assert asyncio.run(session_proxy()) == proxy


async def test_a_lone_surrogate_from_the_upstream_becomes_a_replacement_character(
    engine: OpenAIEngine, fake: FakeOpenAI
) -> None:
    """A broken upstream escapes a lone surrogate into its JSON (``\\ud800``): the text is kept with
    U+FFFD in its place, so it can be written out as UTF-8 (it failed every response that carried
    it); a real pair (an emoji sent as two escapes) stays the character it is."""
    fake.answer = "Half \ud800 a pair, and a whole one \U0001f600."
    try:
        result = await engine.chat(MESSAGES, SamplingParams(max_tokens=64))
        streamed = await collect(engine.chat_stream(MESSAGES, SamplingParams(max_tokens=64)))
    finally:
        fake.answer = ANSWER
    text = "".join(d.text for d in streamed if isinstance(d, GenerationDelta))
    for got in (result.text, text):
        assert got == "Half \ufffd a pair, and a whole one \U0001f600.", got
        got.encode("utf-8")


def test_upstream_json_replaces_lone_surrogates_everywhere() -> None:
    from ragserve.models.openai_engine import upstream_json

    raw = '{"a\\udc00": ["x\\ud800", {"b": "\\ud83d\\ude00", "c": 1}], "d": "plain"}'
    assert upstream_json(raw) == {"a\ufffd": ["x\ufffd", {"b": "\U0001f600", "c": 1}], "d": "plain"}
    assert upstream_json('"\\uDFFF"') == "\ufffd"


@pytest.mark.parametrize(
    "body, kind",
    [
        ('{"error": {"message": "busy", "type": 503}}', "503"),
        ('{"error": {"message": "busy", "type": ["a"]}}', "['a']"),
        ('{"error": {"message": "busy", "type": ""}}', None),
        ('{"error": {"message": "busy", "type": "overloaded"}}', "overloaded"),
        ('{"error": {"message": "busy"}}', None),
    ],
)
def test_an_upstream_errors_type_is_a_str_whatever_it_sent(body: str, kind: str | None) -> None:
    """The type goes to the client's error object and to a metric tag: a number there turned a 503
    into a 500 once (the tag refused inside the error handler)."""
    from ragserve.models.openai_engine import _error_message

    message, type_, _ = _error_message(503, "Service Unavailable", body)
    assert message == "busy" and type_ == kind


@pytest.mark.parametrize(
    "value, count",
    [
        (12, 12),
        (12.0, 12),
        (0, 0),
        (-3, None),
        (1.5, None),
        (float("nan"), None),
        (float("inf"), None),
        (True, None),
        ("12", None),
        (None, None),
        ([1], None),
        (2**70, 2**70),
    ],
)
def test_an_upstream_usage_count_is_taken_only_as_a_whole_number_not_below_zero(value: Any, count: int | None) -> None:
    """Anything else is counted here instead (``None``): a negative count dropped a usage record, a
    string count was a 500."""
    from ragserve.models.openai_engine import _token_count

    assert _token_count(value) == count
