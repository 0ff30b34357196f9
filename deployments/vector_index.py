"""The sharded vector index: N shard actors, each owning one ``app.store`` shard on disk.

Shards are named, detached Ray actors (so every ingress replica shares the same N shards),
restarted by Ray when they die (``max_restarts=-1``) and reopening their SQLite file, with calls
retried across the restart (``max_task_retries=-1``; every shard write is idempotent). They are
placed with the SPREAD strategy so that shards land on different nodes of a cluster.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import ray

from app.config import Settings
from app.service.shard_service import ShardService, check_layout

SHARD_NAMESPACE = "ragserve"


@ray.remote
class ShardActor(ShardService):
    """A shard in a Ray actor; adds what only Ray can tell."""

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()


def shard_actor_name(settings: Settings, index: int) -> str:
    """Names include the storage location, so two applications on different data never share shards."""
    from pathlib import Path

    tag = hashlib.sha1(str(Path(settings.storage_dir).resolve()).encode()).hexdigest()[:10]
    return f"ragserve-shard-{tag}-{index:03d}-of-{settings.num_shards:03d}"


def get_or_create_shards(settings: Settings) -> list[Any]:
    """The shard actors for ``settings``, created on first use."""
    check_layout(settings.storage_dir, settings.num_shards)
    actors = []
    for i in range(settings.num_shards):
        actors.append(ShardActor.options(
            name=shard_actor_name(settings, i), namespace=SHARD_NAMESPACE, get_if_exists=True,
            lifetime="detached", max_restarts=-1, max_task_retries=-1, max_concurrency=16,
            num_cpus=settings.shard_num_cpus, scheduling_strategy="SPREAD",
        ).remote(settings.storage_dir, i, settings.num_shards, faiss_kind=settings.faiss_index_kind,
                   faiss_device=settings.faiss_device, faiss_params=settings.faiss_index_params))
    return actors


class RayShardPool:
    """``app.service.pool.ShardPool`` over shard actor handles."""

    def __init__(self, actors: list[Any]):
        self._actors = actors

    @property
    def num_shards(self) -> int:
        return len(self._actors)

    async def call(self, shard: int, method: str, *args: Any, **kwargs: Any) -> Any:
        return await getattr(self._actors[shard], method).remote(*args, **kwargs)

    async def call_all(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        return list(await asyncio.gather(*(self.call(i, method, *args, **kwargs) for i in range(self.num_shards))))

    async def wait_ready(self) -> None:
        await self.call_all("ping")
