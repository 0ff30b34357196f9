"""The completion prompt format of a base model, and the one-renderer rule: the token counter counts
exactly the string the model is given, grounded as the engine is told. A character tokenizer stands
in for the model's: no weights."""

from __future__ import annotations

import pickle

from ragserve.api.documents import NodeWithScore
from ragserve.models.prompt_format import completion_renderer, render_completion, resolve_format
from ragserve.models.tokenizers import HFTokenCounter
from ragserve.rag.fit import fit
from ragserve.rag.prompt import CONTEXT_INSTRUCTIONS, build_rag_messages


def node(text: str, title: str, score: float = 0.9) -> NodeWithScore:
    return NodeWithScore(doc_id=title, node_id=f"{title}-0", text=text, score=score, metadata={"title": title})


KAITO = node("KAITO is a Kubernetes operator that automates AI model inference.", "kaito.md")
RAG = node("RAG grounds a language model on retrieved text.", "rag.md")


class CharTokenizer:
    """One token a character: a count is the rendered string's length."""

    name_or_path = "chars"
    chat_template = None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text]


def test_a_question_over_sources_reads_instructions_sources_question_answer() -> None:
    messages = build_rag_messages([], [], "What is KAITO?", [KAITO, RAG])
    assert render_completion(messages, bos="<bos>", grounded=True) == (
        f"<bos>{CONTEXT_INSTRUCTIONS}\n\n"
        "Sources:\n"
        "[1] (kaito.md)\nKAITO is a Kubernetes operator that automates AI model inference.\n\n"
        "[2] (rag.md)\nRAG grounds a language model on retrieved text.\n\n"
        "Question: What is KAITO?\n"
        "Answer:"
    )


def test_history_becomes_user_and_assistant_lines_before_the_question() -> None:
    history = [
        {"role": "user", "content": "What is RAG?"},
        {"role": "assistant", "content": " It grounds a model on retrieved text [2]. "},
        {"role": "user", "content": [{"type": "text", "text": "Thanks."}]},
        {"role": "assistant", "content": "You are welcome."},
    ]
    system = [{"role": "system", "content": "Be brief."}]
    rendered = render_completion(build_rag_messages(system, history, "And KAITO?", [KAITO]), grounded=True)
    assert rendered.startswith(f"Be brief.\n\n{CONTEXT_INSTRUCTIONS}\n\nSources:\n[1] (kaito.md)\n")
    assert rendered.endswith(
        "inference.\n\n"
        "User: What is RAG?\n"
        "Assistant: It grounds a model on retrieved text [2].\n"
        "User: Thanks.\n"
        "Assistant: You are welcome.\n"
        "Question: And KAITO?\n"
        "Answer:"
    )
    assert "<start_of_turn>" not in rendered and "system" not in rendered


def test_a_passthrough_chat_ends_with_assistant() -> None:
    assert render_completion([{"role": "user", "content": "What is the capital of France?"}]) == (
        "User: What is the capital of France?\nAssistant:"
    )
    with_system = render_completion(
        [
            {"role": "system", "content": "You are terse."},
            {"role": "developer", "content": "No lists."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello."},
            {"role": "tool", "content": "75F"},
        ]
    )
    assert with_system == "You are terse.\n\nNo lists.\n\nUser: Hi\nAssistant: Hello.\nUser: 75F\nAssistant:"
    # a chat that already ends with the assistant (or has no turn at all) is continued by it
    assert render_completion([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hel"}]) == (
        "User: Hi\nAssistant: Hel\nAssistant:"
    )
    assert render_completion([{"role": "system", "content": "Rules."}]) == "Rules.\n\nAssistant:"


def test_only_a_grounded_request_is_a_question() -> None:
    """The caller says whether the last turn is a question over sources; the system text is not
    searched for them, so a client's own text laid out like ours is still a chat."""
    own_system = [{"role": "system", "content": "You answer questions."}]
    assert render_completion([*own_system, {"role": "user", "content": "q"}]).endswith("User: q\nAssistant:")
    looks_like_ours = build_rag_messages([], [], "q", [KAITO])
    assert render_completion(looks_like_ours).endswith("User: q\nAssistant:")
    assert render_completion(looks_like_ours, grounded=True).endswith("Question: q\nAnswer:")
    # a chat that ends with the assistant is continued by it, grounded or not
    ends_with_assistant = [*looks_like_ours, {"role": "assistant", "content": "KAITO"}]
    assert render_completion(ends_with_assistant, grounded=True).endswith("Assistant: KAITO\nAssistant:")


def test_auto_picks_the_chat_template_when_the_model_has_one() -> None:
    assert resolve_format("auto", has_chat_template=True) == "chat"
    assert resolve_format("auto", has_chat_template=False) == "completion"
    assert resolve_format("completion", has_chat_template=True) == "completion"
    assert resolve_format("chat", has_chat_template=False) == "chat"


def test_the_counter_counts_exactly_the_rendered_prompt() -> None:
    render = completion_renderer("<bos>")
    counter = HFTokenCounter(CharTokenizer(), render=render)
    messages = build_rag_messages([], [{"role": "user", "content": "Hi"}], "What is KAITO?", [KAITO])
    for grounded in (False, True):
        rendered = render_completion(messages, bos="<bos>", grounded=grounded)
        assert counter.render(messages, grounded=grounded) == rendered
        assert counter.count_messages(messages, grounded=grounded) == len(rendered)
    assert counter.count_messages(messages, grounded=True) != counter.count_messages(messages)
    clone = pickle.loads(pickle.dumps(counter))  # the generator ships its counter to the ingress
    assert clone.render(messages, grounded=True) == counter.render(messages, grounded=True)


def test_the_budget_reports_the_tokens_of_the_prompt_the_model_gets() -> None:
    render = completion_renderer("<bos>")
    counter = HFTokenCounter(CharTokenizer(), render=render)
    history = [
        {"role": "user", "content": "old question " * 20},
        {"role": "assistant", "content": "old answer"},
        {"role": "user", "content": "What is RAG?"},
        {"role": "assistant", "content": "Grounding."},
    ]
    result = fit(
        counter=counter,
        window=700,
        system=[],
        history=history,
        query="What is KAITO?",
        nodes=[KAITO, RAG],
        requested_max_tokens=100,
    )
    assert result.grounded  # what the chat service tells the engine (SamplingParams.grounded)
    prompt = render_completion(result.messages, bos="<bos>", grounded=result.grounded)
    assert result.prompt_tokens == len(prompt)
    assert result.prompt_tokens + result.max_tokens <= 700
    assert result.history_dropped >= 1  # the window forced the oldest turn out
    assert prompt.endswith("User: What is RAG?\nAssistant: Grounding.\nQuestion: What is KAITO?\nAnswer:")


def test_without_a_source_that_fits_the_budget_counts_a_plain_chat() -> None:
    """No source fitted: the prompt carries none, is not grounded, and is counted as the chat it is."""
    counter = HFTokenCounter(CharTokenizer(), render=completion_renderer("<bos>"))
    result = fit(
        counter=counter,
        window=1000,
        system=[],
        history=[],
        query="What is KAITO?",
        nodes=[node("x", "low.md", score=0.1)],
        requested_max_tokens=100,
    )
    assert not result.nodes_used and not result.grounded
    prompt = render_completion(result.messages, bos="<bos>")
    assert result.prompt_tokens == len(prompt) and prompt.endswith("User: What is KAITO?\nAssistant:")
