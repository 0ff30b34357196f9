"""Gemma's turn format (the packaged GGUF has no chat template, so ragserve renders it)."""

from __future__ import annotations

from ragserve.models.gemma import render_gemma
from ragserve.models.tokenizers import HFTokenCounter


def test_single_user_turn_ends_with_generation_prompt() -> None:
    assert render_gemma([{"role": "user", "content": "Hi"}]) == (
        "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
    )


def test_system_and_developer_are_folded_into_the_first_user_turn() -> None:
    rendered = render_gemma(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "developer", "content": "Cite sources."},
            {"role": "user", "content": "What is RAG?"},
        ]
    )
    assert rendered == (
        "<bos><start_of_turn>user\nBe brief.\n\nCite sources.\n\nWhat is RAG?<end_of_turn>\n<start_of_turn>model\n"
    )
    assert "system" not in rendered and "developer" not in rendered


def test_multi_turn_maps_assistant_to_model_and_folds_system_once() -> None:
    rendered = render_gemma(
        [
            {"role": "system", "content": "  Context: [1] KAITO automates inference.  "},
            {"role": "user", "content": "What is KAITO?"},
            {"role": "assistant", "content": "An operator."},
            {"role": "user", "content": [{"type": "text", "text": "For what?"}]},
        ]
    )
    assert rendered == (
        "<bos>"
        "<start_of_turn>user\nContext: [1] KAITO automates inference.\n\nWhat is KAITO?<end_of_turn>\n"
        "<start_of_turn>model\nAn operator.<end_of_turn>\n"
        "<start_of_turn>user\nFor what?<end_of_turn>\n"
        "<start_of_turn>model\n"
    )
    assert rendered.count("Context:") == 1


def test_system_only_becomes_a_user_turn_and_other_roles_are_user_turns() -> None:
    assert render_gemma([{"role": "system", "content": "Rules."}]) == (
        "<bos><start_of_turn>user\nRules.<end_of_turn>\n<start_of_turn>model\n"
    )
    rendered = render_gemma([{"role": "tool", "content": "75F"}, {"role": "user", "content": "thanks"}])
    assert rendered.count("<start_of_turn>user\n") == 2


def test_system_before_a_leading_assistant_turn_still_reaches_a_user_turn() -> None:
    rendered = render_gemma(
        [
            {"role": "system", "content": "S"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "Hi"},
        ]
    )
    assert rendered.endswith("<start_of_turn>user\nS\n\nHi<end_of_turn>\n<start_of_turn>model\n")


class _CharTokenizer:
    """One token a character: enough to check that the counter counts the rendered string."""

    name_or_path = "chars"
    chat_template = None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text]


def test_counter_with_gemma_renderer_counts_the_rendered_prompt() -> None:
    counter = HFTokenCounter(_CharTokenizer(), render=render_gemma)
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]
    assert counter.render(messages) == render_gemma(messages)
    assert counter.count_messages(messages) == len(render_gemma(messages))
