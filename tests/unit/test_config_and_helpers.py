"""Settings contract (docs/architecture.md §3), routing, path confinement and the query-embedding cache."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from ragserve.config import Settings
from ragserve.service.cache import TTLCache, normalise_query
from ragserve.service.routing import group_by_shard, shard_for
from ragserve.service.snapshots import PathOutsideStorageError, confine


def test_defaults_are_the_embedded_setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    s = Settings()
    assert (s.llm_engine, s.num_shards, s.similarity_threshold, s.context_token_ratio) == ("transformers", 2, 0.35, 0.5)
    assert s.llm_model is None and s.embedding_model is None and s.api_keys is None
    assert s.storage_dir == str(tmp_path / "data")  # resolved where the config is read


def test_environment_wins_over_config_args(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGSERVE_NUM_SHARDS", "4")
    monkeypatch.setenv("RAGSERVE_API_KEYS", '["k1","k2"]')
    monkeypatch.setenv("RAGSERVE_LLM_ENGINE_ARGS", '{"max_model_len": 4096}')
    s = Settings(num_shards=2, similarity_threshold=0.3)
    assert s.num_shards == 4 and [k.get_secret_value() for k in s.api_keys or []] == ["k1", "k2"]
    assert "k1" not in repr(s)  # secrets never reach a log line
    assert s.llm_engine_args == {"max_model_len": 4096}
    assert s.similarity_threshold == 0.3


@pytest.mark.parametrize(
    "args",
    [
        {"llm_engine": "openai"},  # needs llm_url
        {"llm_engine": "llama.cpp"},
        {"context_token_ratio": 0.9},
        {"chunk_size": 64, "chunk_overlap": 64},
        {"num_shards": 0},
        {"api_keys": [""]},
        {"unknown_field": 1},
    ],
)
def test_invalid_settings_are_rejected(args: dict) -> None:
    with pytest.raises(ValidationError):
        Settings(**args)


def test_a_key_given_twice_is_refused_without_showing_it() -> None:
    # one secret under two scopes would be checked as whichever came last
    reader = {"key": "sk-same-secret", "indexes": ["kb"], "role": "read"}
    for keys in (["sk-same-secret", reader], [reader, {**reader, "role": "admin"}], ["a", "b", "a"]):
        with pytest.raises(ValidationError) as caught:
            Settings(api_keys=keys)
        assert "repeat" in str(caught.value) and "sk-same-secret" not in str(caught.value)
    assert len(Settings(api_keys=["a", {"key": "b", "indexes": ["kb"]}]).api_keys or []) == 2


def test_shard_routing_is_stable_and_balanced() -> None:
    assert shard_for("doc-1", 4) == shard_for("doc-1", 4)
    assert shard_for("anything", 1) == 0
    counts = [0] * 4
    for i in range(4000):
        counts[shard_for(f"doc-{i}", 4)] += 1
    assert min(counts) > 800
    groups = group_by_shard([f"d{i}" for i in range(10)], lambda x: x, 3)
    assert sorted(x for g in groups.values() for x in g) == sorted(f"d{i}" for i in range(10))
    with pytest.raises(ValueError):
        shard_for("x", 0)


@pytest.mark.parametrize("bad", ["../x", "/etc/passwd", "%2e%2e/x", "%252e%252e%252fx", "a/../../x", ".", "a\x00b"])
def test_paths_outside_storage_are_refused(tmp_path: Path, bad: str) -> None:
    with pytest.raises(PathOutsideStorageError):
        confine(tmp_path, bad, default="snapshots/x")


def test_symlink_escape_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "link").symlink_to(tmp_path)
    with pytest.raises(PathOutsideStorageError):
        confine(root, "link/elsewhere", default="x")
    assert confine(root, "a/b", default="x") == (root / "a" / "b").resolve()
    assert confine(root, None, default="snapshots/kb") == (root / "snapshots" / "kb").resolve()


def test_ttl_cache_lru_and_expiry() -> None:
    now = [0.0]
    cache: TTLCache[int] = TTLCache(max_entries=2, ttl_s=10, clock=lambda: now[0])
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # a is now most recently used
    cache.put("c", 3)  # evicts b
    assert cache.get("b") is None and cache.get("c") == 3
    now[0] = 11
    assert cache.get("a") is None  # expired
    assert (cache.hits, cache.misses) == (2, 2)
    assert normalise_query("  What IS   RAG?\n") == "what is rag?"
    empty: TTLCache[int] = TTLCache(max_entries=0, ttl_s=1)
    empty.put("x", 1)
    assert empty.get("x") is None and len(empty) == 0


async def test_ttl_cache_get_or_compute_computes_once() -> None:
    cache: TTLCache[int] = TTLCache(max_entries=4, ttl_s=10)
    calls: list[str] = []

    async def compute() -> int:
        calls.append("x")
        return 7

    assert await cache.get_or_compute("k", compute) == (7, False)
    assert await cache.get_or_compute("k", compute) == (7, True)
    assert calls == ["x"] and (cache.hits, cache.misses) == (1, 1)


def test_errors_survive_pickling_across_processes() -> None:
    import pickle

    from ragserve.errors import EngineError, NotFoundError, ServiceError
    from ragserve.rag.fit import PromptTooLongError

    e = pickle.loads(pickle.dumps(EngineError(503, "loading", type_="server_error", body={"a": 1})))
    assert isinstance(e, EngineError) and isinstance(e, ServiceError)
    assert (e.status, e.message, e.type, e.body) == (503, "loading", "server_error", {"a": 1})
    n = pickle.loads(pickle.dumps(NotFoundError("gone", param="index_name")))
    assert (n.status, n.message, n.param, str(n)) == (404, "gone", "index_name", "gone")
    p = pickle.loads(pickle.dumps(PromptTooLongError(900, 16, 512)))
    assert isinstance(p, PromptTooLongError) and (p.status, p.code, p.prompt_tokens) == (
        400,
        "context_length_exceeded",
        900,
    )


def test_a_remote_llm_runs_in_the_ingress_by_default_and_only_a_remote_one() -> None:
    from ragserve.config import Settings

    assert Settings(llm_engine="openai", llm_url="http://x/v1").llm_in_ingress is True
    assert Settings(llm_engine="openai", llm_url="http://x/v1", llm_in_ingress=False).llm_in_ingress is False
    assert Settings().llm_in_ingress is False
    with pytest.raises(ValueError, match="llm_in_ingress is for the remote 'openai' engine"):
        Settings(llm_engine="transformers", llm_in_ingress=True)
