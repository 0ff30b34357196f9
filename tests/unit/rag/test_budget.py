"""The token budget of docs/architecture.md §5, with a hand-checkable counter, and the context windows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from ragserve.api.documents import NodeWithScore
from ragserve.api.messages import message_text
from ragserve.models.windows import lookup_context_window, resolve_context_window
from ragserve.rag.fit import ContextBudgetError, PromptTooLongError, fit, fit_passthrough
from ragserve.rag.prompt import build_rag_messages, format_source


class WordCounter:
    """Exact and checkable by hand: one token a word, 2 per message, 1 for the generation prompt."""

    name = "words"

    def __init__(self, exact: bool = True):
        self.exact = exact

    def count_text(self, text: str) -> int:
        return len(text.split())

    def count_messages(self, messages: Sequence[dict[str, Any]], *, grounded: bool = False) -> int:
        return 1 + sum(2 + len(message_text(m).split()) for m in messages)


C = WordCounter()


def node(i: int, score: float, words: int = 5) -> NodeWithScore:
    return NodeWithScore(
        doc_id=f"d{i}", node_id=f"n{i}", text=" ".join(f"w{i}" for _ in range(words)), score=score, metadata={}
    )


def turns(n: int, words: int = 4) -> list[dict[str, str]]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": " ".join([f"h{i}"] * words)} for i in range(n)]


def base_kwargs(**kw: Any) -> dict[str, Any]:
    out = {
        "counter": C,
        "window": 1000,
        "system": [{"role": "system", "content": "be brief"}],
        "history": [],
        "query": "what is it",
        "nodes": [],
        "requested_max_tokens": None,
        "default_max_tokens": 100,
        "min_completion_tokens": 10,
        "similarity_threshold": 0.5,
    }
    out.update(kw)
    return out


def test_exactly_fits_keeps_max_tokens() -> None:
    prompt = C.count_messages(build_rag_messages([{"role": "system", "content": "be brief"}], [], "what is it", []))
    r = fit(**base_kwargs(window=prompt + 50, requested_max_tokens=50))
    assert r.max_tokens == 50 and r.prompt_tokens == prompt
    assert r.prompt_tokens + r.max_tokens == r.window


def test_one_token_over_clamps_max_tokens_by_one() -> None:
    prompt = C.count_messages(build_rag_messages([{"role": "system", "content": "be brief"}], [], "what is it", []))
    r = fit(**base_kwargs(window=prompt + 50, requested_max_tokens=51))
    assert r.max_tokens == 50


def test_default_max_tokens_and_never_none() -> None:
    r = fit(**base_kwargs())
    assert r.max_tokens == 100
    small = fit(**base_kwargs(window=40))
    assert isinstance(small.max_tokens, int) and small.prompt_tokens + small.max_tokens <= 40


def test_history_trimmed_oldest_first_system_kept() -> None:
    history = turns(10)  # each message costs 2 + 4 = 6
    required = C.count_messages(build_rag_messages([{"role": "system", "content": "be brief"}], [], "what is it", []))
    # free budget after a 20-token completion: 25 -> four whole messages
    r = fit(**base_kwargs(window=required + 20 + 25, requested_max_tokens=20, history=history))
    assert r.history_kept == 4 and r.history_dropped == 6
    assert r.messages[0]["content"] == "be brief"
    assert r.messages[1:-1] == history[-4:]
    assert r.messages[-1] == {"role": "user", "content": "what is it"}
    assert r.history_tokens == 24 and r.prompt_tokens == C.count_messages(r.messages)


def test_history_min_and_max_messages() -> None:
    history = turns(10)
    required = C.count_messages(build_rag_messages([{"role": "system", "content": "be brief"}], [], "what is it", []))
    tight = fit(**base_kwargs(window=required + 100, requested_max_tokens=90, history=history, history_min_messages=3))
    assert tight.history_kept == 3  # kept past the budget ...
    assert tight.max_tokens == 100 - 18  # ... by shrinking the completion
    capped = fit(**base_kwargs(history=history, history_max_messages=2))
    assert capped.history_kept == 2 and capped.messages[1:-1] == history[-2:]


def test_context_selection_skips_oversized_node_and_uses_next() -> None:
    nodes = [node(1, 0.9, words=400), node(2, 0.8, words=5), node(3, 0.7, words=5), node(4, 0.3, words=1)]
    r = fit(**base_kwargs(window=600, requested_max_tokens=100, nodes=nodes))
    assert [n.doc_id for n in r.nodes_used] == ["d2", "d3"]
    assert [n.doc_id for n in r.nodes_skipped] == ["d1"]  # d4 is below the threshold: never a candidate
    system = r.messages[0]["content"]
    assert system.startswith("be brief") and "[1] (d2)" in system and "[2] (d3)" in system
    assert r.prompt_tokens == C.count_messages(r.messages) and r.context_tokens > 0


def test_each_candidate_is_tokenized_once() -> None:
    """Tokenizing the sources is most of fit's time: a node's cost is counted once, not once for
    the selection and again for each total."""

    class CountingCounter(WordCounter):
        def __init__(self) -> None:
            super().__init__()
            self.texts: list[str] = []

        def count_text(self, text: str) -> int:
            self.texts.append(text)
            return super().count_text(text)

    counter = CountingCounter()
    nodes = [node(i, 0.9 - i / 100, words=5) for i in range(8)] + [node(99, 0.95, words=400)]
    r = fit(**base_kwargs(counter=counter, window=600, requested_max_tokens=100, nodes=nodes))
    assert len(r.nodes_used) == 8 and [n.doc_id for n in r.nodes_skipped] == ["d99"]
    assert len(counter.texts) == len(set(counter.texts)) == 9
    assert r.context_tokens > sum(C.count_text(t) for t in counter.texts if "w99" not in t) > 0


def test_unused_context_budget_goes_to_history() -> None:
    history = turns(30)
    without = fit(**base_kwargs(window=300, requested_max_tokens=50, history=history, context_ratio=0.8))
    assert without.history_kept > 20  # no nodes: the whole free budget went to history
    with_nodes = fit(
        **base_kwargs(
            window=300, requested_max_tokens=50, history=history, context_ratio=0.8, nodes=[node(1, 0.9, words=60)]
        )
    )
    assert with_nodes.nodes_used and with_nodes.history_kept < without.history_kept


def test_context_ratio_limits_context() -> None:
    nodes = [node(i, 0.9 - i / 100, words=20) for i in range(10)]
    low = fit(**base_kwargs(window=600, requested_max_tokens=100, nodes=nodes, context_ratio=0.2))
    high = fit(**base_kwargs(window=600, requested_max_tokens=100, nodes=nodes, context_ratio=0.8))
    assert len(low.nodes_used) < len(high.nodes_used)


def test_approximate_counter_keeps_a_safety_margin() -> None:
    history = turns(100)
    exact = fit(**base_kwargs(window=500, requested_max_tokens=50, history=history))
    approx = fit(**base_kwargs(counter=WordCounter(exact=False), window=500, requested_max_tokens=50, history=history))
    assert approx.history_tokens <= 0.8 * exact.history_tokens + 6
    assert approx.exact is False and exact.exact is True


def test_query_alone_too_long_is_an_error_with_numbers() -> None:
    with pytest.raises(PromptTooLongError) as e:
        fit(**base_kwargs(window=20, query="word " * 30))
    message = str(e.value)
    assert message.startswith("Prompt length exceeds context window")
    assert "20 tokens" in message and str(e.value.prompt_tokens) in message


def test_context_dropped_when_framing_does_not_fit() -> None:
    prompt = C.count_messages(build_rag_messages([{"role": "system", "content": "be brief"}], [], "what is it", []))
    r = fit(**base_kwargs(window=prompt + 12, requested_max_tokens=100, nodes=[node(1, 0.9)]))
    assert r.nodes_used == [] and r.max_tokens == 12


def test_small_explicit_max_tokens_is_honoured() -> None:
    r = fit(**base_kwargs(requested_max_tokens=3))
    assert r.max_tokens == 3


def test_fit_passthrough() -> None:
    messages = [{"role": "user", "content": "a b c"}]
    assert fit_passthrough(
        counter=C, window=100, messages=messages, requested_max_tokens=None, default_max_tokens=20
    ) == (6, 20)
    assert fit_passthrough(counter=C, window=100, messages=messages, requested_max_tokens=1000) == (6, 94)
    with pytest.raises(PromptTooLongError):
        fit_passthrough(counter=C, window=10, messages=messages, requested_max_tokens=None)


@pytest.mark.parametrize(
    ("model", "window"),
    [
        ("gpt-4", 8192),
        ("gpt-4o", 128000),
        ("gpt-4o-2024-08-06", 128000),
        ("GPT-4-Turbo", 128000),
        ("claude-3-opus-20240229", 200000),
        ("meta-llama/Llama-3.1-8B-Instruct", 131072),
        ("llama3.1:70b", 131072),
        ("mistral:7b", 32768),
        ("mistralai/Mistral-7B-Instruct-v0.3", 32768),
        ("deepseek-chat", 64000),
        ("gemma-3-270m-q4_k_m", 32768),
        ("google/gemma-3-4b-it", 131072),
        ("Qwen/Qwen2.5-7B-Instruct", 32768),
    ],
)
def test_known_windows(model: str, window: int) -> None:
    assert lookup_context_window(model) == window


def test_window_precedence() -> None:
    assert lookup_context_window("my-own-model") is None and lookup_context_window(None) is None
    assert resolve_context_window(configured=4096, engine=32768, model="gpt-4") == 4096
    assert resolve_context_window(configured=None, engine=32768, model="gpt-4") == 32768
    assert resolve_context_window(configured=None, engine=None, model="gpt-4") == 8192
    assert resolve_context_window(configured=None, engine=None, model="unknown") == 8192


@pytest.mark.parametrize("ratio", [0.2, 0.5, 0.8])
@pytest.mark.parametrize("safety", [1.0, 0.8])
def test_a_max_tokens_that_starves_the_sources_says_how_much_room_a_source_needs(ratio: float, safety: float) -> None:
    nodes = [node(1, 0.9, words=40), node(2, 0.8, words=60), node(3, 0.1, words=5)]
    kw = base_kwargs(window=1000, nodes=nodes, context_ratio=ratio, safety_ratio=safety)
    starved = fit(**{**kw, "requested_max_tokens": 990})
    assert starved.nodes_used == [] and starved.relevant_sources == 2  # node 3 is below the threshold
    assert starved.smallest_source_tokens == C.count_text("\n\n" + format_source(9, nodes[0]))
    assert starved.context_budget < starved.smallest_source_tokens
    room = starved.max_tokens_for_sources
    assert room is not None and 10 <= room < 990
    assert [n.doc_id for n in fit(**{**kw, "requested_max_tokens": room}).nodes_used] == ["d1"]  # it is enough
    error = ContextBudgetError(starved, param="max_tokens", requested_max_tokens=990)
    assert error.status == 400 and error.code == "context_budget" and error.param == "max_tokens"
    assert f"lower max_tokens (now 990) to at most about {room}" in error.message
    assert f"{starved.context_budget} tokens are left for sources" in error.message


def test_no_max_tokens_helps_when_the_prompt_leaves_no_room_for_a_source() -> None:
    prompt = C.count_messages(build_rag_messages([{"role": "system", "content": "be brief"}], [], "what is it", []))
    r = fit(**base_kwargs(window=prompt + 12, requested_max_tokens=100, nodes=[node(1, 0.9)]))
    assert r.relevant_sources == 1 and r.max_tokens_for_sources is None
    error = ContextBudgetError(r, param="max_tokens", requested_max_tokens=100)
    assert "lower max_tokens" not in error.message and "shorten the messages" in error.message


def test_evidence_is_repeated_at_the_end_of_the_sources_message() -> None:
    from ragserve.api.documents import Evidence
    from ragserve.rag.prompt import EVIDENCE_HEADING, with_evidence

    nodes = [NodeWithScore(doc_id="d", node_id="n", text="The pump moves 3,200 litres\nper hour.", score=0.9)]
    messages = build_rag_messages([{"role": "system", "content": "Be brief."}], [], "How fast?", nodes)
    best = Evidence(text="The pump moves 3,200 litres\nper hour.", source=1, node_id="n", start=0, end=37, score=0.8)
    hinted = with_evidence(messages, [best])
    assert hinted[1:] == messages[1:] and messages[0]["content"] != hinted[0]["content"]  # the input is not changed
    assert (
        hinted[0]["content"]
        == f"{messages[0]['content']}\n\n{EVIDENCE_HEADING}\nThe pump moves 3,200 litres\nper hour. [1]"
    )
    assert with_evidence(messages, []) == messages
    assert with_evidence([{"role": "user", "content": "q"}], [best]) == [{"role": "user", "content": "q"}]
