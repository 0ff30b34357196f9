"""The follow-up query (``ragserve.rag.followup``): a turn that refers back gets the salient terms of
the earlier turns, a turn with a subject of its own gets nothing, and whatever a client sends, the
reading is bounded. Pure: no index, no model (the Flask cases: tests/unit/test_followups_docset.py)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from ragserve.rag.followup import (
    MAX_REFERRING_CHARS,
    followup_query,
    refers_back,
    rewrite_messages,
    salient_terms,
)


def conversation(*turns: str) -> list[dict[str, Any]]:
    """user, assistant, user, ... (the history before the newest turn)."""
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]


FLASK = conversation("What is Flask?", "Flask is a lightweight web framework.")


@pytest.mark.parametrize(
    "turn",
    [
        "How do I set it up?",
        "How do I subscribe to them?",
        "Which port does it listen on by default?",
        "How do I register one on the application?",
        "What are its dependencies?",
        "Is that safe?",
        "And on Windows?",
        "and with Apache httpd?",
        "What about the default?",
        "How about gevent?",
        "Why?",
        "Example?",
        "Install?",
    ],
)
def test_a_turn_that_refers_back(turn: str) -> None:
    assert refers_back(turn)


@pytest.mark.parametrize(
    "turn",
    [
        "How do I configure logging for my application?",
        "How does template inheritance work?",
        "How do I make sure that uploads are safe?",  # "that" opens a clause
        "What is Gunicorn?",
        "",
        "?!?!",
        "它怎么安装？",  # another script: no English pronoun, not read as a short English turn
        "Как это установить?",
        "How do I set it up? " + "Tell me about the blueprint registration order. " * 20,  # too long to lean back
    ],
)
def test_a_turn_with_a_subject_of_its_own_does_not(turn: str) -> None:
    assert not refers_back(turn)


def test_a_pronoun_follow_up_gets_the_subject_not_the_earlier_question() -> None:
    q = followup_query("How do I set it up?", FLASK)
    assert q == "How do I set it up? (Flask)"  # not "What is Flask?": that asks for the overview


def test_a_topic_switch_and_a_first_question_retrieve_alone() -> None:
    assert followup_query("How do I configure logging for my application?", FLASK) is None
    assert followup_query("How do I set it up?", []) is None
    assert followup_query("How do I set it up?", FLASK, max_terms=0) is None
    # the earlier turns hold nothing salient: nothing to add
    assert followup_query("And then?", conversation("How do I do it?", "Like this.")) is None


def test_code_identifiers_then_names_then_content_words_newest_earlier_turn_first() -> None:
    history = conversation(
        "How do uploads work in Flask?",
        "Read request.files.",
        "How do I set MAX_CONTENT_LENGTH in app.config for the uploads?",
        "Assign it a number of bytes.",
    )
    terms = salient_terms("And what happens when a request exceeds it?", history, max_terms=4)
    assert terms == ["MAX_CONTENT_LENGTH", "app.config", "uploads", "Flask"]
    # the newest turn's own words are not repeated; the bound holds
    assert salient_terms("What about uploads?", history, max_terms=2) == ["MAX_CONTENT_LENGTH", "app.config"]


def test_a_name_the_answer_gave_is_what_it_may_refer_to() -> None:
    history = conversation("How should I deploy to production?", "Use a WSGI server such as Waitress, then Gunicorn.")
    q = followup_query("How do I install it?", history)
    assert q is not None and q.startswith("How do I install it? (deploy production")
    assert "Waitress" in q and "Use" not in q  # the answer's names, not its other words


def test_other_scripts_degrade_to_the_newest_turn_alone() -> None:
    assert followup_query("它怎么安装？", conversation("Flask 是什么？", "一个 Web 框架。")) is None
    # an English follow-up after a turn in another script: only its Latin words can be terms
    assert followup_query("How do I install it?", conversation("Flask 是什么？", "一个 Web 框架。")) == (
        "How do I install it? (Flask Web)"
    )
    assert followup_query("How do I install it?", conversation("这是什么？", "框架。")) is None


def test_what_a_client_sends_is_read_in_bounded_time() -> None:
    mb = "How do I configure the reverse proxy for Flask? " * 21_000  # about a megabyte a turn
    punctuation = "?!.,;:-" * 150_000
    history = conversation(*([mb, punctuation] * 20))  # 40 turns, about 30 MB
    t0 = time.thread_time()
    assert followup_query("And with it?", history) == "And with it? (Flask reverse proxy)"
    assert followup_query(mb, history) is None  # a megabyte question names its own subject
    assert followup_query(punctuation, history) is None
    assert followup_query("How do I set it up?", conversation(punctuation, punctuation)) is None
    assert followup_query("How do I set it up?", conversation("x" * 1_000_000, "")) is None  # no word that long
    assert time.thread_time() - t0 < 5.0  # each turn is read from its first characters only


def test_the_newest_turn_is_kept_as_written_and_bounded_by_what_is_read() -> None:
    turn = "  How do I set it up?\n"
    assert followup_query(turn, FLASK) == "How do I set it up? (Flask)"
    assert len("x" * MAX_REFERRING_CHARS) == MAX_REFERRING_CHARS  # the bound is a number of characters
    assert refers_back(("word " * (MAX_REFERRING_CHARS // 5 - 2)) + "it?")


def test_the_rewrite_prompt_holds_the_newest_messages_cut() -> None:
    history = conversation("What is Flask?", "A framework. " * 100)
    messages = rewrite_messages(history, "How do I set it up?")
    assert messages[0]["role"] == "system" and "standalone" in messages[0]["content"]
    body = messages[1]["content"]
    assert "User: What is Flask?" in body
    assert body.endswith("Last question: How do I set it up?\n\nStandalone question:")
    assert len(body) < 1400  # each message cut to REWRITE_CHARS


def test_a_follow_up_of_a_follow_up_reaches_the_turn_that_named_the_subject() -> None:
    history = conversation("What is Waitress?", "A WSGI server.", "How do I install it?", "With pip.")
    assert followup_query("And on Windows?", history) == "And on Windows? (Waitress)"  # the newest answer names none


@pytest.mark.parametrize(
    "turn",
    [
        "How do I run more than one worker with Gunicorn?",  # "one" a number before its noun, not a pronoun
        "Is there one command to create the database tables?",
        "What are blueprints?",  # asks what its one word is: a subject of its own, written in any case
        "what is celery?",
        "What's a virtualenv?",
        "I get this error: ModuleNotFoundError: No module named flask_sqlalchemy",  # "this" points ahead
        "What does this code do: app.run(debug=True)",
    ],
)
def test_a_new_subject_that_looks_short_or_says_one_is_retrieved_alone(turn: str) -> None:
    history = conversation("How do I configure logging in Flask?", "Use app.logger and dictConfig.")
    assert not refers_back(turn)
    assert followup_query(turn, history) is None  # the old topic's terms never come along


@pytest.mark.parametrize(
    "turn",
    [
        "Which one is faster?",  # "one" heads its phrase: it points back
        "Is there one for Windows?",
        "What is the default?",  # "the": the default of what was asked before
        "What's the default?",  # "what's" is "what is", no content word
        "What is that error?",
        "Is that supported on Windows?",  # "that" after a question's "is": a pronoun, not a clause
        "Why is that config ignored by Gunicorn?",
        "And, on Windows?",  # a comma after the word that continues
        "Also, what about Windows?",
    ],
)
def test_a_turn_that_refers_back_however_it_is_punctuated(turn: str) -> None:
    assert refers_back(turn)


def test_an_abbreviation_is_no_code_identifier() -> None:
    """Abbreviations ("e.g.", "i.e.") hold a dot, as ``app.config`` does, but name nothing: they must not take the
    first places of the terms from the subject's words."""
    history = conversation("How do I serve static files, e.g. images and CSS, with Nginx in front of Flask?", "Ok.")
    terms = salient_terms("How do I configure it?", history)
    assert "e.g" not in terms and terms == ["CSS", "Nginx", "Flask", "serve"]
    assert "i.e" not in salient_terms("How?", conversation("Use app.config, i.e. the config object.", "Ok."))


@pytest.mark.parametrize("apostrophe", ["'", "\u2019"])  # a phone's keyboard writes the curly one
def test_a_contraction_is_no_salient_term(apostrophe: str) -> None:
    """A contraction: "I'm" is no name and "doesn't" no content word; with a curly apostrophe neither is "doesn"."""
    turn = "Thanks, but I'm getting a 404 and the route doesn't match when I've deployed my templates."
    terms = salient_terms("How do I fix it?", conversation(turn.replace("'", apostrophe), "Ok."), max_terms=8)
    assert terms == ["Thanks", "route", "match", "deployed", "templates"]
    assert refers_back(f"Why doesn{apostrophe}t it match?")


def test_a_curly_apostrophe_reads_as_a_straight_one() -> None:
    assert refers_back("It\u2019s slow in production, why?") and refers_back("What\u2019s its default?")
    assert not refers_back("What\u2019s a virtualenv?")
