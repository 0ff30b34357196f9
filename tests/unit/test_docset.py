"""The documentation set of the answer-quality check (benchmarks/docsets/flask) stays honest: every
expected fact is in the file its question names, in that file's own words, and every question the
set must not answer is answered by no file of it. Also the check's judging, on made-up answers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.doc_quality import (
    DOCSET,
    Question,
    Result,
    docset_files,
    holds,
    judge,
    load_questions,
    normalized,
    summary,
)
from ragserve.ingest.convert import file_kind

QUESTIONS = load_questions(DOCSET / "questions.json")
ANSWERABLE = [q for q in QUESTIONS if q.answerable]
UNANSWERABLE = [q for q in QUESTIONS if not q.answerable]


def test_the_set_is_a_coherent_subset_with_its_licence_and_provenance() -> None:
    files = docset_files(DOCSET)
    assert 30 <= len(files) <= 60
    assert all(file_kind(f) == "text" for f in files)  # what ragserve ingest and the upload route index
    assert "BSD" in (DOCSET / "LICENSE.txt").read_text() or "Redistribution" in (DOCSET / "LICENSE.txt").read_text()
    readme = (DOCSET / "README.md").read_text()
    assert "3.1.3" in readme and "pypi" in readme.lower()


def test_there_are_enough_questions_of_each_kind() -> None:
    assert len(ANSWERABLE) >= 12
    assert sum(q.kind == "steps" for q in ANSWERABLE) >= 3
    assert len(UNANSWERABLE) >= 4


@pytest.mark.parametrize("q", ANSWERABLE, ids=lambda q: q.id)
def test_every_expected_fact_is_in_the_file_it_names(q: Question) -> None:
    assert q.source in docset_files(DOCSET), f"{q.id}: {q.source} is not a document of the set"
    text = normalized((DOCSET / str(q.source)).read_text())
    assert q.quotes, f"{q.id}: quote the source"
    for quote in q.quotes:
        assert normalized(quote) in text, f"{q.id}: {quote!r} is not in {q.source}"
    for group in q.expect:  # each group's fact is said in the quoted words, so in the source
        assert any(holds(quote, group) for quote in q.quotes), f"{q.id}: no quote holds one of {group}"
    # the fact is not given away by the question itself
    assert not any(holds(q.question, group) for group in q.expect), f"{q.id}: the question holds its answer"


@pytest.mark.parametrize("q", UNANSWERABLE, ids=lambda q: q.id)
def test_a_not_covered_question_is_answered_by_no_file_of_the_set(q: Question) -> None:
    for rel in docset_files(DOCSET):
        text = normalized((DOCSET / rel).read_text())
        for word in q.absent:
            assert normalized(word) not in text, f"{q.id}: {rel} mentions {word!r}"


def test_a_malformed_question_is_refused_with_its_name(tmp_path: Path) -> None:
    bad = {"questions": [{"id": "x", "kind": "fact", "question": "Why?", "expect": [["a"]]}]}
    (tmp_path / "q.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=r"question 0 \(x\).*source"):
        load_questions(tmp_path / "q.json")
    bad["questions"][0]["kind"] = "opinion"
    (tmp_path / "q.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="kind must be"):
        load_questions(tmp_path / "q.json")


def test_judging_an_answer_a_source_list_and_evidence() -> None:
    waitress = next(q for q in QUESTIONS if q.id == "waitress-run")  # two groups: install and run
    port = next(q for q in QUESTIONS if q.id == "waitress-port")
    k8s = next(q for q in QUESTIONS if q.id == "kubernetes")
    results = [
        Result(
            "waitress-run",
            "steps",
            waitress.question,
            answer="1. Run `pip  install\nWaitress`.\n2. Run `waitress-serve hello:app`.",
            sources=["deploying/gunicorn.rst", "docs/deploying/waitress.rst"],
            evidence=None,
        ),
        Result(
            "waitress-port",
            "fact",
            port.question,
            answer="It listens on port 8000.",  # wrong
            sources=["a.rst", "b.rst", "c.rst", "deploying/waitress.rst"],  # right source only 4th
            evidence=["Serving on http://127.0.0.1:8080"],
        ),
        Result("kubernetes", "not_covered", k8s.question, answer="Use kubectl."),
    ]
    judge(results, {q.id: q for q in QUESTIONS})
    run, wrong, k = results
    assert run.correct and run.source_top3 and run.evidence_has_fact is None  # n/a: no evidence sent
    assert not wrong.correct and not wrong.source_top3 and wrong.evidence_has_fact
    assert k.correct is None and k.not_covered is None  # the server reports no answerability: n/a
    s = summary(results)
    assert s["correct"] == {"yes": 1, "of": 2} and s["evidence_has_fact"] == {"yes": 1, "of": 2}
    assert s["not_covered_handled"] is None


def test_not_covered_is_told_once_the_server_reports_answerability() -> None:
    k8s = next(q for q in QUESTIONS if q.id == "kubernetes")
    port = next(q for q in QUESTIONS if q.id == "waitress-port")
    results = [
        Result("kubernetes", "not_covered", k8s.question, answer="The documents do not say.", answerable=False),
        Result("waitress-port", "fact", port.question, answer="8080", answerable=True),
    ]
    judge(results, {q.id: q for q in QUESTIONS})
    assert results[0].not_covered is True and results[1].not_covered is False
    s = summary(results)
    assert s["not_covered_handled"] == {"yes": 1, "of": 1} and s["wrongly_not_covered"] == {"yes": 0, "of": 1}
    # by header alone, too
    results = [Result("kubernetes", "not_covered", k8s.question, reason="not_covered")]
    judge(results, {q.id: q for q in QUESTIONS})
    assert results[0].not_covered is True


def test_an_answer_that_echoes_the_prompt_is_not_correct() -> None:
    port = next(q for q in QUESTIONS if q.id == "waitress-port")
    results = [Result("waitress-port", "fact", port.question, answer="Question: port? Answer: 8080")]
    judge(results, {port.id: port})
    assert results[0].correct is False


def test_parts_of_a_run_are_reported_together_in_question_order(tmp_path: Path) -> None:
    from dataclasses import asdict

    from benchmarks.doc_quality import combined

    setup = {"machine": "m", "server": "s", "model": "gemma", "top_k": None, "max_tokens": 64, "docs": "d"}
    port = next(q for q in QUESTIONS if q.id == "waitress-port")
    dev = next(q for q in QUESTIONS if q.id == "dev-port")
    late = Result(port.id, port.kind, port.question, answer="8080", seconds=2.0, sources=["deploying/waitress.rst"])
    early = Result(dev.id, dev.kind, dev.question, answer="5000", seconds=4.0, sources=["quickstart.rst"])
    for name, r in (("a.json", late), ("b.json", early)):
        (tmp_path / name).write_text(json.dumps({**setup, "index": {}, "wall_s": 1.0, "results": [asdict(r)]}))
    out = combined([str(tmp_path / "a.json"), str(tmp_path / "b.json")], QUESTIONS)
    assert [r["id"] for r in out["results"]] == ["dev-port", "waitress-port"]  # as in questions.json
    assert out["summary"]["correct"] == {"yes": 2, "of": 2} and out["summary"]["max_s"] == 4.0
    (tmp_path / "c.json").write_text(json.dumps({**setup, "top_k": 5, "index": {}, "results": []}))
    with pytest.raises(SystemExit, match="differ"):
        combined([str(tmp_path / "a.json"), str(tmp_path / "c.json")], QUESTIONS)


def test_the_sets_retrieval_questions_export_as_a_beir_collection(tmp_path: Path) -> None:
    from benchmarks.docset_beir import export
    from ragserve.cli.beir import Dataset

    n = export(DOCSET, tmp_path)
    data = Dataset.load(tmp_path)
    assert n == len(data.queries) >= 30 and len(data.corpus) == len(docset_files(DOCSET))
    assert all(set(rels) <= set(data.corpus) for rels in data.qrels.values())
    bad = tmp_path / "bad"
    (bad / "x").mkdir(parents=True)
    (bad / "x" / "a.rst").write_text("A.")
    (bad / "questions.json").write_text(json.dumps({"questions": [{"question": "Q?", "source": "x/b.rst"}]}))
    with pytest.raises(ValueError, match=r"x/b\.rst"):
        export(bad, tmp_path / "out")


def test_the_follow_up_cases_name_files_of_the_set_and_every_kind() -> None:
    from benchmarks.followups import KINDS, load_cases

    cases = load_cases()
    files = set(docset_files(DOCSET))
    assert 15 <= len(cases) <= 30
    for c in cases:
        assert set(c.source) <= files and (c.previous is None or c.previous in files), c.id
        assert c.previous not in c.source, c.id
    assert {c.kind for c in cases} == set(KINDS)
    assert sum(c.kind == "switch" for c in cases) >= 4


def test_a_malformed_follow_up_case_is_refused_with_its_name(tmp_path: Path) -> None:
    from benchmarks.followups import load_cases

    bad = {"cases": [{"id": "x", "kind": "reference", "turns": ["Only one turn"], "source": ["cli.rst"]}]}
    (tmp_path / "f.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=r"case 0 \(x\)"):
        load_cases(tmp_path / "f.json")
