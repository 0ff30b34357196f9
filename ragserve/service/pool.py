"""Access to the shards of the index, wherever they run.

``ShardPool`` is the one seam between the document service and the shards: in tests and in a
single process it is ``LocalShardPool`` (shards in this process, calls in worker threads); under
Ray Serve it is a pool of actor handles (``ragserve.deployments.vector_index``). The service never knows.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any


class LocalShardPool:
    """Shards living in this process; each call runs in a worker thread so the loop stays free."""

    def __init__(self, shards: Sequence[Any]):
        self._shards = list(shards)

    @property
    def num_shards(self) -> int:
        return len(self._shards)

    async def call(self, shard: int, method: str, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(getattr(self._shards[shard], method), *args, **kwargs)

    async def call_all(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        return list(await asyncio.gather(*(self.call(i, method, *args, **kwargs) for i in range(self.num_shards))))

    def close(self) -> None:
        for s in self._shards:
            s.close()
