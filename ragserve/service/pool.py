"""Access to the shards of the index, wherever they run.

``ShardPool`` (``ragserve.ports``) is the one seam between the document service and the shards:
in tests and in a single process it is ``LocalShardPool`` (shards in this process, calls in worker
threads); under Ray Serve it is a pool of actor handles (``ragserve.deployments.vector_index``).
The service never knows. Callers pass the ``ShardService`` method itself, so mypy checks every call.
"""

from __future__ import annotations

import asyncio
import copy
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Concatenate, ParamSpec, TypeVar, cast

from ragserve import tracing
from ragserve.service.shard_service import ReadCall, ShardService, shard_method_name, traced_call

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


#: The most reads ``ReadBatcher`` sends in one call.
READ_BATCH_MAX = 32


class ReadBatcher:
    """Reads of one shard in another process, sent one call each while fewer than ``in_flight``
    calls are out, and otherwise held and sent together, as one call (``ShardService.read_many``),
    when a call returns.

    A call to a Ray actor costs its caller ~1.3 ms of CPU and the actor as much, whatever it asks
    (the shard answers a repeated search from memory in microseconds): at 16 concurrent requests
    on two shards that was most of a warm ``/retrieve``'s CPU. Unloaded, every read goes alone at
    once, as before; under load, held reads share a call, which the shard runs on one thread
    (parallelism traded for the calls' CPU: docs/architecture.md §6, "Reads in batches"). Each read
    keeps its own result or error; one whose caller gave up before it was sent is not sent. Only
    ``READ_METHODS`` come here: never writes, nor reads that may wait long.

    ``send_one`` sends one read; ``send_many`` several, answering ``ShardService.read_many``'s
    list. One event loop uses a batcher: a read from another loop goes alone."""

    def __init__(
        self,
        send_one: Callable[[ReadCall], Awaitable[Any]],
        send_many: Callable[[list[ReadCall]], Awaitable[list[tuple[bool, Any]]]],
        in_flight: int,
        max_batch: int = READ_BATCH_MAX,
    ):
        if in_flight < 1 or max_batch < 1:
            raise ValueError("in_flight and max_batch must be at least 1")
        self._send_one, self._send_many = send_one, send_many
        self._in_flight, self._max_batch = in_flight, max_batch
        self._out = 0
        self._held: deque[tuple[ReadCall, asyncio.Future[Any]]] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def calls_out(self) -> int:
        """Calls sent and not yet answered."""
        return self._out

    async def read(self, call: ReadCall) -> Any:
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        if loop is not self._loop:
            return await self._send_one(call)
        if self._out < self._in_flight and not self._held:
            self._out += 1
            try:
                return await self._send_one(call)
            finally:
                self._out -= 1
                self._send_held()
        future: asyncio.Future[Any] = loop.create_future()
        self._held.append((call, future))
        return await future

    def _send_held(self) -> None:
        while self._out < self._in_flight and self._held:
            batch: list[tuple[ReadCall, asyncio.Future[Any]]] = []
            while self._held and len(batch) < self._max_batch:
                call, future = self._held.popleft()
                if not future.done():  # a caller who gave up is not sent
                    batch.append((call, future))
            if not batch:
                return
            self._out += 1
            task = asyncio.ensure_future(self._send(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send(self, batch: list[tuple[ReadCall, asyncio.Future[Any]]]) -> None:
        outcomes: list[tuple[bool, Any]] = []
        try:
            if len(batch) == 1:
                try:
                    outcomes = [(True, await self._send_one(batch[0][0]))]
                except Exception as e:  # that read's error, for its caller
                    outcomes = [(False, e)]
            else:
                answer = await self._send_many([call for call, _ in batch])
                if not isinstance(answer, list) or len(answer) != len(batch):  # not read_many's: fail each
                    raise RuntimeError(f"a shard answered {len(batch)} reads with {type(answer).__name__}")
                outcomes = answer
        except Exception as e:  # the call itself failed: each read in it did, each with its own error
            outcomes = [(False, _own_error(e)) for _ in batch]
        finally:
            self._out -= 1
            self._send_held()
            # every caller hears, whatever the answer holds: none is left waiting
            for (_, future), outcome in zip(batch, outcomes or [(False, None)] * len(batch), strict=True):
                if not future.done():
                    _settle(future, outcome)


def _own_error(e: Exception) -> Exception:
    """A copy of ``e`` for one caller among several: none sees another's traceback or attributes."""
    try:
        out = copy.copy(e)
    except Exception:
        out = RuntimeError(str(e))
    out.__cause__ = e
    return out


def _settle(future: asyncio.Future[Any], outcome: Any) -> None:
    """``future`` given a read's ``(ok, value)``; anything else (a value that is not an exception
    where one should be, ``StopIteration`` that a future refuses, a call that ended without an
    answer) is a RuntimeError for its caller."""
    try:
        ok, value = outcome
        if ok:
            future.set_result(value)
            return
        if isinstance(value, Exception) and not isinstance(value, StopIteration):
            future.set_exception(value)
            return
    except Exception:  # a malformed outcome: the caller still hears below
        pass
    future.set_exception(RuntimeError(f"a shard read ended without an answer: {outcome!r:.200}"))
