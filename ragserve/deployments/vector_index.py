"""The sharded vector index: N shard actors, each owning one ``ragserve.store`` shard on disk.

Shards are named, detached Ray actors (so every ingress replica shares the same N shards),
restarted by Ray when they die (``max_restarts=-1``) and reopening their SQLite file, with calls
retried across the restart (``max_task_retries=-1``; every shard write is idempotent). They are
placed with the SPREAD strategy so that shards land on different nodes of a cluster.

Because the shards outlive the application (a redeploy, ``serve run`` again on a running Ray),
``reconcile_shards`` compares how each opened its vectors, and the class serving it, with what is
now deployed and replaces a shard opened under other settings or by other code: changing
``faiss_index_kind`` and redeploying takes effect instead of being silently ignored, and an actor
started by an older package is not kept to answer in types this code cannot read. Nothing is lost:
every acknowledged write is in SQLite.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import time
from collections.abc import Callable, Mapping
from typing import Any, Concatenate, ParamSpec, TypeVar, cast

import ray

from ragserve import heap, tracing
from ragserve.config import Settings
from ragserve.deployments.common import log
from ragserve.deployments.shard_metrics import start_size_gauges
from ragserve.service.pool import ReadBatcher
from ragserve.service.shard_service import (
    READ_METHODS,
    SHARD_CODE,
    ReadCall,
    ShardService,
    check_layout,
    shard_method_name,
    traced_call,
    vector_options,
)

SHARD_NAMESPACE = "ragserve"
#: What a shard actor of this code answers as its ``code``: ``SHARD_CODE`` and the methods only the
#: actor adds (an actor started before ``traced`` existed is replaced like one of another class).
ACTOR_CODE = f"{SHARD_CODE}+node_id,traced"
P = ParamSpec("P")
R = TypeVar("R")


@ray.remote
class ShardActor(ShardService):
    """A shard in a Ray actor; adds what only Ray can tell."""

    def __init__(self, *args: Any, **kwargs: Any):
        tracing.configure("shard")  # on when OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT is set
        super().__init__(*args, **kwargs)
        start_size_gauges(self)  # ray_ragserve_shard_documents/_chunks for the dashboard
        heap.settle("shard")

    def open_options(self) -> dict[str, Any]:
        return {**super().open_options(), "code": ACTOR_CODE}

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def traced(self, method: str, trace: Mapping[str, str] | None, *args: Any, **kwargs: Any) -> Any:
        """The ``ShardService`` method named ``method`` in its span ``shard.<method>``, a child of the
        caller's span (``trace``, its W3C carrier): what ``RayShardPool.call`` calls with tracing on
        (docs/architecture.md §7)."""
        return traced_call(self, method, trace, *args, **kwargs)


def shard_actor_name(settings: Settings, index: int) -> str:
    """Names include the storage location, so two applications on different data never share shards."""
    from pathlib import Path

    tag = hashlib.sha1(str(Path(settings.storage_dir).resolve()).encode()).hexdigest()[:10]
    return f"ragserve-shard-{tag}-{index:03d}-of-{settings.num_shards:03d}"


def shard_open_options(settings: Settings) -> dict[str, Any]:
    """What ``ShardService.open_options`` answers for a shard opened under ``settings``."""
    return vector_options(settings.faiss_index_kind, settings.faiss_device, settings.faiss_index_params)


def _get_or_create_shard(settings: Settings, i: int) -> Any:
    return (
        cast(Any, ShardActor)
        .options(  # @ray.remote made it an ActorClass
            name=shard_actor_name(settings, i),
            namespace=SHARD_NAMESPACE,
            get_if_exists=True,
            lifetime="detached",
            max_restarts=-1,
            max_task_retries=-1,
            max_concurrency=16,
            num_cpus=settings.shard_num_cpus,
            scheduling_strategy="SPREAD",
        )
        .remote(settings.storage_dir, i, settings.num_shards, **shard_open_options(settings))
    )


def get_or_create_shards(settings: Settings) -> list[Any]:
    """The shard actors for ``settings``, created on first use (see ``reconcile_shards``)."""
    check_layout(settings.storage_dir, settings.num_shards)
    return [_get_or_create_shard(settings, i) for i in range(settings.num_shards)]


async def reconcile_shards(settings: Settings, actors: list[Any], timeout_s: float = 60.0) -> list[Any]:
    """``actors`` with every shard opened under other vector options replaced by one opened under
    ``settings`` (killed, its name waited free, created again; it reopens the same files)."""
    want = {**shard_open_options(settings), "code": ACTOR_CODE}
    have = await asyncio.gather(*(a.open_options.remote() for a in actors))
    out = list(actors)
    for i, opened in enumerate(have):
        if opened == want:
            continue
        log.warning("shard %d opened with %s; this deployment wants %s: replacing it", i, opened, want)
        killed = actors[i]._actor_id
        ray.kill(actors[i], no_restart=True)
        name, deadline = shard_actor_name(settings, i), time.monotonic() + timeout_s
        while True:  # get_if_exists would hand back the dying actor until its name is released
            try:
                if ray.get_actor(name, namespace=SHARD_NAMESPACE)._actor_id != killed:
                    break  # another replica of this deployment replaced it first
            except ValueError:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"shard actor {name} did not go away within {timeout_s:.0f} s")
            await asyncio.sleep(0.1)
        out[i] = _get_or_create_shard(settings, i)
        if await out[i].open_options.remote() != want:  # another replica raced us with other settings
            raise RuntimeError(f"shard {i} is held open under other vector options by another deployment")
    return out


class RayShardPool:
    """``ragserve.ports.ShardPool`` over shard actor handles.

    The actor is called by the method's name; only methods of ``ShardService`` itself are accepted
    (``shard_method_name``, the same check as ``LocalShardPool``'s). Reads (``READ_METHODS``) go
    through a ``ReadBatcher`` a shard: alone while fewer than ``reads_in_flight`` calls to that
    shard are out, in one ``read_many`` call with the others held meanwhile once they are (0: every
    read alone). Writes always go alone, at once."""

    def __init__(self, actors: list[Any], reads_in_flight: int = 0):
        self._actors = actors
        self._batchers = (
            [
                ReadBatcher(functools.partial(self._send_one, i), actor.read_many.remote, reads_in_flight)
                for i, actor in enumerate(actors)
            ]
            if reads_in_flight > 0
            else None
        )

    @property
    def num_shards(self) -> int:
        return len(self._actors)

    async def call(
        self, shard: int, method: Callable[Concatenate[ShardService, P], R], *args: P.args, **kwargs: P.kwargs
    ) -> R:
        name = shard_method_name(method)
        call: ReadCall = (name, (tracing.carrier() or {}) if tracing.ENABLED else None, args, kwargs)
        if self._batchers is not None and name in READ_METHODS:
            return cast(R, await self._batchers[shard].read(call))
        return cast(R, await self._send_one(shard, call))

    async def _send_one(self, shard: int, call: ReadCall) -> Any:
        name, trace, args, kwargs = call
        if tracing.ENABLED:  # the actor opens shard.<name> under the caller's span
            return await self._actors[shard].traced.remote(name, trace or None, *args, **kwargs)
        return await getattr(self._actors[shard], name).remote(*args, **kwargs)

    async def call_all(
        self, method: Callable[Concatenate[ShardService, P], R], *args: P.args, **kwargs: P.kwargs
    ) -> list[R]:
        return list(await asyncio.gather(*(self.call(i, method, *args, **kwargs) for i in range(self.num_shards))))

    async def wait_ready(self) -> None:
        await self.call_all(ShardService.ping)
