"""The vLLM adapter against a fake ``vllm`` module installed at vLLM's API boundary.

The fake reproduces what the adapter relies on: ``AsyncEngineArgs``, ``AsyncLLMEngine.from_engine_args``,
``SamplingParams`` (validating like vLLM), and ``generate`` streaming ``RequestOutput`` objects whose
text and token ids are the new ones of each step (``output_kind=RequestOutputKind.DELTA``) or
cumulative (the default kind, and the only one before vLLM 0.6.1). Two API flavours are covered: the
current one (``model_config`` attribute, sync ``get_tokenizer``, ``vllm.sampling_params``'s output
kinds) and the older one (both coroutines, cumulative outputs only).
"""

from __future__ import annotations

import asyncio
import enum
import re
import sys
import types
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from ragserve.api.generation import GenerationDelta
from ragserve.api.sampling import SamplingParams
from ragserve.errors import ServiceError
from ragserve.models.gemma import render_gemma
from ragserve.models.vllm_engine import VLLMEngine
from ragserve.testing.contracts.engine import EngineContract

PIECES = ["Hel", "lo", " from", " vLLM", "."]
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello."}]


class FakeTokenizer:
    """Words and spaces are tokens; the chat template is a visible tag format."""

    name_or_path = "fake-tokenizer"

    def __init__(self, chat_template: str | None = "fake-template"):
        self.chat_template = chat_template

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = [len(t) for t in re.findall(r"\S+|\s+", text)]
        return ([1] if add_special_tokens else []) + ids

    def apply_chat_template(
        self, messages: list[dict[str, str]], tokenize: bool = False, add_generation_prompt: bool = False
    ) -> str:
        text = "".join(f"<{m['role']}>{m['content']}</{m['role']}>" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")


class FakeRequestOutputKind(enum.Enum):
    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


class FakeSamplingParams:
    def __init__(self, **kwargs: Any):
        if kwargs.get("temperature", 1.0) < 0:
            raise ValueError("temperature must be non-negative")
        self.kwargs = kwargs
        self.max_tokens = kwargs.get("max_tokens", 16)
        self.output_kind = kwargs.get("output_kind", FakeRequestOutputKind.CUMULATIVE)


@dataclass
class FakeCompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None


@dataclass
class FakeRequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[FakeCompletionOutput]
    finished: bool = False


@dataclass
class FakeAsyncEngineArgs:
    model: str
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __init__(self, model: str, **kwargs: Any):
        self.model = model
        self.kwargs = kwargs


class FakeModelConfig:
    def __init__(self, max_model_len: int, model_type: str):
        self.max_model_len = max_model_len
        self.hf_config = types.SimpleNamespace(model_type=model_type)

    def get_diff_sampling_param(self) -> dict[str, Any]:
        return {"temperature": 0.6, "top_p": 0.9}


class FakeEngine:
    """The current API: ``model_config`` attribute, sync ``get_tokenizer``, async ``abort``."""

    last: FakeEngine | None = None
    fail_with: BaseException | None = None
    output_kinds = True  # vllm.sampling_params.RequestOutputKind exists

    def __init__(self, args: FakeAsyncEngineArgs, tokenizer: FakeTokenizer, max_model_len: int, model_type: str):
        self.args = args
        self.tokenizer = tokenizer
        self.model_config = FakeModelConfig(max_model_len, model_type)
        self.calls: list[tuple[Any, FakeSamplingParams, str]] = []
        self.aborted: list[str] = []
        self.finished_requests: list[str] = []
        self.shut_down = False
        self.step_delay = 0.0

    def get_tokenizer(self) -> FakeTokenizer:
        return self.tokenizer

    async def generate(self, prompt: Any, sampling_params: FakeSamplingParams, request_id: str):
        self.calls.append((prompt, sampling_params, request_id))
        if FakeEngine.fail_with is not None:
            raise FakeEngine.fail_with
        n = min(len(PIECES), sampling_params.max_tokens)
        delta = sampling_params.output_kind == FakeRequestOutputKind.DELTA
        for i in range(n):
            await asyncio.sleep(self.step_delay)
            done = i == n - 1
            reason = ("length" if n < len(PIECES) else "stop") if done else None
            if delta:
                completion = FakeCompletionOutput(0, PIECES[i], [i], reason)
            else:
                completion = FakeCompletionOutput(0, "".join(PIECES[: i + 1]), list(range(i + 1)), reason)
            yield FakeRequestOutput(request_id, prompt["prompt_token_ids"], [completion], finished=done)
        self.finished_requests.append(request_id)

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    async def check_health(self) -> None:
        pass

    def shutdown(self) -> None:
        self.shut_down = True


class OldFakeEngine(FakeEngine):
    """The older API: coroutines ``get_tokenizer()`` and ``get_model_config()``, no ``model_config``,
    no ``vllm.sampling_params`` (cumulative outputs only)."""

    output_kinds = False

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._config = self.model_config
        del self.model_config

    async def get_tokenizer(self) -> FakeTokenizer:  # type: ignore[override]
        return self.tokenizer

    async def get_model_config(self) -> FakeModelConfig:
        return self._config


def install_fake_vllm(
    monkeypatch: pytest.MonkeyPatch,
    engine_cls: type[FakeEngine] = FakeEngine,
    tokenizer: FakeTokenizer | None = None,
    max_model_len: int = 8192,
    model_type: str = "llama",
) -> types.ModuleType:
    module = types.ModuleType("vllm")

    class AsyncLLMEngine:
        @classmethod
        def from_engine_args(cls, args: FakeAsyncEngineArgs) -> FakeEngine:
            FakeEngine.last = engine_cls(args, tokenizer or FakeTokenizer(), max_model_len, model_type)
            return FakeEngine.last

    module.AsyncEngineArgs = FakeAsyncEngineArgs  # type: ignore[attr-defined]
    module.AsyncLLMEngine = AsyncLLMEngine  # type: ignore[attr-defined]
    module.SamplingParams = FakeSamplingParams  # type: ignore[attr-defined]
    module.RequestOutput = FakeRequestOutput  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", module)
    if engine_cls.output_kinds:
        kinds = types.ModuleType("vllm.sampling_params")
        kinds.RequestOutputKind = FakeRequestOutputKind  # type: ignore[attr-defined]
        module.sampling_params = kinds  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, "vllm.sampling_params", kinds)
    else:
        monkeypatch.setitem(sys.modules, "vllm.sampling_params", None)
    return module


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    FakeEngine.last = None
    FakeEngine.fail_with = None
    yield
    FakeEngine.fail_with = None


async def started(monkeypatch: pytest.MonkeyPatch, **kwargs: Any) -> tuple[VLLMEngine, FakeEngine]:
    window = kwargs.pop("context_window", None)
    install_fake_vllm(monkeypatch, **kwargs)
    engine = VLLMEngine("org/model-7b", {"gpu_memory_utilization": 0.8, "max_model_len": 8192}, context_window=window)
    await engine.start()
    assert FakeEngine.last is not None
    return engine, FakeEngine.last


async def test_module_imports_without_vllm_and_start_needs_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)
    engine = VLLMEngine("org/model-7b", {})
    with pytest.raises(ImportError):
        await engine.start()
    with pytest.raises(ValueError, match="needs a model"):
        VLLMEngine("", {})


@pytest.mark.parametrize("engine_cls", [FakeEngine, OldFakeEngine], ids=["current-api", "older-api"])
async def test_start_builds_the_engine_and_reads_tokenizer_and_window(
    monkeypatch: pytest.MonkeyPatch, engine_cls: type[FakeEngine]
) -> None:
    engine, fake = await started(monkeypatch, engine_cls=engine_cls, max_model_len=4096)
    assert fake.args.model == "org/model-7b"
    assert fake.args.kwargs == {"gpu_memory_utilization": 0.8, "max_model_len": 8192}
    assert engine.context_window() == 4096
    counter = engine.token_counter()
    assert counter.exact and counter.count_messages(MESSAGES) == len(
        FakeTokenizer().encode(
            FakeTokenizer().apply_chat_template(MESSAGES, add_generation_prompt=True), add_special_tokens=False
        )
    )
    await engine.stop()
    assert fake.shut_down


async def test_configured_window_is_capped_by_max_model_len(monkeypatch: pytest.MonkeyPatch) -> None:
    engine, _ = await started(monkeypatch, max_model_len=4096, context_window=2048)
    assert engine.context_window() == 2048
    engine, _ = await started(monkeypatch, max_model_len=4096, context_window=100_000)
    assert engine.context_window() == 4096


@pytest.mark.parametrize("engine_cls", [FakeEngine, OldFakeEngine], ids=["delta-outputs", "cumulative-outputs"])
async def test_stream_yields_each_steps_new_text_and_usage(
    monkeypatch: pytest.MonkeyPatch, engine_cls: type[FakeEngine]
) -> None:
    """Asked for delta outputs where vLLM has them (each output's text is yielded as it is, its
    token ids summed), else the deltas of cumulative ones: the same stream and usage either way."""
    engine, fake = await started(monkeypatch, engine_cls=engine_cls)
    assert engine.delta_outputs is engine_cls.output_kinds
    deltas: list[GenerationDelta] = [d async for d in engine.chat_stream(MESSAGES, SamplingParams(max_tokens=64))]
    assert [d.text for d in deltas[:-1]] == PIECES
    last = deltas[-1]
    assert (last.text, last.finish_reason) == ("", "stop")
    assert last.prompt_tokens == engine.token_counter().count_messages(MESSAGES)
    assert last.completion_tokens == len(PIECES)
    prompt, _, request_id = fake.calls[-1]
    rendered = FakeTokenizer().apply_chat_template(MESSAGES, add_generation_prompt=True)
    assert prompt == {"prompt_token_ids": FakeTokenizer().encode(rendered, add_special_tokens=False)}
    assert fake.aborted == [] and fake.finished_requests == [request_id]
    kind = fake.calls[-1][1].output_kind
    assert kind == (FakeRequestOutputKind.DELTA if engine_cls.output_kinds else FakeRequestOutputKind.CUMULATIVE)


@pytest.mark.parametrize("engine_cls", [FakeEngine, OldFakeEngine], ids=["delta-outputs", "cumulative-outputs"])
async def test_chat_joins_the_text_and_reports_length_with_either_output_kind(
    monkeypatch: pytest.MonkeyPatch, engine_cls: type[FakeEngine]
) -> None:
    engine, _ = await started(monkeypatch, engine_cls=engine_cls)
    full = await engine.chat(MESSAGES, SamplingParams(max_tokens=64))
    assert (full.text, full.finish_reason, full.completion_tokens) == ("".join(PIECES), "stop", len(PIECES))
    cut = await engine.chat(MESSAGES, SamplingParams(max_tokens=2))
    assert (cut.text, cut.finish_reason, cut.completion_tokens) == ("Hello", "length", 2)


async def test_sampling_parameters_map_onto_the_model_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    engine, fake = await started(monkeypatch)
    await engine.chat(MESSAGES, SamplingParams(max_tokens=10))
    delta = FakeRequestOutputKind.DELTA
    assert fake.calls[-1][1].kwargs == {
        "temperature": 0.6,
        "top_p": 0.9,
        "n": 1,
        "max_tokens": 10,
        "output_kind": delta,
    }
    await engine.chat(MESSAGES, SamplingParams(max_tokens=5, temperature=0.0, top_p=0.5, stop=["\n", "END"], seed=42))
    assert fake.calls[-1][1].kwargs == {
        "temperature": 0.0,
        "top_p": 0.5,
        "n": 1,
        "max_tokens": 5,
        "stop": ["\n", "END"],
        "seed": 42,
        "output_kind": delta,
    }
    request_ids = {call[2] for call in fake.calls}
    assert len(request_ids) == 2  # every request has its own id


async def test_invalid_sampling_parameters_are_400(monkeypatch: pytest.MonkeyPatch) -> None:
    engine, _ = await started(monkeypatch)
    with pytest.raises(ServiceError) as err:
        await engine.chat(MESSAGES, SamplingParams(max_tokens=5, temperature=-1.0))
    assert err.value.status == 400


async def test_consumer_leaving_early_aborts_the_request(monkeypatch: pytest.MonkeyPatch) -> None:
    engine, fake = await started(monkeypatch)
    fake.step_delay = 0.01
    stream = engine.chat_stream(MESSAGES, SamplingParams(max_tokens=64))
    first = await anext(stream)
    await stream.aclose()
    assert first.text == PIECES[0]
    request_id = fake.calls[-1][2]
    assert fake.aborted == [request_id] and request_id not in fake.finished_requests


async def test_engine_failures_become_engine_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    engine, fake = await started(monkeypatch)
    FakeEngine.fail_with = ValueError("prompt too long for the KV cache")
    with pytest.raises(ServiceError) as err:
        await engine.chat(MESSAGES, SamplingParams(max_tokens=5))
    assert err.value.status == 400 and "KV cache" in err.value.message

    class EngineDeadError(RuntimeError):
        pass

    FakeEngine.fail_with = EngineDeadError("background loop died")
    with pytest.raises(ServiceError) as err:
        await engine.chat(MESSAGES, SamplingParams(max_tokens=5))
    assert err.value.status == 503
    assert len(fake.aborted) == 2  # failed requests are aborted too


async def test_prompt_longer_than_the_window_is_400(monkeypatch: pytest.MonkeyPatch) -> None:
    engine, fake = await started(monkeypatch, max_model_len=8)
    with pytest.raises(ServiceError) as err:
        await engine.chat([{"role": "user", "content": "word " * 20}], SamplingParams(max_tokens=5))
    assert err.value.status == 400 and "exceeds context window" in err.value.message
    assert fake.calls == []


async def test_gemma_without_chat_template_uses_the_gemma_turn_format(monkeypatch: pytest.MonkeyPatch) -> None:
    engine, fake = await started(monkeypatch, tokenizer=FakeTokenizer(chat_template=None), model_type="gemma3")
    await engine.chat(MESSAGES, SamplingParams(max_tokens=5))
    expected = FakeTokenizer().encode(render_gemma(MESSAGES), add_special_tokens=False)
    assert fake.calls[-1][0] == {"prompt_token_ids": expected}


async def test_passthrough_serves_text_and_rejects_tools_and_images(monkeypatch: pytest.MonkeyPatch) -> None:
    engine, _ = await started(monkeypatch)
    body = {"messages": MESSAGES, "max_tokens": 64}
    response = await engine.passthrough(body, 16)
    assert response.choices[0].message.content == "".join(PIECES)
    assert response.usage is not None and response.usage.completion_tokens == len(PIECES)
    chunks = [c async for c in engine.passthrough_stream({**body, "stream": True}, 16)]
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "".join(PIECES)
    for bad in (
        {"tools": [{"type": "function", "function": {"name": "f"}}]},
        {"functions": [{"name": "f"}]},
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
    ):
        with pytest.raises(ServiceError) as err:
            await engine.passthrough({**body, **bad}, 16)
        assert err.value.status == 400 and "not supported" in err.value.message
        with pytest.raises(ServiceError):
            [c async for c in engine.passthrough_stream({**body, **bad, "stream": True}, 16)]


class TestVLLMEngineContract(EngineContract):
    """vLLM through the fake of its API: a stream closed early is aborted in vLLM."""

    @pytest.fixture
    async def engine(self, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[VLLMEngine]:
        engine, fake = await started(monkeypatch)
        fake.step_delay = 0.01
        yield engine
        await engine.stop()

    @pytest.fixture
    def generation_stopped(self) -> Callable[[], Awaitable[bool]]:
        async def stopped() -> bool:
            fake = FakeEngine.last
            assert fake is not None
            return len(fake.aborted) == 1 and fake.aborted[0] == fake.calls[-1][2]

        return stopped
