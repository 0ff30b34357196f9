"""What the tests, benchmarks and load tests share: nothing in the server imports it.

- ``contracts/``: the contract suites every implementation of a seam runs (``GenerationEngine``,
  ``ShardPool``); these import pytest.
- ``fake_openai``: a fake OpenAI-compatible upstream on a real socket, for the LLM we cannot run here.
- ``inprocess``: the HTTP application built in this process from its real parts, with no Ray.
- ``live``: an application served on a loopback port by uvicorn in a thread (``serve``).
- ``embedder``: ``InProcessEmbedder``, the embedding seam over the real local model in this process.

It is the top floor of the package (tests/unit/test_layers.py): it may import any part of ragserve,
and no part of ragserve may import it. It lives in the package rather than in tests/ so that
benchmarks/ and load_tests/ never import from tests/ (tests/unit/test_testing_package.py), and the
modules they import (all but ``contracts``) import no pytest at module level: a benchmark does not
need pytest.
"""
