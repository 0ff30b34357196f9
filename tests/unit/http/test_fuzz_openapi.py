"""Schemathesis against the application's own OpenAPI schema: generated requests for every
operation (valid and invalid) must never get a 5xx. The app is the in-process one (real shards,
chunker and MiniLM embedder; a fake upstream LLM)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from ragserve.testing.fake_openai import FakeOpenAI
from ragserve.testing.inprocess import inprocess_app

MIN_CASES = 500
seen: Counter[str] = Counter()
server_errors: list[str] = []


@pytest.fixture(scope="module")
def fuzz_app(tmp_path_factory, embedding_model) -> Iterator:
    from ragserve.testing.embedder import InProcessEmbedder

    embedder = InProcessEmbedder(embedding_model)
    with (
        FakeOpenAI(answer="ok [1]", model="fake-model", max_model_len=4096) as fake,
        inprocess_app(
            tmp_path_factory.mktemp("fuzz"),
            embedder,
            fake.url,
            llm_timeout_s=10,
            max_document_chars=20_000,
            similarity_threshold=0.0,
        ) as (app, _),
    ):
        with TestClient(app) as client:  # an index to hit, so RAG and listing paths run too
            client.post(
                "/index",
                json={
                    "index_name": "kb",
                    "documents": [
                        {"text": "KAITO is a Kubernetes operator for AI inference.", "metadata": {"topic": "kaito"}}
                    ],
                },
            )
        yield app


OPERATIONS = 45  # routes in the schema; a new route must be fuzzed too (+3: stats, ui/config, files; +5: /v1/files;
# +16: /v1/vector_stores; +4: /jobs; +1: one document by id; +1: /usage. /mcp is not in the schema: tests/unit/agent)


def fuzz_operation(op, mode: GenerationMode, examples: int) -> None:
    """Hypothesis drives the operation's strategy; every generated case is sent to the app."""

    @given(case=op.as_strategy(generation_mode=mode))
    @settings(
        max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True, database=None
    )
    def run(case) -> None:
        response = case.call()
        seen[f"{case.method} {case.path}"] += 1
        if response.status_code >= 500:
            server_errors.append(
                f"{case.method} {case.formatted_path} -> {response.status_code}: {response.text[:300]}"
            )

    try:
        run()
    except Unsatisfiable:  # an operation with no inputs has no invalid request to generate
        assert mode is GenerationMode.NEGATIVE


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_generated_requests_never_get_a_5xx(fuzz_app, mode: GenerationMode) -> None:
    schema = schemathesis.openapi.from_asgi("/openapi.json", fuzz_app)
    ops = [result.ok() for result in schema.get_all_operations()]
    assert len(ops) == OPERATIONS, sorted(f"{op.method} {op.path}" for op in ops)
    for op in ops:
        fuzz_operation(op, mode, examples=40)
    assert server_errors == [], "\n".join(server_errors[:10])


def test_zz_enough_cases() -> None:
    total = sum(seen.values())
    print(f"\nfuzz: {total} cases over {len(seen)} operations, {len(server_errors)} 5xx")
    assert total >= MIN_CASES, seen
    assert server_errors == []
