"""Access to the shards of the index, wherever they run.

``ShardPool`` (``ragserve.ports``) is the one seam between the document service and the shards:
in tests and in a single process it is ``LocalShardPool`` (shards in this process, calls in worker
threads); under Ray Serve it is a pool of actor handles (``ragserve.deployments.vector_index``).
The service never knows. Callers pass the ``ShardService`` method itself, so mypy checks every call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Concatenate, ParamSpec, TypeVar, cast

from ragserve import tracing
from ragserve.service.shard_service import ShardService, shard_method_name, traced_call

P = ParamSpec("P")
R = TypeVar("R")


class LocalShardPool:
    """Shards living in this process; each call runs in a worker thread so the loop stays free."""

    def __init__(self, shards: Sequence[ShardService]):
        self._shards = list(shards)

    @property
    def num_shards(self) -> int:
        return len(self._shards)

    async def call(
        self, shard: int, method: Callable[Concatenate[ShardService, P], R], *args: P.args, **kwargs: P.kwargs
    ) -> R:
        # Checked and looked up by name on the shard, as the actor pool does across the process
        # boundary, so a pool accepts the same methods and a shard that overrides one behaves the
        # same here and under Ray.
        name = shard_method_name(method)
        if tracing.ENABLED:  # in its span shard.<name>, child of the caller's (the thread copies the context)
            return cast(R, await asyncio.to_thread(traced_call, self._shards[shard], name, None, *args, **kwargs))
        bound: Callable[P, R] = getattr(self._shards[shard], name)
        return await asyncio.to_thread(bound, *args, **kwargs)

    async def call_all(
        self, method: Callable[Concatenate[ShardService, P], R], *args: P.args, **kwargs: P.kwargs
    ) -> list[R]:
        return list(await asyncio.gather(*(self.call(i, method, *args, **kwargs) for i in range(self.num_shards))))

    def close(self) -> None:
        for s in self._shards:
            s.close()
