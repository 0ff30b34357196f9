"""The embedded engine's measure of its prefill speed (what sizes a chat's context on a CPU,
docs/architecture.md §5): at start, and raised by requests that read faster, on a stand-in model whose
prompt reading takes a known time per token: no weights are loaded. The real model's measure is
checked in test_engine_transformers.py (slow)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import torch

from ragserve.api.sampling import SamplingParams
from ragserve.models.openai_engine import OpenAIEngine
from ragserve.models.transformers_engine import PREFILL_PROBE_RUNS, PREFILL_PROBE_TOKENS, TransformersEngine, _Job
from ragserve.models.vllm_engine import VLLMEngine

SECONDS_PER_TOKEN = 0.0004  # 2500 tokens/s


class WordTokenizer:
    def __call__(self, text: str, add_special_tokens: bool = False, **kwargs: Any) -> Any:
        return SimpleNamespace(input_ids=list(range(len(text.split()))))


class TimedModel:
    """Reads a prompt in ``SECONDS_PER_TOKEN`` a token; records what it was asked."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def generate(self, input_ids: Any, attention_mask: Any, **kwargs: Any) -> None:
        self.calls.append((int(input_ids.shape[1]), kwargs["max_new_tokens"]))
        time.sleep(int(input_ids.shape[1]) * SECONDS_PER_TOKEN)


def engine_with(window: int | None) -> tuple[TransformersEngine, TimedModel]:
    engine = TransformersEngine("stand-in", "/nonexistent")
    model = TimedModel()
    engine._tokenizer, engine._model, engine._window = WordTokenizer(), model, window
    return engine, model


def test_the_speed_is_the_fastest_of_a_few_reads_of_a_real_length_prompt() -> None:
    engine, model = engine_with(32768)
    rate = engine._measure_prefill()
    assert 0.4 / SECONDS_PER_TOKEN < rate <= 1 / SECONDS_PER_TOKEN  # the sleep, plus a scheduler's delay
    assert model.calls[0][0] < PREFILL_PROBE_TOKENS  # a short warm-up first
    assert model.calls[1:] == [(PREFILL_PROBE_TOKENS, 1)] * PREFILL_PROBE_RUNS  # one generated token each


def test_no_read_starts_once_the_probe_has_taken_its_time(monkeypatch) -> None:
    monkeypatch.setattr("ragserve.models.transformers_engine.PREFILL_PROBE_MAX_S", 0.01)
    engine, model = engine_with(32768)
    engine._measure_prefill()
    assert model.calls[1:] == [(PREFILL_PROBE_TOKENS, 1)]  # a busy or slow machine starts sooner


def test_the_probe_prompt_fits_a_small_window() -> None:
    engine, model = engine_with(100)
    engine._measure_prefill()
    assert {n for n, _ in model.calls[1:]} == {99}


def test_only_the_embedded_engine_reports_a_speed_and_only_once_measured() -> None:
    assert TransformersEngine("stand-in", "/nonexistent").prefill_tokens_per_s() is None  # before start
    # a GPU or a remote server: the window bounds the context, not the cost of reading it
    assert VLLMEngine("some/model").prefill_tokens_per_s() is None
    assert OpenAIEngine("http://127.0.0.1:9/v1", "m", None, 1.0).prefill_tokens_per_s() is None


class StreamingModel(TimedModel):
    """Hands the prompt, then (after reading it) one token, to the streamer, as generate() does."""

    def generate(self, input_ids: Any, attention_mask: Any, **kwargs: Any) -> None:
        streamer = kwargs["streamer"]
        streamer.put(input_ids)
        super().generate(input_ids, attention_mask, **kwargs)
        streamer.put(input_ids[:, :1])
        streamer.end()


def served(engine: TransformersEngine, prompt_tokens: int) -> None:
    """One request's generation through the engine's worker, as ``_generate`` submits it."""
    engine._model = StreamingModel()
    loop = asyncio.new_event_loop()
    try:
        job = _Job(loop)
        kwargs = engine._generate_kwargs(SamplingParams(max_tokens=1), 1)
        engine._generate_blocking(torch.zeros((1, prompt_tokens), dtype=torch.long), kwargs, None, job)
        assert job.first_token_s is not None and job.first_token_s >= prompt_tokens * SECONDS_PER_TOKEN
    finally:
        loop.close()


def test_a_request_that_reads_its_prompt_faster_raises_the_measured_speed() -> None:
    engine, _ = engine_with(32768)
    engine._prefill_rate = 100.0  # measured while the machine was busy
    served(engine, 100)  # too short to say
    assert engine.prefill_tokens_per_s() == 100.0
    served(engine, 600)
    raised = engine.prefill_tokens_per_s()
    assert raised is not None and 0.4 / SECONDS_PER_TOKEN < raised <= 1 / SECONDS_PER_TOKEN
    engine._observe_prefill(600, 60.0)  # a busy moment later does not lower it
    assert engine.prefill_tokens_per_s() == raised


def test_a_stand_in_without_a_measure_stays_without_one() -> None:
    engine, _ = engine_with(32768)
    served(engine, 600)
    assert engine.prefill_tokens_per_s() is None  # the window bounds its context
