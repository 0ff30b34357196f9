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
from ragserve.models.transformers_engine import (
    PREFILL_OBSERVE_MIN_TOKENS,
    PREFILL_PROBE_RUNS,
    PREFILL_PROBE_TOKENS,
    TransformersEngine,
)
from ragserve.models.vllm_engine import VLLMEngine
from tests.unit.models.stand_ins import TINY_VOCAB, CharTokenizer, one_layer_config

SECONDS_PER_TOKEN = 0.0004  # 2500 tokens/s


class WordTokenizer:
    def __call__(self, text: str, add_special_tokens: bool = False, **kwargs: Any) -> Any:
        return SimpleNamespace(input_ids=list(range(len(text.split()))))


class TimedModel:
    """Reads a prompt in ``SECONDS_PER_TOKEN`` a token through the forward pass the batch loop calls;
    records each call's first position and length."""

    def __init__(self, window: int = 32768) -> None:
        self.calls: list[tuple[int, int]] = []
        self.config = one_layer_config(window)
        self.generation_config = SimpleNamespace(eos_token_id=2, pad_token_id=0)

    def forward(
        self, input_ids: Any, attention_mask: Any, position_ids: Any, cache: Any, use_cache: bool, logits_to_keep: int
    ) -> Any:
        rows, length = input_ids.shape
        self.calls.append((int(position_ids[0, 0]), length))
        time.sleep(length * SECONDS_PER_TOKEN)
        return SimpleNamespace(logits=torch.zeros(rows, 1, TINY_VOCAB))

    __call__ = forward

    def reads(self) -> list[int]:
        """How many tokens each prompt read had (a read starts at position 0 and may take several chunks)."""
        lengths: list[int] = []
        for start, length in self.calls:
            if start == 0:
                lengths.append(0)
            lengths[-1] += length
        return lengths


def engine_with(window: int | None) -> tuple[TransformersEngine, TimedModel]:
    engine = TransformersEngine("stand-in", "/nonexistent")
    model = TimedModel()
    engine._tokenizer, engine._model, engine._window = WordTokenizer(), model, window
    return engine, model


def test_the_speed_is_the_fastest_of_a_few_reads_of_a_real_length_prompt() -> None:
    engine, model = engine_with(32768)
    rate = engine._measure_prefill()
    assert 0.4 / SECONDS_PER_TOKEN < rate <= 1 / SECONDS_PER_TOKEN  # the sleep, plus a scheduler's delay
    assert model.reads()[0] < PREFILL_PROBE_TOKENS  # a short warm-up first
    assert model.reads()[1:] == [PREFILL_PROBE_TOKENS] * PREFILL_PROBE_RUNS
    # read as requests are: in chunks of the engine's prefill_chunk
    assert max(length for _, length in model.calls) == engine.prefill_chunk < PREFILL_PROBE_TOKENS


def test_no_read_starts_once_the_probe_has_taken_its_time(monkeypatch) -> None:
    monkeypatch.setattr("ragserve.models.transformers_engine.PREFILL_PROBE_MAX_S", 0.01)
    engine, model = engine_with(32768)
    engine._measure_prefill()
    assert model.reads()[1:] == [PREFILL_PROBE_TOKENS]  # a busy or slow machine starts sooner


def test_the_probe_prompt_fits_a_small_window() -> None:
    engine, model = engine_with(100)
    engine._measure_prefill()
    assert set(model.reads()[1:]) == {99}


def test_only_the_embedded_engine_reports_a_speed_and_only_once_measured() -> None:
    assert TransformersEngine("stand-in", "/nonexistent").prefill_tokens_per_s() is None  # before start
    # a GPU or a remote server: the window bounds the context, not the cost of reading it
    assert VLLMEngine("some/model").prefill_tokens_per_s() is None
    assert OpenAIEngine("http://127.0.0.1:9/v1", "m", None, 1.0).prefill_tokens_per_s() is None


def served(engine: TransformersEngine, prompt_chars: int) -> int:
    """One request through the engine's batch loop, its prompt read by the timed model; its prompt tokens."""
    engine._install(CharTokenizer(), TimedModel())
    result = asyncio.run(engine.chat([{"role": "user", "content": "x" * prompt_chars}], SamplingParams(max_tokens=1)))
    return result.prompt_tokens


def test_a_request_that_reads_its_prompt_faster_raises_the_measured_speed() -> None:
    engine, _ = engine_with(32768)
    engine._prefill_rate = 100.0  # measured while the machine was busy
    assert served(engine, 100) < PREFILL_OBSERVE_MIN_TOKENS  # too short to say
    assert engine.prefill_tokens_per_s() == 100.0
    assert served(engine, 600) > PREFILL_OBSERVE_MIN_TOKENS
    raised = engine.prefill_tokens_per_s()
    assert raised is not None and 0.4 / SECONDS_PER_TOKEN < raised <= 1 / SECONDS_PER_TOKEN
    engine._observe_prefill(600, 60.0)  # a busy moment later does not lower it
    assert engine.prefill_tokens_per_s() == raised


def test_a_stand_in_without_a_measure_stays_without_one() -> None:
    engine, _ = engine_with(32768)
    served(engine, 600)
    assert engine.prefill_tokens_per_s() is None  # the window bounds its context
