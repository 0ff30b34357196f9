"""The context of a chat request without ``top_k`` (docs/architecture.md §5): sized by what the model
can use (its prefill speed on a CPU, else its window, or the setting), and ``fit`` within it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from ragserve.api.documents import NodeWithScore
from ragserve.api.messages import message_text
from ragserve.rag.context_size import MIN_CANDIDATES, MIN_CONTEXT_SOURCES, chat_context_size
from ragserve.rag.fit import fit
from ragserve.rag.prompt import format_source

# The embedded Gemma's window; the defaults of default_max_tokens, context_token_ratio, chunk_size,
# max_top_k, chat_context_prefill_s and llm_timeout_s.
DEFAULTS: dict[str, Any] = {
    "window": 32768,
    "reserve": 256,
    "ratio": 0.5,
    "chunk_size": 256,
    "max_top_k": 100,
    "prefill_s": 2.0,
    "timeout_s": 120.0,
}


def size(**kw: Any):
    return chat_context_size(**{**DEFAULTS, **kw})


def test_an_engine_that_reports_its_speed_gets_what_it_reads_in_the_target_time() -> None:
    cpu = size(prefill_tokens_per_s=600.0)
    assert (cpu.tokens, cpu.basis) == (1200, "engine_speed")  # 600 tokens/s x 2 s
    assert cpu.top_k == MIN_CANDIDATES  # 1200 // 256 = 4 sources' worth: never fewer than 5 candidates
    assert cpu.cap == 1200 and cpu.prefill_s == 2.0
    assert "1200 tokens, about 4 source(s) of 256 tokens" in cpu.describe(256)
    faster = size(prefill_tokens_per_s=1800.0)
    assert (faster.tokens, faster.top_k) == (3600, 14)


def test_a_gpu_or_remote_engine_gets_the_windows_share_as_before() -> None:
    remote = size(prefill_tokens_per_s=None)
    assert (remote.tokens, remote.basis, remote.cap) == ((32768 - 256) // 2, "window", None)
    assert remote.top_k == min(100, (32768 - 256) // 2 // 256) == 63
    assert size(window=4096, reserve=32, chunk_size=128).top_k == (4096 - 32) // 2 // 128


def test_a_fast_engine_with_a_small_window_is_bound_by_the_window() -> None:
    small = size(window=2048, prefill_tokens_per_s=5000.0)
    assert (small.tokens, small.basis, small.cap) == ((2048 - 256) // 2, "window", None)


def test_the_setting_fixes_the_size_on_any_engine_within_the_window() -> None:
    for rate in (None, 300.0):
        fixed = size(configured_tokens=2000, prefill_tokens_per_s=rate)
        assert (fixed.tokens, fixed.basis, fixed.top_k) == (2000, "setting", 7)
    too_big = size(window=4096, configured_tokens=100_000)
    assert (too_big.tokens, too_big.basis) == ((4096 - 256) // 2, "window")


def test_the_timeout_bounds_the_prefill_time_and_a_slow_measure_keeps_a_floor() -> None:
    assert size(prefill_tokens_per_s=300.0, prefill_s=100.0, timeout_s=20.0).tokens == 300 * 10  # half of 20 s
    slow = size(prefill_tokens_per_s=40.0)  # measured on a busy machine: 80 tokens
    assert (slow.tokens, slow.basis) == (MIN_CONTEXT_SOURCES * 256, "engine_speed")  # 3 chunks' worth
    assert (
        slow.describe(256)
        == "768 tokens, about 3 source(s) of 256 tokens (the least, 3 chunks: the engine prefills 80 tokens in 2 s)"
    )


def test_a_request_max_tokens_and_ratio_change_the_windows_share() -> None:
    assert size(reserve=8192, ratio=0.8).tokens == int((32768 - 8192) * 0.8)
    assert size(reserve=40000).tokens == 0 and size(reserve=40000).top_k == MIN_CANDIDATES
    assert size(max_top_k=3).top_k == 3


# --- fit within the size ---------------------------------------------------------------------


class WordCounter:
    """Exact and checkable by hand: one token a word, 2 per message, 1 for the generation prompt."""

    name = "words"
    exact = True

    def count_text(self, text: str) -> int:
        return len(text.split())

    def count_messages(self, messages: Sequence[dict[str, Any]], *, grounded: bool = False) -> int:
        return 1 + sum(2 + len(message_text(m).split()) for m in messages)


C = WordCounter()


def nodes(n: int, words: int = 50) -> list[NodeWithScore]:
    return [
        NodeWithScore(doc_id=f"d{i}", node_id=f"n{i}", text=" ".join([f"w{i}"] * words), score=0.9 - i / 100)
        for i in range(n)
    ]


def source_tokens(used: Sequence[NodeWithScore]) -> int:
    return sum(C.count_text("\n\n" + format_source(9, n)) for n in used)


def fitted(candidates: list[NodeWithScore], cap: int | None, **kw: Any):
    return fit(
        counter=C,
        window=32768,
        system=[],
        history=[],
        query="what is it",
        nodes=candidates,
        requested_max_tokens=None,
        default_max_tokens=256,
        max_context_tokens=cap,
        **kw,
    )


@pytest.mark.parametrize("cap", [60, 200, 512, 1200, 5000])
def test_fit_never_gives_the_sources_more_than_the_cap(cap: int) -> None:
    candidates = nodes(40)
    result = fitted(candidates, cap)
    per_source = source_tokens(candidates[:1])
    assert source_tokens(result.nodes_used) <= max(cap, per_source)  # one source at least (next test)
    assert len(result.nodes_used) == max(1, min(40, cap // per_source))
    assert result.nodes_used == candidates[: len(result.nodes_used)]  # the best first
    assert result.prompt_tokens < 300 + cap


def test_without_a_cap_the_windows_share_is_filled_as_before() -> None:
    candidates = nodes(40)
    assert len(fitted(candidates, None).nodes_used) == 40


def test_a_cap_below_the_best_source_still_gives_the_best_that_fits_the_window_alone() -> None:
    candidates = [*nodes(1, words=300), *nodes(3, words=20)[1:]]
    result = fitted(candidates, 100)
    assert [n.node_id for n in result.nodes_used] == ["n1", "n2"]  # the long best one skipped: the next fit
    result = fitted(nodes(3, words=300), 100)
    assert [n.node_id for n in result.nodes_used] == ["n0"]  # none fits the cap: the best alone, not none
    assert result.context_budget > 100  # what was given room: the window's share
