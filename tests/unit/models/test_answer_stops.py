"""Where an answer ends: stop sequences in streaming and whole answers, with no label leaking.

The cutter is checked on its own, then inside the real TransformersEngine generation loop driven by
a scripted stand-in model (a character tokenizer and a model whose forward pass "generates" a fixed
text token by token): no weights are loaded.
"""

from __future__ import annotations

import pickle
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ragserve.api.documents import NodeWithScore
from ragserve.api.openai import ChatCompletionRequest, SamplingParams
from ragserve.config import Settings
from ragserve.models.stops import AnswerCutter, merge_stops, safe_length
from ragserve.models.transformers_engine import TransformersEngine
from ragserve.rag.prompt import build_rag_messages
from ragserve.service.chat import ChatOptions, ChatService
from ragserve.service.local import EngineClient
from tests.unit.models.stand_ins import OFFSET, TINY_VOCAB, CharTokenizer, one_layer_config

COMPLETION = ["\n"]


def stream(cutter: AnswerCutter, pieces: list[str]) -> list[str]:
    """Feed the decoded text piece by piece, as the engine does; returns what was sent, ending
    with what ``finish`` adds."""
    text, sent = "", []
    for piece in pieces:
        text += piece
        out = cutter.feed(text)
        if out:
            sent.append(out)
        if cutter.stopped:
            break
    rest = cutter.finish()
    return [*sent, rest] if rest else sent


def test_a_label_split_across_tokens_is_held_back_and_never_sent() -> None:
    cutter = AnswerCutter(merge_stops(["\nQuestion:"], []))
    sent = stream(cutter, ["Paris", " is", "\nQue", "st", "ion:", " What"])
    assert sent == ["Paris", " is"]
    assert cutter.stopped and cutter.text == "Paris is"


def test_a_tail_that_turns_out_not_to_be_a_stop_is_sent_later() -> None:
    cutter = AnswerCutter(["User:"])
    sent = stream(cutter, ["Use", "d ", "daily."])
    assert sent == ["Used ", "daily."]  # "Use" waited: it might have been the start of "User:"
    assert not cutter.stopped


def test_completion_answers_are_trimmed_and_a_leading_newline_does_not_end_them() -> None:
    cutter = AnswerCutter(COMPLETION, strip=True)
    sent = stream(cutter, ["\n", " Paris", ".  ", "\n", "Question: next"])
    assert "".join(sent) == "Paris." and cutter.stopped
    assert all(not s.isspace() for s in sent)


def test_trailing_whitespace_is_dropped_at_the_end_of_a_completion_answer() -> None:
    cutter = AnswerCutter(COMPLETION, strip=True)
    assert "".join(stream(cutter, [" Rome", " ", " "])) == "Rome" and not cutter.stopped


def test_partial_utf8_characters_wait_for_their_last_byte() -> None:
    cutter = AnswerCutter([])
    assert cutter.feed("caf\ufffd") == "caf"
    assert cutter.feed("café") == "é"


def test_client_stops_are_added_to_the_format_stops_once_each() -> None:
    assert merge_stops(["\n"], ["END", "", "\n"], ["END"]) == ["\n", "END"]


def _held_plainly(text: str, stops: list[str]) -> int:
    """What ``safe_length`` means, read off its definition (every tail against every prefix)."""
    n = len(text)
    while n > 0 and text[n - 1] == "\ufffd":
        n -= 1
    held = max((k for s in stops for k in range(1, min(len(s) - 1, n) + 1) if text.endswith(s[:k], 0, n)), default=0)
    return n - held


def test_what_may_be_sent_is_what_the_plain_definition_gives_token_by_token() -> None:
    """Streamed a token at a time over a small alphabet (tails that start stop sequences often),
    ``safe_length`` reading only the unsent tail agrees with every tail checked against every stop."""
    import random

    rng = random.Random(7)
    for _ in range(3000):
        stops = ["".join(rng.choice("ab\ufffd") for _ in range(rng.randint(1, 6))) for _ in range(rng.randint(1, 4))]
        text, sent = "", 0
        for _ in range(rng.randint(1, 12)):
            text += "".join(rng.choice("abc\ufffd") for _ in range(rng.randint(1, 3)))
            if any(s in text for s in stops):
                break  # the cutter stops here (stop_index), before asking what may be sent
            ready = safe_length(text, stops, sent)
            assert ready == _held_plainly(text, stops), (text, stops, sent)
            sent = max(sent, ready)


def test_long_stop_sequences_cost_a_token_what_it_adds() -> None:
    """Four stop sequences of 100,000 characters beside an answer of 20,000: each token used to
    check every tail of the answer against every stop (quadratic in the answer, 19 ms a token at
    8,000 characters). Fed a token at a time now, the whole answer takes well under a second, the
    same as with short stops within a factor that allows for a noisy machine."""
    long_stops = ["b" + "a" * 100_000, "a" * 100_000 + "b", "ab" * 50_000, "x" * 100_000]
    words = ("a " * 10_000).split(" ")

    def feed_all(stops: list[str]) -> float:
        cutter, text = AnswerCutter(stops), ""
        t0 = time.thread_time()
        for w in words:
            text += w + " "
            cutter.feed(text)
        cutter.finish()
        assert cutter.text == text  # nothing stopped it, and all of it was let through
        return time.thread_time() - t0

    short, long = feed_all(["END", "b"]), feed_all(long_stops)
    assert long < 1.0 and long < 20 * max(short, 0.01), (short, long)


def test_a_held_tail_against_stops_of_the_longest_accepted_length_stays_cheap() -> None:
    """A completion answer holds trailing spaces back (strip), so with stops that could start with
    spaces the unsent tail grows with every space token and is read against each stop: bounded by
    the stops' length, which requests may not exceed (``MAX_STOP_CHARS``). 8,000 space tokens:
    ~0.2 ms a token here; the bound allows for a loaded machine and coverage tracing."""
    from ragserve.api.sampling import MAX_STOP_CHARS as most

    stops = [" z" + " " * (most - 2), " " + "z" * (most - 1), "\n" * most, " " * (most - 1) + "q"]
    cutter, text = AnswerCutter(stops, strip=True), "x"
    t0 = time.thread_time()
    for _ in range(8000):
        text += " "
        cutter.feed(text)
    assert cutter.finish() == "" and cutter.text == "x"
    assert time.thread_time() - t0 < 10.0


# --- the engine loop, with a scripted stand-in model -------------------------------------------


class ScriptedModel:
    """Generates ``script`` one character a token (5 ms a step) through the forward pass the engine's
    batch loop calls: the step that reads a prompt (from position 0) yields its first character,
    each step after it the next one, then <eos>. Records the prompts and how many tokens it
    produced. It serves one request at a time, as these tests send them, and reads a prompt in one
    step (the engine is given a prefill chunk longer than any prompt here)."""

    def __init__(self, script: str):
        self.script = script
        self.produced = 0
        self.prompts: list[str] = []
        self.config = one_layer_config()
        self.generation_config = SimpleNamespace(eos_token_id=2, pad_token_id=0)
        self.lock = threading.Lock()
        self.prompt_length = 0

    def forward(
        self, input_ids: Any, attention_mask: Any, position_ids: Any, cache: Any, use_cache: bool, logits_to_keep: int
    ) -> Any:
        import torch

        rows, length = input_ids.shape
        assert rows == 1, "the scripted model serves one request at a time"
        cache.update(torch.zeros(rows, 1, length, 1), torch.zeros(rows, 1, length, 1), 0)
        start = int(position_ids[0, 0])
        if start == 0:  # a prompt is read
            ids = input_ids[0].tolist()
            self.prompts.append(
                ("<bos>" if ids[:1] == [CharTokenizer.bos_token_id] else "") + CharTokenizer().decode(ids)
            )
            self.prompt_length = length
        index = start + length - self.prompt_length  # how many script characters came before this step's
        token = ord(self.script[index]) + OFFSET if index < len(self.script) else CharTokenizer.eos_token_id
        time.sleep(0.005)
        with self.lock:
            self.produced += 1
        logits = torch.zeros(rows, 1, TINY_VOCAB)
        logits[0, 0, token] = 1.0
        return SimpleNamespace(logits=logits)

    __call__ = forward


def scripted_engine(script: str, prompt_format: str = "auto") -> tuple[TransformersEngine, ScriptedModel]:
    pytest.importorskip("torch")
    engine = TransformersEngine(
        "scripted", "/nonexistent", engine_args={"prefill_chunk": 100_000}, prompt_format=prompt_format
    )
    model = ScriptedModel(script)
    engine._install(CharTokenizer(), model)
    return engine, model


QUESTION = build_rag_messages([], [], "What is the capital of Pellumia?", [])
ANSWER_THEN_MORE = " Zorvath is the capital.\nQuestion: What is the capital of Spain?\nAnswer: Madrid." + "x" * 200


async def test_the_engine_stops_generating_at_the_end_of_the_answer() -> None:
    engine, model = scripted_engine(ANSWER_THEN_MORE)
    assert engine.prompt_format == "completion"
    result = await engine.chat(QUESTION, SamplingParams(max_tokens=300))
    assert result.text == "Zorvath is the capital."
    assert result.finish_reason == "stop"
    assert model.produced < len(" Zorvath is the capital.\n") + 10  # it did not run on to max_tokens
    assert model.prompts[0] == "<bos>User: What is the capital of Pellumia?\nAssistant:"
    assert result.prompt_tokens == engine.token_counter().count_messages(QUESTION) == len(model.prompts[0]) - 4


async def test_a_streamed_answer_is_the_whole_answer_in_pieces_with_no_label() -> None:
    engine, _ = scripted_engine(ANSWER_THEN_MORE)
    deltas = [d async for d in engine.chat_stream(QUESTION, SamplingParams(max_tokens=300))]
    assert "".join(d.text for d in deltas) == "Zorvath is the capital."
    assert all("\n" not in d.text and "Question" not in d.text for d in deltas)
    assert deltas[-1].finish_reason == "stop" and len(deltas) > 3


async def test_a_client_stop_ends_the_answer_earlier() -> None:
    engine, _ = scripted_engine(ANSWER_THEN_MORE)
    result = await engine.chat(QUESTION, SamplingParams(max_tokens=300, stop=[" is"]))
    assert (result.text, result.finish_reason) == ("Zorvath", "stop")


async def test_max_tokens_before_any_stop_is_a_length_finish() -> None:
    engine, model = scripted_engine(ANSWER_THEN_MORE)
    result = await engine.chat(QUESTION, SamplingParams(max_tokens=6))
    assert (result.text, result.finish_reason, result.completion_tokens) == ("Zorva", "length", 6)  # " Zorva"
    assert model.produced == 6


async def test_the_chat_format_has_no_completion_stops() -> None:
    engine, _ = scripted_engine(" Line one.\nLine two.", prompt_format="chat")
    assert engine.prompt_format == "chat"
    result = await engine.chat(QUESTION, SamplingParams(max_tokens=100))
    assert result.text == " Line one.\nLine two." and result.finish_reason == "stop"


STEPS_QUESTION = build_rag_messages([], [], "How do I install Flask?", [])
STEPS_THEN_MORE = (
    " You can install it using the following steps:\n"
    "1. Create a virtual environment: python3 -m venv .venv\n"
    "2. Activate it: . .venv/bin/activate\n"
    "3. Install Flask: pip install Flask\n"
    "\nFlask is now installed. Check out the quickstart.\nQuestion: How do I run it?" + "x" * 300
)
STEPS = STEPS_THEN_MORE.split("\n\n")[0].strip()


async def test_steps_asked_for_are_answered_whole_and_generation_stops_after_them() -> None:
    engine, model = scripted_engine(STEPS_THEN_MORE)
    result = await engine.chat(STEPS_QUESTION, SamplingParams(max_tokens=400))
    assert result.text == STEPS and result.finish_reason == "stop"
    for step in ("venv", "activate", "pip install Flask"):
        assert step in result.text
    assert model.produced < len(STEPS) + 40  # stopped once the prose after the blank line began


async def test_a_streamed_list_answer_is_the_whole_one_in_pieces() -> None:
    engine, _ = scripted_engine(STEPS_THEN_MORE)
    deltas = [d async for d in engine.chat_stream(STEPS_QUESTION, SamplingParams(max_tokens=400))]
    assert "".join(d.text for d in deltas) == STEPS
    assert not any("Flask is now" in d.text or "Question" in d.text for d in deltas)
    assert deltas[-1].finish_reason == "stop" and len(deltas) > 10


async def test_a_list_cut_by_max_tokens_after_its_end_finishes_as_stop() -> None:
    engine, _ = scripted_engine(STEPS_THEN_MORE)
    limit = len(STEPS_THEN_MORE.split("\n\n")[0]) + 4  # " ...Flask\n\nFla": the prose has begun
    result = await engine.chat(STEPS_QUESTION, SamplingParams(max_tokens=limit))
    assert (result.text, result.finish_reason) == (STEPS, "stop")


class OneSource:
    """The chat service's documents: the index exists and every search finds one source; the
    embedder is the real one (the evidence for the answer is computed with it)."""

    def __init__(self, embedder: Any) -> None:
        self.embedder = embedder

    async def index_exists(self, index_name: str) -> bool:
        return True

    async def retrieve(self, index_name: str, query: str, k: int, *args: Any) -> tuple[list[NodeWithScore], dict]:
        text = "Zorvath is the capital of Pellumia."
        return [NodeWithScore(doc_id="d", node_id="n", text=text, score=0.9, metadata={"title": "p.md"})], {}


async def test_the_chat_service_tells_the_engine_a_rag_prompt_is_a_question_over_sources(
    tmp_path: Path, embedder: Any
) -> None:
    """The engine does not read the RAG prompt: ``SamplingParams.grounded`` makes it a question, and
    the budget counted that very prompt."""
    engine, model = scripted_engine(ANSWER_THEN_MORE)
    chat = ChatService(
        ChatOptions.from_settings(Settings(storage_dir=str(tmp_path))), OneSource(embedder), EngineClient(engine)
    )
    question = {"role": "user", "content": "What is the capital of Pellumia?"}
    rag = await chat.complete(ChatCompletionRequest(messages=[question], index_name="kb"))
    assert rag.mode == "rag" and rag.response is not None
    assert model.prompts[0].endswith("\n\nQuestion: What is the capital of Pellumia?\nAnswer:")
    assert rag.stats["prompt_tokens"] == rag.response.usage.prompt_tokens == len(model.prompts[0]) - 4  # <bos>: 1
    chat_only = await chat.complete(ChatCompletionRequest(messages=[question]))  # passthrough: a plain chat
    assert chat_only.mode == "passthrough"
    assert model.prompts[1] == "<bos>User: What is the capital of Pellumia?\nAssistant:"
    # the flag crosses the Generator deployment's handle with the rest of the parameters
    assert pickle.loads(pickle.dumps(SamplingParams(max_tokens=8, grounded=True))).grounded
