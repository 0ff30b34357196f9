"""Follow-ups on real documents (issue 24): the multi-turn cases of the Flask documentation set
(benchmarks/docsets/flask/followups.json), each asked as a client sends it, through chat on the
application in this process (real shards, MiniLM, Settings' chunking; a fake upstream model). A
turn that refers back ("How do I set it up?", "And on Windows?") finds the file that answers it
among the first three sources; a turn with a new subject is retrieved alone, and the earlier
topic's file does not rank above the new one. Indexing the set takes about a minute on 2 cores:
slow-marked (``make test`` runs it; python -m benchmarks.followups prints the same cases' table)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from benchmarks.followups import Case, ask, flask_app, load_cases

pytestmark = pytest.mark.slow

CASES = load_cases()


@pytest.fixture(scope="module")
def http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with flask_app(Path(tmp_path_factory.mktemp("flask"))) as client:
        yield client


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_a_follow_up_finds_what_answers_it_and_a_new_topic_leaves_the_old_one(http: Any, case: Case) -> None:
    asked = ask(http, case.messages())
    rank = asked.rank(case.source)
    assert asked.mode == "rag", asked
    assert rank is not None and rank <= 3, (case.source, asked.query, asked.sources[:5])
    if case.kind == "switch":
        assert asked.query_source == "message" and asked.query == case.turns[-1]  # nothing of the old topic
        old = asked.rank([case.previous or ""])
        assert old is None or old > rank, (case.previous, asked.sources[:5])
    else:
        assert asked.query_source == "followup" and asked.query is not None
        assert asked.query.startswith(case.turns[-1])  # the newest turn's own words lead
