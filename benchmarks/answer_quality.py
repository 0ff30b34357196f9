#!/usr/bin/env python3
"""What the embedded default can answer: single-fact questions over their source, through
``/v1/chat/completions`` with RAG, on the real packaged Gemma 3 270M (the transformers engine).

    python -m benchmarks.answer_quality [--url http://127.0.0.1:8000] [--no-baseline] [--no-steps] [--json out.json]

Eight short documents, each with one distinctive made-up fact (so the model cannot know it without
the source), are indexed; each question is asked once, greedy. An answer is correct when it
contains its fact's key (case-insensitive; the wording may vary) and echoes nothing of the prompt
(instructions, labels, the sources block). Prints each answer with its time, the share correct and
the median time per answer. The baseline, measured in the same run, is the same model prompted with
its chat turns (``prompt_format: chat``), which is how it was prompted before the completion format.

Then the multi-line set (``STEPS``, in its own index ``quality_steps``): made-up procedures and
lists, asked as "How do I …" / "What are the steps …" / "List …"; an answer is complete when it
contains every step's key and echoes nothing (``--no-steps`` skips it).

Without ``--url`` the application runs in this process (real shards, embedder and engine, no Ray);
with it, the questions go to a running server (``make run``), whose index ``quality_check`` is
replaced (and ``quality_steps``). The answer-quality test (tests/integration/test_answer_quality.py)
asks the same sets.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common import machine, table, write_json
from ragserve.rag.prompt import CONTEXT_INSTRUCTIONS, SOURCES_HEADING

REPO = Path(__file__).resolve().parents[1]
INDEX = "quality_check"


@dataclass(frozen=True)
class Fact:
    document: str
    question: str
    key: str  # the answer contains this (case-insensitive) when it is right


FACTS: tuple[Fact, ...] = (
    Fact(
        "The Lumen Valley observatory was built in 1987 on the slopes of Mount Arrel.",
        "When was the Lumen Valley observatory built?",
        "1987",
    ),
    Fact(
        "Zorvath is the capital city of the island nation of Pellumia.", "What is the capital of Pellumia?", "Zorvath"
    ),
    Fact(
        "The Kestrel-9 delivery drone has a top speed of 140 kilometres per hour.",
        "What is the top speed of the Kestrel-9 drone?",
        "140",
    ),
    Fact(
        "The Bright Harbor bakery chain was founded by Marta Okonkwo in Lisbon.",
        "Who founded the Bright Harbor bakery chain?",
        "Okonkwo",
    ),
    Fact(
        "The Tessaly river is 412 kilometres long and flows into the Amber Sea.",
        "How long is the Tessaly river?",
        "412",
    ),
    Fact(
        "The mascot of the Redwood Falls hockey team is a blue heron.",
        "What is the mascot of the Redwood Falls hockey team?",
        "heron",
    ),
    Fact(
        "Project Nimbus keeps its nightly backups in a data centre in Reykjavik.",
        "Where does Project Nimbus keep its backups?",
        "Reykjavik",
    ),
    Fact(
        "The Quillon 3 smartphone has a 5200 mAh battery.",
        "How large is the battery of the Quillon 3 smartphone?",
        "5200",
    ),
)


@dataclass(frozen=True)
class Steps:
    document: str
    question: str
    keys: tuple[str, ...]  # a complete answer contains each (case-insensitive): one a step or item


STEPS_INDEX = "quality_steps"
STEPS: tuple[Steps, ...] = (
    Steps(
        "Resetting the Kestrel-9 drone\n\nTo reset the Kestrel-9 drone:\n\n"
        "1. Hold the power button for ten seconds.\n"
        "2. Wait until the status light blinks amber.\n"
        "3. Press the pairing key twice.\n"
        "4. Reconnect the drone in the Kestrel app.",
        "How do I reset the Kestrel-9 drone?",
        ("power button", "amber", "pairing key", "reconnect"),
    ),
    Steps(
        "Brewing Lumen tea\n\n"
        "- Boil 300 ml of water.\n"
        "- Add two spoons of lumen leaves.\n"
        "- Steep for four minutes.\n"
        "- Strain the tea and serve it with honey.",
        "What are the steps to brew Lumen tea?",
        ("boil", "two spoons", "four minutes", "honey"),
    ),
    Steps(
        "Installing the Nimbus client\n\n"
        "First download the installer from the Nimbus portal. Then run nimbus-setup with the --user flag. "
        "Finally sign in with your Nimbus account.",
        "How do I install the Nimbus client?",
        ("download", "nimbus-setup", "sign in"),
    ),
    Steps(
        "The Quillon 3 smartphone comes in four colours: graphite, coral, seafoam and ivory.",
        "List the colours of the Quillon 3 smartphone.",
        ("graphite", "coral", "seafoam", "ivory"),
    ),
)


#: Text that belongs to the prompt, never to an answer.
ECHO_MARKERS: tuple[str, ...] = (
    CONTEXT_INSTRUCTIONS.split(". ")[0],
    SOURCES_HEADING,
    "Question:",
    "Answer:",
    "User:",
    "Assistant:",
    "[1] (",
    "<start_of_turn>",
)


def echoes_prompt(answer: str) -> bool:
    """Whether ``answer`` repeats part of the prompt (instructions, the sources block, a label)."""
    return any(marker.lower() in answer.lower() for marker in ECHO_MARKERS)


#: A TestClient or an httpx.Client with the server's base URL (both post and delete alike).
Client = httpx.Client


@dataclass
class Answer:
    fact: Fact
    text: str
    seconds: float
    finish_reason: str
    mode: str
    sources: list[str]

    @property
    def correct(self) -> bool:
        return self.fact.key.lower() in self.text.lower() and not echoes_prompt(self.text)


@dataclass
class StepsAnswer:
    steps: Steps
    text: str
    seconds: float
    finish_reason: str

    @property
    def found(self) -> int:
        """How many of the steps' keys the answer contains."""
        return sum(k.lower() in self.text.lower() for k in self.steps.keys)

    @property
    def complete(self) -> bool:
        return self.found == len(self.steps.keys) and not echoes_prompt(self.text)


def _replace_index(client: Client, index: str, documents: list[str], title: str) -> None:
    client.delete(f"/indexes/{index}")  # 404 when there is none yet
    docs = [{"text": d, "metadata": {"title": f"{title}-{i}"}} for i, d in enumerate(documents)]
    r = client.post("/index", json={"index_name": index, "documents": docs})
    r.raise_for_status()


def index_facts(client: Client, index: str = INDEX) -> None:
    """Index the set (one document a fact), replacing an index of that name."""
    _replace_index(client, index, [f.document for f in FACTS], "fact")


def index_steps(client: Client, index: str = STEPS_INDEX) -> None:
    """Index the multi-line set (one document a procedure or list), replacing an index of that name."""
    _replace_index(client, index, [s.document for s in STEPS], "steps")


def ask_steps(client: Client, index: str = STEPS_INDEX, max_tokens: int = 160) -> list[StepsAnswer]:
    answers = []
    for steps in STEPS:
        body, _, seconds = ask(client, steps.question, index, max_tokens=max_tokens)
        choice = body["choices"][0]
        answers.append(StepsAnswer(steps, choice["message"]["content"] or "", seconds, choice["finish_reason"]))
    return answers


def ask(
    client: Client, question: str, index: str | None = INDEX, max_tokens: int = 64
) -> tuple[dict[str, Any], str, float]:
    """One chat completion; returns (body, X-RAG-Mode, seconds)."""
    body: dict[str, Any] = {"messages": [{"role": "user", "content": question}], "max_tokens": max_tokens}
    if index:
        body["index_name"] = index
    t0 = time.perf_counter()
    r = client.post("/v1/chat/completions", json=body)
    seconds = time.perf_counter() - t0
    r.raise_for_status()
    return r.json(), r.headers.get("x-rag-mode", ""), seconds


def ask_facts(client: Client, index: str = INDEX) -> list[Answer]:
    answers = []
    for fact in FACTS:
        body, mode, seconds = ask(client, fact.question, index)
        choice = body["choices"][0]
        answers.append(
            Answer(
                fact,
                choice["message"]["content"] or "",
                seconds,
                choice["finish_reason"],
                mode,
                [n["text"] for n in body.get("source_nodes") or []],
            )
        )
    return answers


def summary(answers: list[Answer]) -> dict[str, Any]:
    return {
        "correct": sum(a.correct for a in answers),
        "asked": len(answers),
        "echoing": sum(echoes_prompt(a.text) for a in answers),
        "median_s": statistics.median(a.seconds for a in answers),
        "max_s": max(a.seconds for a in answers),
    }


@contextmanager
def inprocess_client(prompt_format: str, model_cache: Path) -> Iterator[Any]:
    """The application in this process on the real embedded engine, through a TestClient."""
    from fastapi.testclient import TestClient

    from ragserve.models.embeddings import LocalEmbeddingModel
    from ragserve.models.transformers_engine import TransformersEngine
    from ragserve.testing.embedder import InProcessEmbedder
    from ragserve.testing.inprocess import inprocess_app

    engine = TransformersEngine(None, model_cache, prompt_format=prompt_format)  # type: ignore[arg-type]
    asyncio.run(engine.start())
    embedder = InProcessEmbedder(LocalEmbeddingModel(None, device="cpu"))
    try:
        with (
            tempfile.TemporaryDirectory() as storage,
            inprocess_app(Path(storage), embedder, "http://unused.invalid", engine=engine) as (app, _),
            TestClient(app) as client,
        ):
            yield client
    finally:
        asyncio.run(engine.stop())


def run(client: Client) -> list[Answer]:
    index_facts(client)
    ask(client, FACTS[0].question)  # warm-up: the first generation pays one-off costs
    return ask_facts(client)


def run_steps(client: Client) -> list[StepsAnswer]:
    index_steps(client)
    return ask_steps(client)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running ragserve (default: the application in this process)")
    parser.add_argument(
        "--model-cache",
        type=Path,
        default=REPO / "data" / "test-cache" / "models",
        help="where the converted Gemma is cached (in-process only)",
    )
    parser.add_argument("--no-baseline", action="store_true", help="skip the chat-format baseline")
    parser.add_argument("--no-steps", action="store_true", help="skip the multi-line set")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()

    runs: dict[str, list[Answer]] = {}
    steps: list[StepsAnswer] = []
    if args.url:
        with httpx.Client(base_url=args.url, timeout=300) as client:
            runs["server"] = run(client)
            steps = [] if args.no_steps else run_steps(client)
    else:
        formats = ["auto"] if args.no_baseline else ["auto", "chat"]
        for fmt in formats:
            with inprocess_client(fmt, args.model_cache) as client:
                runs["completion (default)" if fmt == "auto" else "chat turns (baseline)"] = run(client)
                if fmt == "auto" and not args.no_steps:
                    steps = run_steps(client)

    print(f"machine: {machine()}\n")
    for name, answers in runs.items():
        print(f"## {name}\n")
        print(
            table(
                ["question", "answer", "correct", "s"],
                [[a.fact.question, repr(a.text[:80]), "yes" if a.correct else "no", a.seconds] for a in answers],
            )
        )
        print()
    print(
        table(
            ["prompt", "correct", "echoing", "median s", "max s"],
            [
                [name, f"{s['correct']}/{s['asked']}", s["echoing"], s["median_s"], s["max_s"]]
                for name, s in ((n, summary(a)) for n, a in runs.items())
            ],
        )
    )
    figures: dict[str, Any] = {"machine": machine(), "runs": {n: summary(a) for n, a in runs.items()}}
    if steps:
        print("\n## multi-line: steps and lists\n")
        print(
            table(
                ["question", "answer", "keys", "complete", "s"],
                [
                    [a.steps.question, repr(a.text[:160]), f"{a.found}/{len(a.steps.keys)}", a.complete, a.seconds]
                    for a in steps
                ],
            )
        )
        figures["steps"] = {
            "complete": sum(a.complete for a in steps),
            "asked": len(steps),
            "keys_found": sum(a.found for a in steps),
            "keys": sum(len(a.steps.keys) for a in steps),
            "echoing": sum(echoes_prompt(a.text) for a in steps),
            "median_s": statistics.median(a.seconds for a in steps),
        }
        print(f"\n{figures['steps']}")
    write_json(args.json, figures)


if __name__ == "__main__":
    main()
