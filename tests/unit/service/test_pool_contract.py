"""The shard-pool contract on the in-process pool; how the Ray pool names a method to its actors."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from ragserve.service.pool import LocalShardPool
from ragserve.service.shard_service import ShardService, check_layout
from ragserve.store.types import SearchHit
from ragserve.testing.contracts.shard_pool import ShardPoolContract


class TestLocalShardPool(ShardPoolContract):
    @pytest.fixture
    def pool(self, tmp_path: Path) -> Iterator[LocalShardPool]:
        check_layout(tmp_path, 2)
        pool = LocalShardPool([ShardService(tmp_path, i, 2) for i in range(2)])
        yield pool
        pool.close()


class _Method:
    """A fake actor method: records what ``.remote`` was given."""

    def __init__(self, name: str, calls: list[tuple[str, tuple, dict]]):
        self.name, self.calls = name, calls

    async def remote(self, *args, **kwargs):
        self.calls.append((self.name, args, kwargs))
        return self.name


class _FakeActor:
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple, dict]] = []

    def __getattr__(self, name: str) -> _Method:
        return _Method(name, self.calls)


async def test_the_ray_pool_sends_the_method_name_and_the_keywords_to_the_actor() -> None:
    from ragserve.deployments.vector_index import RayShardPool

    actors = [_FakeActor(), _FakeActor()]
    pool = RayShardPool(actors)
    assert await pool.call(1, ShardService.drop_index, index="kb", generation=3) == "drop_index"
    assert actors[1].calls == [("drop_index", (), {"index": "kb", "generation": 3})] and actors[0].calls == []
    assert await pool.call_all(ShardService.ping) == ["ping", "ping"]


async def test_the_ray_pool_refuses_what_is_not_a_shard_method() -> None:
    from ragserve.deployments.vector_index import RayShardPool

    class Other:
        def ping(self) -> int:
            return 0

    def ping(shard: ShardService) -> int:
        return 0

    pool = RayShardPool([_FakeActor()])
    for method in (Other.ping, ping, ShardService.__init__):
        with pytest.raises(TypeError, match="not a ShardService method"):
            await pool.call(0, method)


def test_a_shard_says_which_code_serves_it(tmp_path: Path) -> None:
    """``reconcile_shards`` keeps a shard actor only when it answers what this deployment would
    open: the same vector options and the same serving class. An actor left running by an older
    package (``app.service.shard_service.ShardService``, whose replies name types this code cannot
    unpickle) answers without ``code`` or with another, and is replaced."""
    from ragserve.config import Settings
    from ragserve.deployments.vector_index import shard_open_options
    from ragserve.service.shard_service import SHARD_CODE

    check_layout(tmp_path, 1)
    shard = ShardService(tmp_path, 0, 1, **shard_open_options(Settings(storage_dir=str(tmp_path))))
    opened = shard.open_options()
    assert opened["code"] == SHARD_CODE and SHARD_CODE.startswith("ragserve.service.shard_service.ShardService:")
    # the methods it answers and the fields of its hits are part of it: an actor started before one
    # was added is replaced too
    methods = sorted(n for n in vars(ShardService) if not n.startswith("_"))
    fields = [f.name for f in dataclasses.fields(SearchHit)]
    assert "mentioned" in methods and "lexical_coverage" in fields
    assert SHARD_CODE.endswith(hashlib.sha1(",".join([*methods, *fields]).encode()).hexdigest()[:12])
    wanted = {**shard_open_options(Settings(storage_dir=str(tmp_path))), "code": SHARD_CODE}
    assert opened == wanted
    old_package = {k: v for k, v in opened.items() if k != "code"}
    assert old_package != wanted and {**old_package, "code": "app.service.shard_service.ShardService"} != wanted
    shard.close()
