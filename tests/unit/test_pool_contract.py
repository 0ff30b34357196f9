"""The shard-pool contract on the in-process pool."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ragserve.service.pool import LocalShardPool
from ragserve.service.shard_service import ShardService, check_layout
from ragserve.testing.contracts.shard_pool import ShardPoolContract


class TestLocalShardPool(ShardPoolContract):
    @pytest.fixture
    def pool(self, tmp_path: Path) -> Iterator[LocalShardPool]:
        check_layout(tmp_path, 2)
        pool = LocalShardPool([ShardService(tmp_path, i, 2) for i in range(2)])
        yield pool
        pool.close()
