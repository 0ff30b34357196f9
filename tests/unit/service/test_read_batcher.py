"""``ReadBatcher``: reads go alone while few calls are out and together once they are; each read
keeps its own answer or error; nothing hangs; a caller who left is not sent. And the shard's side,
``ShardService.read_many``."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ragserve.errors import ConflictError
from ragserve.service.pool import ReadBatcher
from ragserve.service.shard_service import READ_METHODS, ReadCall, ShardService, check_layout
from ragserve.testing.contracts.shard_pool import write


class FakeShard:
    """Answers ``("echo", x)`` with x and ``("fail", x)`` with a ConflictError, after ``gate`` opens."""

    def __init__(self) -> None:
        self.singles: list[ReadCall] = []
        self.batches: list[list[ReadCall]] = []
        self.gate = asyncio.Event()
        self.gate.set()

    @staticmethod
    def answer(call: ReadCall) -> Any:
        name, _, args, _ = call
        if name == "fail":
            raise ConflictError(f"read {args[0]} failed")
        return args[0]

    async def one(self, call: ReadCall) -> Any:
        self.singles.append(call)
        await self.gate.wait()
        return self.answer(call)

    async def many(self, calls: list[ReadCall]) -> list[tuple[bool, Any]]:
        self.batches.append(list(calls))
        await self.gate.wait()
        out: list[tuple[bool, Any]] = []
        for c in calls:
            try:
                out.append((True, self.answer(c)))
            except Exception as e:
                out.append((False, e))
        return out


def echo(x: Any) -> ReadCall:
    return ("echo", None, (x,), {})


async def test_unloaded_reads_go_alone() -> None:
    shard = FakeShard()
    batcher = ReadBatcher(shard.one, shard.many, in_flight=2)
    assert [await batcher.read(echo(i)) for i in range(5)] == list(range(5))
    assert len(shard.singles) == 5 and shard.batches == [] and batcher.calls_out == 0


async def test_reads_held_while_calls_are_out_go_together_each_with_its_answer() -> None:
    shard = FakeShard()
    shard.gate.clear()
    batcher = ReadBatcher(shard.one, shard.many, in_flight=2, max_batch=4)
    reads = [asyncio.ensure_future(batcher.read(echo(i))) for i in range(12)]
    await asyncio.sleep(0)
    assert len(shard.singles) == 2 and batcher.calls_out == 2  # the rest are held
    shard.gate.set()
    assert await asyncio.gather(*reads) == list(range(12))
    assert sorted(len(b) for b in shard.batches) == [2, 4, 4]  # 10 held: at most 4 a call
    assert [c[2][0] for b in shard.batches for c in b] == list(range(2, 12))  # in the order they came
    assert batcher.calls_out == 0


async def test_one_reads_error_reaches_its_caller_alone() -> None:
    shard = FakeShard()
    shard.gate.clear()
    batcher = ReadBatcher(shard.one, shard.many, in_flight=1)
    first = asyncio.ensure_future(batcher.read(echo("a")))
    await asyncio.sleep(0)
    held = [asyncio.ensure_future(batcher.read(c)) for c in (echo("b"), ("fail", None, ("c",), {}), echo("d"))]
    await asyncio.sleep(0)
    shard.gate.set()
    got = await asyncio.gather(first, *held, return_exceptions=True)
    assert got[:2] == ["a", "b"] and got[3] == "d"
    assert isinstance(got[2], ConflictError) and "read c failed" in str(got[2])
    assert len(shard.batches) == 1


async def test_a_failed_call_fails_each_read_in_it_and_a_wrong_answer_hangs_none() -> None:
    async def broken(calls: list[ReadCall]) -> list[tuple[bool, Any]]:
        await asyncio.sleep(0.01)
        raise ConnectionError("actor died")

    async def short(calls: list[ReadCall]) -> list[tuple[bool, Any]]:
        await asyncio.sleep(0.01)
        return [(True, 1)]  # one answer for several reads

    async def slow_one(call: ReadCall) -> Any:
        await asyncio.sleep(0.01)
        return call[2][0]

    for many, error in ((broken, ConnectionError), (short, RuntimeError)):
        batcher = ReadBatcher(slow_one, many, in_flight=1)
        got = await asyncio.wait_for(
            asyncio.gather(*(batcher.read(echo(i)) for i in range(4)), return_exceptions=True), 5
        )
        assert got[0] == 0 and all(isinstance(g, error) for g in got[1:]), got
        assert batcher.calls_out == 0
        assert await batcher.read(echo("after")) == "after"  # the batcher goes on


async def test_a_held_read_whose_caller_left_is_not_sent() -> None:
    shard = FakeShard()
    shard.gate.clear()
    batcher = ReadBatcher(shard.one, shard.many, in_flight=1)
    first = asyncio.ensure_future(batcher.read(echo(0)))
    await asyncio.sleep(0)
    left = asyncio.ensure_future(batcher.read(echo("left")))
    stays = [asyncio.ensure_future(batcher.read(echo(i))) for i in (1, 2)]
    await asyncio.sleep(0)
    left.cancel()
    shard.gate.set()
    assert await first == 0 and await asyncio.gather(*stays) == [1, 2]
    sent = [c[2][0] for c in shard.singles] + [c[2][0] for b in shard.batches for c in b]
    assert "left" not in sent and sorted(sent) == [0, 1, 2]


async def test_a_lone_held_read_goes_as_itself() -> None:
    shard = FakeShard()
    shard.gate.clear()
    batcher = ReadBatcher(shard.one, shard.many, in_flight=1)
    reads = [asyncio.ensure_future(batcher.read(echo(i))) for i in range(2)]
    await asyncio.sleep(0)
    shard.gate.set()
    assert await asyncio.gather(*reads) == [0, 1]
    assert len(shard.singles) == 2 and shard.batches == []  # no batch of one


def test_a_read_from_another_event_loop_goes_alone() -> None:
    shard = FakeShard()
    batcher = ReadBatcher(shard.one, shard.many, in_flight=1)
    assert asyncio.run(batcher.read(echo(1))) == 1
    assert asyncio.run(batcher.read(echo(2))) == 2  # a second loop: not held on the first's futures
    assert len(shard.singles) == 2


def test_bounds_are_checked() -> None:
    shard = FakeShard()
    with pytest.raises(ValueError):
        ReadBatcher(shard.one, shard.many, in_flight=0)


def test_read_many_runs_reads_in_order_and_refuses_writes_and_slow_reads(tmp_path: Path) -> None:
    check_layout(tmp_path, 1)
    shard = ShardService(tmp_path, 0, 1)
    try:
        doc = write("d1", "a note")
        shard.upsert_documents("kb", [doc])
        vector = doc.chunks[0].vector
        out = shard.read_many(
            [
                ("search", None, (), {"index": "kb", "vector": vector, "k": 1}),
                ("search", None, (), {"index": "kb", "vector": np.ones(3, dtype=np.float32), "k": 1}),
                ("upsert_documents", None, (), {"index": "kb", "docs": [write("d2", "never written")]}),
                ("_search_indexes", None, (), {}),
                ("index_stats", None, ("kb",), {}),  # waits for the write lock: never in a batch
                ("has_index", None, ("kb",), {}),
            ]
        )
        assert out[0][0] is True and out[0][1][0].doc_id == "d1"
        assert out[1][0] is False and "3-d" in str(out[1][1])
        assert any("in shard 0" in n for n in getattr(out[1][1], "__notes__", []))  # the shard's traceback
        for refused in (out[2], out[3], out[4]):
            assert refused[0] is False and isinstance(refused[1], TypeError)
        assert out[5] == (True, True)
        assert shard.count_documents("kb") == 1
    finally:
        shard.close()


def test_read_methods_are_the_query_paths_lock_free_reads() -> None:
    for name in READ_METHODS:
        assert callable(getattr(ShardService, name, None)) and not name.startswith("_"), name
    for other in (
        "upsert_documents",
        "delete_documents",
        "drop_index",
        "replace_index",
        "ensure_index",
        "index_stats",  # takes the write lock
        "list_documents",
        "count_documents",
        "get_documents",
        "find_by_hash",
    ):
        assert other not in READ_METHODS


async def test_every_caller_hears_whatever_the_answer_holds() -> None:
    """A read whose error a future refuses (StopIteration), a malformed outcome, or a failed call:
    every read in the batch still ends, each failed one with an error of its own."""

    async def slow_one(call: ReadCall) -> Any:
        await asyncio.sleep(0.01)
        return call[2][0]

    async def odd(calls: list[ReadCall]) -> list[tuple[bool, Any]]:
        return [(False, StopIteration()), (True, "b"), ("not", "a", "pair"), (False, "not an exception")]

    batcher = ReadBatcher(slow_one, odd, in_flight=1)
    got = await asyncio.wait_for(asyncio.gather(*(batcher.read(echo(i)) for i in range(5)), return_exceptions=True), 5)
    assert got[0] == 0 and got[2] == "b"
    assert all(isinstance(g, RuntimeError) for g in (got[1], got[3], got[4])), got

    async def broken(calls: list[ReadCall]) -> list[tuple[bool, Any]]:
        raise ConnectionError("actor died")

    batcher = ReadBatcher(slow_one, broken, in_flight=1)
    got = await asyncio.gather(*(batcher.read(echo(i)) for i in range(4)), return_exceptions=True)
    errors = got[1:]
    assert all(isinstance(e, ConnectionError) for e in errors)
    assert len({id(e) for e in errors}) == 3  # one error each: no caller sees another's traceback
