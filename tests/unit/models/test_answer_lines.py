"""Where a completion-format answer ends (``AnswerLines``, the rule a base model's answers need):
scripted generations in the shapes the packaged Gemma 3 270M writes, fed as tokens arrive. A list
is kept whole, a one-line answer still stops at its line, and nothing a base model writes after an
answer (a blank line then prose, a label, the sources block, the instructions, a loop) is sent, not
even a piece of it split across tokens."""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import pytest

from ragserve.api.documents import NodeWithScore
from ragserve.models.prompt_format import COMPLETION_LABELS, completion_answer_rule
from ragserve.models.stops import MAX_ANSWER_LINES, AnswerCutter, AnswerLines, asks_for_list
from ragserve.rag.prompt import CONTEXT_INSTRUCTIONS, SOURCES_HEADING, build_rag_messages, format_source

NODE = NodeWithScore(doc_id="d", node_id="n", text="Use pip.", score=0.9, metadata={"title": "installation.rst"})


def rule(question: str) -> AnswerLines:
    """The rule the engine uses for a RAG question in the completion format."""
    return completion_answer_rule(build_rag_messages([], [], question, [NODE]))


def generate(question: str, generation: str, sizes: tuple[int, ...] = (1, 2, 3, 5)) -> tuple[list[str], str, bool]:
    """Feed ``generation`` to a completion-format cutter in tokens of cycling ``sizes`` (characters),
    as the engine does; returns (pieces sent, the whole answer, stopped by the rule)."""
    cutter = AnswerCutter([], strip=True, lines=rule(question))
    sent: list[str] = []
    at, k = 0, 0
    while at < len(generation) and not cutter.stopped:
        at += sizes[k % len(sizes)]
        k += 1
        piece = cutter.feed(generation[:at])
        if piece:
            sent.append(piece)
    rest = cutter.finish()
    if rest:
        sent.append(rest)
    assert "".join(sent) == cutter.text  # streamed: exactly the whole answer in pieces
    return sent, cutter.text, cutter.stopped


STEPS = (
    " 1. Create a new environment on your development computer.\n"
    "2. Install the ``build`` tool.\n"
    "3. Use the ``build`` tool to build the wheel.\n"
    "4. Install the wheel with pip on the server.\n"
)


@pytest.mark.parametrize("sizes", [(1,), (2, 7), (1, 2, 3, 5), (40,)])
def test_a_numbered_list_is_kept_whole_and_ends_at_blank_line_then_prose(sizes: tuple[int, ...]) -> None:
    generation = STEPS + "\n.. code-block:: none\n\n    $ pip install build\n\nYou can find the file in dist."
    sent, answer, stopped = generate("What are the steps to deploy the app?", generation, sizes)
    assert answer == STEPS.strip() and stopped
    assert all(f"{n}." in answer for n in range(1, 5))
    assert "code-block" not in "".join(sent)


def test_a_first_line_that_announces_steps_goes_on_over_them_without_the_question_asking() -> None:
    generation = (
        " You can install it using the following steps:\n"
        "- Create a virtual environment: python3 -m venv .venv\n"
        "- Activate it: . .venv/bin/activate\n"
        "- Install Flask: pip install Flask\n\n"
        "Flask is now installed. Check out the quickstart."
    )
    _, answer, stopped = generate("Flask installation?", generation)
    assert stopped and answer.startswith("You can install it using the following steps:")
    for step in ("venv", "activate", "pip install Flask"):
        assert step in answer
    assert "quickstart" not in answer


def test_a_one_line_answer_still_ends_with_its_line() -> None:
    generation = " The capital of Pellumia is Zorvath.\nZorvath is also its largest city.\n\nQuestion: What"
    sent, answer, stopped = generate("What is the capital of Pellumia?", generation)
    assert (answer, stopped) == ("The capital of Pellumia is Zorvath.", True)
    assert not any("\n" in s for s in sent)


def test_a_one_line_answer_stops_generating_as_soon_as_its_line_ends() -> None:
    cutter = AnswerCutter([], strip=True, lines=rule("Who founded the bakery?"))
    assert cutter.feed(" Marta Okonkwo") == "Marta Okonkwo"
    assert not cutter.stopped
    cutter.feed(" Marta Okonkwo\n")
    assert cutter.stopped and cutter.text == "Marta Okonkwo"  # the engine cancels generation here


def test_a_list_question_whose_answer_wraps_goes_on_over_the_wrapped_line() -> None:
    generation = (
        " You can use the ``pip`` command to install the project in the virtual\n"
        "environment.\n\n.. code-block:: none\n\n    $ pip install flaskr.whl\n"
    )
    _, answer, _ = generate("How do I make the project installable?", generation)
    assert answer.endswith("in the virtual\nenvironment.")


def test_a_code_block_after_a_blank_line_belongs_to_the_steps() -> None:
    generation = (
        " Install the build tool, then build a wheel:\n\n"
        "```sh\n$ pip install build\n\n$ python -m build --wheel\n```\n\n"
        "Question: How do I deploy?"
    )
    _, answer, stopped = generate("How do I build a wheel?", generation)
    assert stopped and "python -m build --wheel" in answer and answer.endswith("```")
    assert "Question" not in answer


def test_what_a_line_ending_with_a_colon_announces_is_kept_after_a_blank_line() -> None:
    """The issue's "You can install it using the following steps:", then the steps as a paragraph;
    and the rst shape of the Flask docs: "…:", a directive, the command."""
    generation = (
        " You can install it using the following steps:\n\n"
        "Create a virtual environment, activate it and run pip install Flask.\n\n"
        "Flask is now installed."
    )
    _, answer, stopped = generate("Flask installation?", generation)
    assert stopped and answer.endswith("run pip install Flask.") and "now installed" not in answer
    generation = (
        " Use the following command to install Flask:\n\n.. code-block:: sh\n\n    $ pip install Flask\n\n"
        "Flask is now installed. Check out the quickstart."
    )
    _, answer, stopped = generate("How do I install Flask?", generation)
    assert stopped and answer.endswith("$ pip install Flask") and "quickstart" not in answer


@pytest.mark.parametrize(
    "after",
    [
        "\nQuestion: List the dependencies that are not installed.\nAnswer: 3. Click",
        "\nAnswer: 3. Click on the command line.",
        "\nUser: thanks",
        "\n  Sources:\n[1] (installation.rst)",
        "\n[6] (install.rst)\n.. code-block:: none",
        f"\n{CONTEXT_INSTRUCTIONS}",
        "\n\nQuestion: What next?",
    ],
)
def test_the_prompt_written_again_after_a_list_is_never_sent_even_split_across_tokens(after: str) -> None:
    generation = " 1. Werkzeug implements WSGI.\n2. Jinja is a template language." + after + "\nmore"
    for sizes in [(1,), (2,), (3, 1), (4, 7)]:
        sent, answer, stopped = generate("List the dependencies.", generation, sizes)
        assert (answer, stopped) == ("1. Werkzeug implements WSGI.\n2. Jinja is a template language.", True)
        streamed = "".join(sent)
        assert not re.search(r"Que|Ans|Use|Sou|\[\d|\n", streamed.split("language.")[-1])


def test_a_label_split_across_tokens_never_leaks_a_piece() -> None:
    cutter = AnswerCutter([], strip=True, lines=rule("List the steps."))
    pieces = [" 1. Build.", "\n", "Qu", "es", "tion", ":", " How"]
    text, sent = "", []
    for p in pieces:
        text += p
        sent.append(cutter.feed(text))
        if cutter.stopped:
            break
    assert "".join(sent) == "1. Build." and cutter.stopped and cutter.text == "1. Build."


def test_an_answer_that_starts_by_echoing_the_prompt_is_cut_before_it() -> None:
    for generation in (" [1] (cli-and-ui.md)\n  [2] (README.md)", f" {CONTEXT_INSTRUCTIONS}", " Question: Why?"):
        sent, answer, _ = generate("What are the steps to try it?", generation)
        assert answer == "" and sent == [], generation


@pytest.mark.parametrize("sizes", [(1,), (3,), (4, 9)])
def test_a_source_head_before_the_answer_is_dropped_and_the_copied_answer_kept(sizes: tuple[int, ...]) -> None:
    """What the packaged Gemma wrote for "List the colours …": the source's head, then its sentence."""
    generation = (
        " [1] (steps-4)\nThe Quillon 3 comes in four colours: graphite, coral, seafoam and ivory.\n\n"
        "Question: List the colours of the Quillon 3 smartphone.\nAnswer:\n[1] (steps-5)"
    )
    sent, answer, stopped = generate("List the colours of the Quillon 3.", generation, sizes)
    assert answer == "The Quillon 3 comes in four colours: graphite, coral, seafoam and ivory." and stopped
    assert not any("[" in s for s in sent)


def test_a_reference_at_the_start_of_an_answer_is_not_a_source_head() -> None:
    _, answer, _ = generate("What does it say?", " [1] says the capital is Zorvath.\nQuestion: Next?")
    assert answer == "[1] says the capital is Zorvath."


def test_a_repeated_line_ends_a_loop_even_with_a_new_number() -> None:
    generation = (
        " 1. Create a project folder.\n"
        "2. Create a .venv folder within it.\n"
        "3. Create a project folder.\n"
        "4. Create a .venv folder within it.\n"
    )
    sent, answer, stopped = generate("How do I create an environment?", generation)
    assert stopped and answer == "1. Create a project folder.\n2. Create a .venv folder within it."
    assert "3" not in "".join(sent)


def test_a_repeated_code_block_loop_ends_after_its_first_copy() -> None:
    block = ".. code-block:: none\n\n    $ python -m venv .venv\n\n"
    _, answer, stopped = generate("How do I create a virtual environment?", " " + block * 6)
    assert stopped and answer == block.strip()


def test_a_line_that_only_starts_like_an_earlier_one_is_kept() -> None:
    generation = " 1. Install Flask.\n2. Install Flask extensions you need.\n"
    _, answer, _ = generate("What are the steps?", generation)
    assert answer == "1. Install Flask.\n2. Install Flask extensions you need."


def test_a_list_that_never_ends_stops_at_the_length_cap_on_a_line_end() -> None:
    generation = " Steps:\n" + "".join(f"{n}. Step number {n} of the procedure is a new one.\n" for n in range(1, 200))
    _, answer, stopped = generate("List the steps.", generation, (9,))
    lines = answer.split("\n")
    assert stopped and len(lines) == MAX_ANSWER_LINES and lines[-1].endswith("a new one.")


def test_a_list_that_ends_with_the_generation_is_kept_whole() -> None:
    _, answer, stopped = generate("List the dependencies.", " 1. Werkzeug\n2. Jinja\n3. Click")
    assert answer == "1. Werkzeug\n2. Jinja\n3. Click" and not stopped


def test_text_cut_by_the_length_limit_after_a_blank_line_ends_at_the_list() -> None:
    cutter = AnswerCutter([], strip=True, lines=rule("List the steps."))
    assert cutter.feed(" 1. Build.\n2. Ship.\n\n1") == "1. Build.\n2. Ship."  # "1" may start an item
    assert not cutter.stopped
    assert cutter.finish() == "" and cutter.text == "1. Build.\n2. Ship."
    assert cutter.stopped  # the answer ended before the limit did: a "stop", not a "length"


def test_a_client_stop_still_ends_a_list_answer_early() -> None:
    cutter = AnswerCutter(["END"], strip=True, lines=rule("List the steps."))
    for text in (" 1. Build.", " 1. Build.\n2. Ship. E", " 1. Build.\n2. Ship. END 3. More"):
        cutter.feed(text)
    cutter.finish()
    assert cutter.stopped and cutter.text == "1. Build.\n2. Ship."


def test_a_partial_character_in_a_repeated_line_is_not_sent_before_it_is_known() -> None:
    cutter = AnswerCutter([], strip=True, lines=rule("List the cafés."))
    cutter.feed(" 1. café au lait\n2. caf")
    assert cutter.feed(" 1. café au lait\n2. caf\ufffd") == ""
    cutter.feed(" 1. café au lait\n2. café au lait\n")
    assert cutter.stopped and cutter.text == "1. café au lait"


@pytest.mark.parametrize(
    ("question", "asks"),
    [
        ("How do I install Flask?", True),
        ("How can I deploy it?", True),
        ("What are the steps to deploy the app?", True),
        ("List the dependencies that Flask installs.", True),
        ("how to configure the secret key", True),
        ("What are the main features?", True),
        ("When was the Lumen Valley observatory built?", False),
        ("How long is the Tessaly river?", False),
        ("How large is the battery of the Quillon 3 smartphone?", False),
        ("What is the capital of Pellumia?", False),
        ("Who founded the Bright Harbor bakery chain?", False),
        ("Where does Project Nimbus keep its backups?", False),
        ("What is a playlist?", False),
    ],
)
def test_which_questions_ask_for_steps_or_a_list(question: str, asks: bool) -> None:
    assert asks_for_list(question) is asks


def test_the_rule_knows_the_formats_labels_and_the_rag_prompts_heading_and_source_heads() -> None:
    assert SOURCES_HEADING in COMPLETION_LABELS
    head = format_source(3, NODE).split("\n", 1)[0]
    assert generate("List them.", f" 1. pip\n{head}\nUse pip.")[1] == "1. pip"
    assert rule("What is it?").echoes == (CONTEXT_INSTRUCTIONS,)
    assert rule("List the steps.").multiline and not rule("What is it?").multiline


def test_a_plain_chat_has_no_echo_line_and_its_own_labels() -> None:
    plain = completion_answer_rule([{"role": "user", "content": "List three colours."}])
    assert plain.echoes == () and plain.multiline
    _, answer, _ = generate_with(plain, " 1. Red\n2. Green\n3. Blue\nUser: thanks")
    assert answer == "1. Red\n2. Green\n3. Blue"


def generate_with(lines: AnswerLines, generation: str) -> tuple[list[str], str, bool]:
    cutter = AnswerCutter([], strip=True, lines=lines)
    sent = [cutter.feed(generation[:n]) for n in range(1, len(generation) + 1) if not cutter.stopped]
    sent.append(cutter.finish())
    return [s for s in sent if s], cutter.text, cutter.stopped


# --- linear time on the worst shapes ---------------------------------------------------------


def _seconds(fn: Callable[[], object]) -> float:
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


@pytest.mark.parametrize(
    "shape",
    ["how " * 250_000, "how" + " " * 1_000_000 + "x", "what are" + "\t" * 1_000_000, "1" * 1_000_000, "s" * 1_000_000],
)
def test_the_question_test_is_linear_on_a_megabyte(shape: str) -> None:
    assert _seconds(lambda: asks_for_list(shape)) < 2.0  # CPU time, room for coverage; quadratic takes hours


@pytest.mark.parametrize(
    "line",
    [
        " " * 1_000_000 + "x",
        "1" * 1_000_000,
        "Step " + " " * 1_000_000,
        "[" + "1" * 1_000_000,
        "- " + "x " * 500_000,
        ".. " + "a" * 1_000_000,
    ],
)
def test_judging_a_megabyte_line_is_linear(line: str) -> None:
    lines = AnswerLines(labels=COMPLETION_LABELS, echoes=(CONTEXT_INSTRUCTIONS,), multiline=True)
    # CPU time; 0.6 s under coverage on a slow day of the shared host, where a quadratic judge takes hours
    assert _seconds(lambda: (lines.judge(line), lines.judge(line, final=True), lines.judge("a\n\n" + line))) < 2.0
