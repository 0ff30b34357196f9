"""Stand-ins for the embedded engine's tests, so that none loads the packaged weights: a character
tokenizer, a tiny randomly initialised Gemma 3 (real transformers code, sliding-window layers
included) and the config that stand-in models hand to the batch loop's cache."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

OFFSET = 10  # token id = ord(char) + OFFSET; 0 is <pad>, 1 <bos>, 2 <eos>, 3 <unk>
#: Every id of the tiny model's vocabulary decodes to a character (ids below OFFSET are special).
TINY_VOCAB = OFFSET + 128
#: The tiny model's sliding window: short prompts already outgrow it.
TINY_WINDOW = 6


class CharTokenizer:
    """One token a character, with a <bos> it prepends and an <eos>; no chat template."""

    chat_template = None
    bos_token, bos_token_id, eos_token_id, unk_token_id, pad_token_id = "<bos>", 1, 2, 3, 0
    name_or_path = "chars"

    def _ids(self, text: str) -> list[int]:
        ids: list[int] = []
        if text.startswith(self.bos_token):
            ids, text = [self.bos_token_id], text[len(self.bos_token) :]
        return ids + [ord(c) + OFFSET for c in text]

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return ([self.bos_token_id] if add_special_tokens else []) + self._ids(text)

    def __call__(self, text: str, add_special_tokens: bool = True, return_tensors: str | None = None) -> Any:
        ids = self.encode(text, add_special_tokens)
        if return_tensors == "pt":
            import torch

            return SimpleNamespace(input_ids=torch.tensor([ids]))
        return SimpleNamespace(input_ids=ids)

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(i - OFFSET) for i in ids if i >= OFFSET)

    def convert_tokens_to_ids(self, token: str) -> int:
        return self.unk_token_id


def one_layer_config(window: int = 4096) -> Any:
    """A real (tiny) Gemma 3 text config of one full-attention layer: what a scripted stand-in model
    shows the engine (its window, its model type) and the batch loop (the cache it builds)."""
    from transformers import Gemma3TextConfig

    return Gemma3TextConfig(
        vocab_size=TINY_VOCAB,
        hidden_size=8,
        intermediate_size=8,
        num_hidden_layers=1,
        num_attention_heads=1,
        num_key_value_heads=1,
        head_dim=1,
        layer_types=["full_attention"],
        max_position_embeddings=window,
    )


def tiny_gemma(seed: int = 0, window: int = 256) -> Any:
    """A randomly initialised Gemma 3 causal LM of four layers, three of them sliding-window
    (``TINY_WINDOW``). Its output and input embeddings are not tied and its weights are large enough
    that greedy decoding depends on the context instead of repeating one token."""
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(
        vocab_size=TINY_VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        sliding_window=TINY_WINDOW,
        layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
        max_position_embeddings=window,
        tie_word_embeddings=False,
        initializer_range=0.3,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(seed)
    return Gemma3ForCausalLM(config).eval()


class Breakable:
    """A model whose next forward pass raises once ``fail(input_ids)`` says so (then it works again)."""

    def __init__(self, model: Any):
        self.model, self.config, self.generation_config = model, model.config, model.generation_config
        self.fail: Callable[[Any], bool] = lambda input_ids: False

    def forward(self, input_ids: Any, attention_mask: Any, position_ids: Any, cache: Any, **kwargs: Any) -> Any:
        if self.fail(input_ids):
            self.fail = lambda input_ids: False
            raise RuntimeError("the step broke")
        return self.model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, cache=cache, **kwargs
        )

    __call__ = forward
