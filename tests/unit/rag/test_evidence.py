"""Evidence selection (ragserve.rag.evidence) and the answerability rule (ragserve.rag.answerable):
the passage that holds the fact is chosen among distractors with the real MiniLM embedder, its
offsets are the source's own text, the rule answers on each side of each threshold, and every
step is linear on 1 MB of its worst shapes."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from ragserve.api.documents import Evidence, NodeWithScore
from ragserve.rag.answerable import (
    NOT_COVERED_ANSWER,
    AnswerabilityRule,
    answerable,
    closest,
    not_covered_answer,
)
from ragserve.rag.evidence import (
    MAX_CANDIDATES,
    MAX_READ_CHARS,
    SHORTLIST,
    Assessment,
    answer_kinds,
    assess,
    candidates,
    coverage,
    embed_text,
    holds_kind,
    missing_names,
    model_text,
    names,
    passages,
    prompt_text,
    reading_text,
    section_titles,
    shortlist,
    terms,
)

PUMP = (
    "The Zephyr X200 is a submersible pump for garden ponds. It moves water through filters and fountains.\n"
    "The housing is made of corrosion-resistant plastic and weighs 2.4 kilograms. The impeller should be\n"
    "cleaned every three months, or sooner when the flow drops. The maximum flow rate of the Zephyr X200 is\n"
    "3,200 litres per hour at a height of one metre.\n\n"
    "The power cable is ten metres long and must not be shortened. The warranty covers manufacturing defects\n"
    "for five years from the date of purchase; wear of the impeller is not covered."
)
LIGHT = (
    "The Lumen L5 is an underwater light for ponds and fountains. Its nozzle kit supports a flow of up to\n"
    "1,000 litres per hour. The light draws 6 watts and is rated IP68. The lamp lasts about 20,000 hours."
)
CASES = [
    ("What is the maximum flow rate of the Zephyr X200?", "3,200 litres"),
    ("How often should the impeller be cleaned?", "three months"),
    ("How heavy is the pump?", "2.4 kilograms"),  # a paraphrase: "heavy" is nowhere, "weighs" is
    ("How long is the warranty?", "five years"),
    ("How much power does the pond light draw?", "6 watts"),
]


def node(text: str, node_id: str, score: float = 0.6, **kw: object) -> NodeWithScore:
    return NodeWithScore(doc_id=node_id, node_id=node_id, text=text, score=score, **kw)  # type: ignore[arg-type]


def evidence_for(embedder, query: str, nodes: list[NodeWithScore], limit: int = 3) -> Assessment:
    """What the chat service does, with the real embedder."""
    short = shortlist(query, candidates(nodes))
    vectors = asyncio.run(embedder.embed_documents([embed_text(short.found[i]) for i in short.to_embed]))
    query_vector = asyncio.run(embedder.embed_query(query))
    return assess(query_vector, short, vectors, limit)


@pytest.mark.parametrize(("question", "fact"), CASES)
def test_the_best_passage_holds_the_fact_and_is_the_sources_own_text(embedder, question: str, fact: str) -> None:
    nodes = [node(LIGHT, "light"), node(PUMP, "pump")]
    result = evidence_for(embedder, question, nodes)
    best = result.evidence[0]
    assert fact in best.text, [e.text for e in result.evidence]
    for e in result.evidence:
        source = nodes[e.source - 1]
        assert e.node_id == source.node_id
        assert source.text[e.start : e.end] == e.text
        assert 0.0 <= e.score <= 1.0
    assert [e.score for e in result.evidence] == sorted((e.score for e in result.evidence), reverse=True)


def test_passages_do_not_overlap_and_a_repeated_sentence_counts_once(embedder) -> None:
    # consecutive chunks share sentences (chunk_overlap): the first source keeps them
    first, second = node(PUMP[:300], "a"), node(PUMP[150:], "b")
    result = evidence_for(embedder, "What does the warranty of the Zephyr X200 cover?", [first, second], limit=5)
    spans = [(e.node_id, e.start, e.end) for e in result.evidence]
    for i, (n1, s1, e1) in enumerate(spans):
        for n2, s2, e2 in spans[i + 1 :]:
            assert n1 != n2 or e1 <= s2 or e2 <= s1, spans
    texts = [" ".join(c.text.split()) for c in candidates([first, second])]
    assert len(texts) == len(set(texts))


def test_wrapped_lines_are_one_sentence_and_structure_stays_lines() -> None:
    text = (
        "Installation\n============\n\nFlask supports Python 3.9\nand newer.\n\n"
        "* Werkzeug implements WSGI, the interface between\n  applications and servers.\n"
        "* Jinja is a template language that renders pages.\n\n"
        ".. _Werkzeug: https://palletsprojects.com/p/werkzeug/\n\n"
        "```\nx = 1 and the next\ny = 2 and the other\n```\n"
        "Warn if cookie headers are larger than this many bytes. Defaults to 4093."
    )
    read = reading_text(text)
    assert len(read) == len(text)
    found = [text[s:e] for s, e in passages(text)]
    assert "Flask supports Python 3.9\nand newer." in found  # wrapped prose, one sentence
    assert "Werkzeug implements WSGI, the interface between\n  applications and servers." in found[1]
    assert any(p.startswith("* Jinja") or p.startswith("Jinja") for p in found)  # the next item is its own
    assert not any("Installation" in p or "=====" in p or "palletsprojects" in p for p in found)  # markup
    assert "x = 1 and the next" in found and "y = 2 and the other" in found  # fenced lines stay lines
    # the short sentence that holds the fact joins the one that says what of
    assert "Warn if cookie headers are larger than this many bytes. Defaults to 4093." in found


def test_coverage_is_low_when_the_question_names_what_the_sources_never_mention() -> None:
    texts = [model_text(c.text) for c in candidates([node(PUMP, "pump"), node(LIGHT, "light")])]
    assert coverage("What is the maximum flow rate of the Zephyr X200?", texts) == 1.0
    assert coverage("How do I connect the Zephyr X200 to a solar panel?", texts) < 0.5
    assert coverage("What is it?", texts) == 1.0  # nothing asked about: nothing missing
    # words of how a question is asked are not what it asks about
    assert coverage("Explain when the warranty of the Zephyr X200 expires.", texts) < 1.0  # "expires" is absent
    assert coverage("Explain how long the warranty of the Zephyr X200 is.", texts) == 1.0


def test_the_shortlist_bounds_what_is_embedded() -> None:
    many = node(" ".join(f"Sentence {i} says the pump runs well in ponds." for i in range(500)), "n")
    found = candidates([many])
    assert len(found) == MAX_CANDIDATES
    short = shortlist("Does the pump run well?", found)
    assert len(short.windows) == SHORTLIST and len(short.to_embed) <= 2 * SHORTLIST
    with pytest.raises(ValueError):
        assess(np.ones(3, dtype=np.float32), short, np.zeros((1, 3), dtype=np.float32), 3)


def test_only_the_first_max_read_chars_of_the_sources_are_read() -> None:
    filler = "\n" * (MAX_READ_CHARS - 10)  # no passage in it, as long as the whole budget
    late = "The pump holds 40 litres of water in its tank."
    found = candidates([node(filler + late, "first"), node(PUMP, "second")])
    assert found == []  # the budget ends inside the first source's sentence; the second is never read
    found = candidates([node(late, "first"), node(PUMP, "second")])
    assert [c.source for c in found][:1] == [1] and {c.source for c in found} == {1, 2}


def test_a_directive_title_is_not_prose_but_an_admonition_text_is() -> None:
    text = (
        ".. admonition:: How to generate good secret keys\n\n"
        "    A secret key should be as random as possible.\n\n"
        ".. note:: Keep the secret key out of version control.\n\n"
        ".. code-block:: python\n\n    print('hello world and more')\n"
    )
    found = [text[s:e] for s, e in passages(text)]
    assert not any("How to generate" in p for p in found)  # a title restates questions, says nothing
    assert any(p.startswith("Keep the secret key out of version control.") for p in found)
    assert not any(p.startswith("python") for p in found)


@pytest.mark.parametrize(
    ("text", "joined"),
    [
        # reStructuredText: "::" and a code directive; Markdown: a fence
        ("Use the following command to make a key::\n\n    $ python -c 'x'\n", "$ python -c 'x'"),
        ("Install it with this command:\n\n.. code-block:: sh\n\n    $ pip install flask\n", "$ pip install flask"),
        ("Install it with this command:\n\n```sh\npip install flask\n```\n", "pip install flask"),
        # no colon: a code directive right below still belongs to the passage; its prompt lines follow
        (
            "To reset the drone:\n\n1. Hold the power button.\n2. Wait for amber.\n\n3. Press the key.\n",
            "3. Press the key.",
        ),
        ("Brew it like this:\n\n- Boil 300 ml of water.\n- Steep for four minutes.\n", "- Steep for four minutes."),
        (
            "Create a virtualenv, then install waitress.\n\n.. code-block:: text\n\n"
            "    $ python -m venv .venv\n    $ pip install waitress\n",
            "$ pip install waitress",
        ),
    ],
)
def test_what_a_passage_announces_joins_it(text: str, joined: str) -> None:
    found = [text[s:e] for s, e in passages(text)]
    assert len(found) == 1 and found[0].endswith(joined), found


def test_an_announcing_passage_never_joins_the_next_section_or_past_a_link_target() -> None:
    text = (
        "The options are these:\n\nNext section\n============\n\nThe next section says other things.\n\n"
        "Another passage that ends here:\n\n.. _target: https://example.com\n\n$ run a command here\n"
    )
    found = [text[s:e] for s, e in passages(text)]
    assert "The options are these:" in found and "The next section says other things." in found
    assert "Another passage that ends here:" in found


@pytest.mark.parametrize(
    ("question", "kinds"),
    [
        ("How many workers does gunicorn start?", (True, False)),
        ("On which port does the server listen?", (True, False)),
        ("How long does the warranty last?", (True, False)),
        ("How do I install Flask?", (False, True)),
        ("What are the steps to run my app with Waitress?", (False, True)),
        ("Why is the sky blue?", (False, False)),
        ("Does Flask support async views?", (False, False)),
    ],
)
def test_what_a_question_asks_for(question: str, kinds: tuple[bool, bool]) -> None:
    assert answer_kinds(question) == kinds


def test_a_passage_holds_a_number_or_a_way_to_do_something() -> None:
    number, how_to = (True, False), (False, True)
    assert holds_kind("It listens on port 8080.", number) and holds_kind("It covers two years.", number)
    assert not holds_kind("It listens on a port.", number)
    assert holds_kind("Run it:\n\n    $ flask run\n", how_to) and holds_kind("Call app.register_blueprint(bp).", how_to)
    # an inline literal alone is not a way to do something: reStructuredText marks every name so
    assert not holds_kind("The ``flask`` command is the way.", how_to)
    assert not holds_kind("8080", (False, False))


def test_a_passage_is_read_with_its_section_title() -> None:
    text = (
        "Configuration\n=============\n\n.. py:data:: PERMANENT_SESSION_LIFETIME\n\n"
        "    If the session is permanent, the cookie expires this many seconds in the future.\n\n"
        "    Default: ``timedelta(days=31)`` (``2678400`` seconds)\n\n"
        "# Deployment\n\nRun the application behind a proxy server.\n"
    )
    assert [t for _, t in section_titles(text)] == ["Configuration", "PERMANENT_SESSION_LIFETIME", "Deployment"]
    found = {c.text: c for c in candidates([node(text, "config")])}
    default = found["Default: ``timedelta(days=31)`` (``2678400`` seconds)"]
    assert default.title == "PERMANENT_SESSION_LIFETIME"
    assert embed_text(default).startswith("PERMANENT SESSION LIFETIME: Default:")
    assert found["Run the application behind a proxy server."].title == "Deployment"


def test_the_passage_with_the_value_is_chosen_for_a_question_about_a_setting(embedder) -> None:
    text = (
        ".. py:data:: PERMANENT_SESSION_LIFETIME\n\n"
        "    If ``session.permanent`` is true, the cookie's expiration will be set this\n"
        "    number of seconds in the future.\n\n"
        "    Default: ``timedelta(days=31)`` (``2678400`` seconds)\n\n"
        ".. py:data:: SESSION_REFRESH_EACH_REQUEST\n\n"
        "    Control whether the cookie is sent with every response when ``session.permanent`` is true.\n\n"
        "    Default: ``True``\n"
    )
    result = evidence_for(embedder, "How long does a permanent session last by default?", [node(text, "config")])
    assert "days=31" in result.evidence[0].text, [e.text for e in result.evidence]
    assert result.support <= max(e.score for e in result.evidence)  # the number's share is not support


@pytest.mark.parametrize(
    ("question", "named"),
    [
        ("How do I connect Flask to a PostgreSQL database?", ["Flask", "PostgreSQL"]),
        ("How do I enable CORS for my API?", ["CORS"]),  # API, URL, JSON: any technical text's words
        ("HOW DO I ENABLE CORS?", []),  # a question in capitals capitalises every word
        ("How Do I Connect To PostgreSQL?", ["PostgreSQL"]),  # Title Case: a capital inside still names
        ("Is there an Example in the Documentation?", []),  # words of how a question is asked
        ("Which Python versions are supported? I use Ubuntu.", ["Python"]),  # context is not the subject
        ("What is “Employee Handbook” about?", []),  # a quotation's first word
        ("How do I expose a gRPC service?", ["gRPC"]),
        ("Can I run Gunicorn on Windows?", ["Gunicorn", "Windows"]),
        ("Kubernetes: how do I deploy?", []),  # a sentence's first word is capitalised anyway
        ("What is ItsDangerous used for?", ["ItsDangerous"]),  # ... unless it has a capital inside
        ("how do i use postgres with flask", []),  # written in lower case: the coverage rule decides
        ("Which port does the development server listen on? On Windows?", ["Windows"]),
    ],
)
def test_the_names_a_question_gives(question: str, named: list[str]) -> None:
    assert names(question) == named


def test_coverage_weighs_an_absent_everyday_word_no_more_than_the_subject() -> None:
    texts = [model_text(c.text) for c in candidates([node(PUMP, "pump"), node(LIGHT, "light")])]
    # "switch" is in no text: it weighs as much as the rarest held term, not more
    assert coverage("How do I switch on the impeller cleaning of the Zephyr X200?", texts) > 0.7
    # "by default" qualifies, it does not name
    assert coverage("How long is the warranty of the Zephyr X200 by default?", texts) == 1.0
    assert coverage("Does the Zephyr X200 run on Kubernetes?", texts) < 1.0
    assert coverage("Kubernetes?", texts) == 0.0  # nothing the question names is held
    # contractions leave no words: "I'm" is not about "m"
    assert "m" not in terms("I'm sure it doesn't") and "doesn" not in terms("it doesn't")


def test_a_name_counts_as_missing_only_when_no_source_holds_it() -> None:
    texts = [model_text(c.text) for c in candidates([node(PUMP, "pump"), node(LIGHT, "light")])]
    assert missing_names("Can the Zephyr X200 run on a Tesla Powerwall?", texts) == ["Tesla", "Powerwall"]
    assert missing_names("Does the Lumen L5 fit the Zephyr X200?", texts) == []
    assert missing_names("What does the ZEPHYR x200 weigh?", texts) == []  # case aside


def test_a_question_naming_what_the_sources_do_not_mention_is_not_answered() -> None:
    nodes = [node("x", "a", score=0.6)]
    strong = Assessment([evidence(0.9)], 1.0, 0.9)
    assert answerable(nodes, strong, RULE)
    assert not answerable(nodes, Assessment([evidence(0.9)], 1.0, 0.9, ["PostgreSQL"]), RULE)
    # a source that holds every query term, or a strong match, is answered all the same
    assert answerable([node("x", "a", score=0.6, keyword_match=True)], Assessment([], 0.0, 0.0, ["X"]), RULE)
    assert answerable([node("x", "a", score=0.7)], Assessment([], 0.0, 0.0, ["X"]), RULE)


def test_a_prompt_reads_content_not_markup_lines() -> None:
    text = (
        "Use this::\n\n.. code-block:: python\n    :caption: ``config.py``\n\n    SECRET_KEY = 'x'\n\n"
        ".. note:: Keep it secret.\n```sh\npip install flask\n```\n.. _x: https://example.com\n"
        ":param x: a field list in prose stays\n"
    )
    assert prompt_text(text) == (
        "Use this::\n\n\n    SECRET_KEY = 'x'\n\nKeep it secret.\npip install flask\n"
        ":param x: a field list in prose stays"
    )
    assert prompt_text("plain\ntext") == "plain\ntext"


def evidence(score: float) -> Evidence:
    return Evidence(text="t", source=1, node_id="n", start=0, end=1, score=score)


RULE = AnswerabilityRule(enabled=True, score=0.7, coverage=0.7, evidence=0.65)


@pytest.mark.parametrize(
    ("best", "keyword", "cover", "support", "expected"),
    [
        (0.69, False, 0.69, 0.64, False),  # every signal just under its threshold
        (0.70, False, 0.69, 0.64, True),  # a strong source
        (0.69, True, 0.0, 0.0, True),  # a source holds every query term
        (0.69, False, 0.70, 0.64, True),  # the sources mention what the question asks about
        (0.69, False, 0.69, 0.65, True),  # a passage says what the question is about
        (0.9, False, 0.0, 0.0, True),
    ],
)
def test_the_answerability_rule_on_each_side_of_each_threshold(
    best: float, keyword: bool, cover: float, support: float, expected: bool
) -> None:
    nodes = [node("x", "a", score=best - 0.1), node("y", "b", score=best, keyword_match=keyword or None)]
    # the shown score may hold a share for what the question asks for (a number): the rule reads support only
    shown = [evidence(support + 0.2), evidence(support - 0.1)]
    assert answerable(nodes, Assessment(shown, cover, support), RULE) is expected


def test_the_rule_off_or_without_an_assessment_answers() -> None:
    weak = [node("x", "a", score=0.1)]
    nothing = Assessment([], 0.0)
    assert not answerable(weak, nothing, RULE)
    assert answerable(weak, nothing, AnswerabilityRule(enabled=False, score=0.7, coverage=0.7, evidence=0.65))
    assert answerable(weak, None, RULE)  # the embedder failed: nothing says the sources fall short


def test_the_not_covered_answer_lists_the_closest_sources() -> None:
    nodes = [node("x", f"n{i}", score=s, metadata={"title": f"T{i}"}) for i, s in enumerate([0.5, 0.6, 0.55, 0.52])]
    near = closest(nodes)
    assert [n.node_id for n in near] == ["n1", "n2", "n3"]
    text = not_covered_answer(near)
    assert text.splitlines() == [NOT_COVERED_ANSWER, "[1] T1 (n1)", "[2] T2 (n2)", "[3] T3 (n3)"]


# --- linear on 1 MB of the worst shapes ------------------------------------------------------------
MB = 1_000_000
SHAPES = [
    "\n",
    " \n",
    "a\n",  # wrapped lines of one paragraph: one endless sentence, cut in pieces
    "a b\n a\n",  # indentation going back and forth
    "- a\n",
    "====\n",
    "T\n==\n",
    ".. x:: y\n",
    "```\n",
    "a",  # no whitespace at all: cut every MAX_SENTENCE_CHARS
    "a ",
    "a. ",
    "one two three four. ",
    ":a:`",
    ":",
    "`",
    "e.g. ",
    "\x00",
    "\ud800",
]


def _every_step(text: str, query: str) -> float:
    """This thread's CPU seconds for every step a request runs over a source of ``text``, nothing
    of it remembered from an earlier call."""
    _forget_readings()
    t0 = time.thread_time()
    prompt_text(text)
    passages(text)
    short = shortlist(query, candidates([node(text, "big")]))
    vectors = np.zeros((len(short.to_embed), 4), dtype=np.float32)
    assess(np.ones(4, dtype=np.float32) / 2, short, vectors, 3)
    return time.thread_time() - t0


@pytest.mark.parametrize("unit", SHAPES, ids=ascii)
def test_every_step_is_linear_on_a_megabyte_of_each_shape(unit: str) -> None:
    """A megabyte costs about four times a quarter of one (a quadratic step: sixteen times), and
    a few seconds at most. The ratio holds whatever slows the process down alike (a loaded
    machine, coverage tracing in CI); the bound catches a step that is slow at every size. A pause
    that hits one measurement (a garbage collection of the worker's heap, page faults on a machine
    short of memory: 0.62 s once for a megabyte that takes 0.05) is not the step's: the best of two
    tries is what is compared; a quadratic step is slow in both."""
    query = ("pump " + unit) * 2000  # a long question of the same shape (its terms are read up to a bound)
    quarter = _every_step(unit * (MB // 4 // len(unit)), query)
    whole = _every_step(unit * (MB // len(unit)), query)
    if whole >= 8 * max(quarter, 0.05):
        quarter = min(quarter, _every_step(unit * (MB // 4 // len(unit)), query))
        whole = min(whole, _every_step(unit * (MB // len(unit)), query))
    assert whole < 15.0
    assert whole < 8 * max(quarter, 0.05), (quarter, whole)


def _forget_readings() -> None:
    """Empty the memos of what evidence read (terms, model text, sources)."""
    from ragserve.rag import evidence

    for memoised in (evidence.term_set, evidence.model_text, evidence._layout, evidence._reading):
        memoised.memo.clear()


def test_the_terms_of_a_window_are_remembered_and_a_longer_text_is_read_each_time(monkeypatch) -> None:
    from ragserve.rag import evidence

    _forget_readings()
    window = "The pumps on line 3 are serviced every 30 minutes; caching settings are configured."
    assert evidence.term_set(window) == frozenset(evidence.terms(window))
    assert evidence.term_set(window) is evidence.term_set(window)  # the same set: remembered
    long_text = "word " * (evidence.TEXT_MEMO_MAX_CHARS // 5 + 1)
    assert evidence.term_set(long_text) == frozenset(evidence.terms(long_text))
    assert len(evidence.term_set.memo) == 1 and window in evidence.term_set.memo  # only the window is kept
    marked = "Set :attr:`cache_size` to ``0`` ~ off."
    assert evidence.model_text(marked) == evidence.model_text(marked) and "`" not in evidence.model_text(marked)
    assert evidence.model_text.memo.hits >= 1
    # what term_overlap and coverage read from remembered terms is what reading every text afresh gives
    texts = [window, "Nothing about it here.", "Pumps are serviced weekly."]
    query = "How often are the pumps serviced?"
    for t in texts:
        evidence.term_set(t)
    remembered = (evidence.term_overlap(query, texts), evidence.coverage(query, texts))
    assert evidence.term_set.memo.hits >= len(texts)
    monkeypatch.setattr(evidence, "term_set", evidence.term_set.__wrapped__)  # no memo at all
    assert (evidence.term_overlap(query, texts), evidence.coverage(query, texts)) == remembered


def test_the_evidence_memos_are_bounded_by_what_they_hold() -> None:
    """Texts of the worst shape for a memo (each a window of distinct short words: the largest term
    sets) fill it to its bound in units, never past it."""
    from ragserve.rag import evidence

    _forget_readings()
    memo = evidence.term_set.memo
    size = evidence.TEXT_MEMO_MAX_CHARS
    for i in range(12_000):
        words = " ".join(f"w{i}x{j}" for j in range(size // 12))
        evidence.term_set(words[:size])
        assert memo.units <= memo.max_units
    assert memo.units > memo.max_units * 0.9 and len(memo) < 12_000
    _forget_readings()


def test_a_source_read_again_gives_the_same_candidates_from_its_remembered_reading() -> None:
    from ragserve.rag import evidence

    _forget_readings()
    text = (
        "Configuration\n=============\n\nSet PUMP_INTERVAL to 30 minutes. The night shift checks it.\n\n"
        "Run this:\n\n    $ pumpctl service --line 3\n\n# Deployment\n\nDeploy with the usual tool, twice a year."
    )
    nodes = [NodeWithScore(doc_id="d", node_id="n1", text=text, score=0.9)]
    first = evidence.candidates(nodes)
    again = evidence.candidates(nodes)
    assert again == first and evidence._reading.memo.hits == 1
    _forget_readings()
    assert evidence.candidates(nodes) == first  # read afresh: the same
    assert [text[p.start : p.end] for p in evidence._reading(text)] == [text[s:e] for s, e in evidence.passages(text)]
    huge = "A sentence about pumps and lines. " * (evidence.SOURCE_MEMO_MAX_CHARS // 30)
    evidence.candidates([NodeWithScore(doc_id="d", node_id="n2", text=huge, score=0.8)])
    assert len(evidence._reading.memo) == 1 and huge not in evidence._reading.memo  # larger than the bound


def test_what_a_source_reading_remembers_is_what_scoring_each_window_afresh_gives() -> None:
    """A shortlist scored from the readings remembered with the sources (terms, model text, kinds)
    equals the one scored from the windows' own texts (the same candidates without their
    remembered reading), for questions that ask for a number, for a way, and name things; a source
    longer than the memo's bound is read when scored, and alike."""
    from dataclasses import replace

    from ragserve.rag import evidence

    _forget_readings()
    config = (
        "Configuration\n=============\n\nSet PUMP_INTERVAL to 30 minutes. The night shift checks it on line 3.\n\n"
        "Run this to restart the pump:\n\n    $ pumpctl service --line 3\n\n# Deployment\n\n"
        "Deploy with the usual tool, twice a year. Call deploy() from the scheduler when it is quiet."
    )
    long_source = " ".join(
        f"Pump {i} on line {i % 7} runs every {i} minutes when the valve is open." for i in range(400)
    )
    assert len(long_source) > evidence.SOURCE_MEMO_MAX_CHARS
    nodes = [
        node(PUMP, "pump"),
        node(config, "config"),
        node(LIGHT, "light"),
        node(PUMP, "again"),
        node(long_source, "long"),
    ]
    questions = [
        ("How often is the pump serviced?", None),
        ("How do I restart the pump on line 3?", None),
        ("How many times a year do we deploy with Kubernetes?", "Does it run on Kubernetes?"),
        ("What is PUMP_INTERVAL?", None),
    ]
    for query, asked in questions:
        found = evidence.candidates(nodes)
        assert any(c.passage is not None and c.passage.alone is not None for c in found)
        assert any(c.passage is not None and c.passage.alone is None for c in found)  # the long source
        remembered = evidence.shortlist(query, found, asked=asked)
        afresh = evidence.shortlist(query, [replace(c, passage=None) for c in found], asked=asked)
        assert remembered == afresh
        # and each remembered reading is what the public definitions read of its window's text
        texts = [evidence.model_text(f"{c.title} {c.text}") for c in found]
        assert remembered.coverage == evidence.coverage(asked or query, texts)
        assert remembered.missing == evidence.missing_names(asked or query, texts)
        kinds = evidence.answer_kinds(query)
        assert remembered.typed == [evidence.holds_kind(w.text, kinds) for w in remembered.windows]
        windows = [evidence.model_text(f"{found[w.first].title} {w.text}") for w in remembered.windows]
        every = evidence.term_overlap(
            query,
            [
                evidence.model_text(f"{found[a].title} {evidence._window(found, a, b).text}")
                for a, b in evidence._window_spans(found)
            ],
        )
        assert sorted(remembered.overlap, reverse=True)[0] == max(every) and len(windows) == len(remembered.overlap)
    _forget_readings()


def test_a_source_mostly_read_before_is_not_read_whole() -> None:
    """A source whose passages an earlier source of the same request holds (a copy that differs in
    case or spacing) is read only where it is used: reading every passage of it would cost up to
    4x what the request scores (a hostile review's worst shape); the candidates are those read
    afresh either way."""
    from dataclasses import replace

    from ragserve.rag import evidence

    _forget_readings()
    original = " ".join(f"Pump {i} on line {i % 7} runs every {i} minutes." for i in range(40))
    copy = original.upper() + " The night shift checks pump 3 on line 3 twice."
    nodes = [node(original, "first"), node(copy, "copy")]
    found = evidence.candidates(nodes)
    assert original in evidence._reading.memo and copy not in evidence._reading.memo
    assert [c.text for c in found if c.node_id == "copy"] == ["The night shift checks pump 3 on line 3 twice."]
    query = "How often does pump 3 run on line 3?"
    assert evidence.shortlist(query, found) == evidence.shortlist(query, [replace(c, passage=None) for c in found])
    _forget_readings()
