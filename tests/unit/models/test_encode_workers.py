"""``EncodeWorkers``: the Embedder's document batches on several threads, a batch each. Every text
comes back in its place, a small request still uses every worker, a model that may not run on
several threads gets one; and the real model, encoding and counting tokens on several threads at
once, gives the vectors of one call and no tokenizer error."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from ragserve.models.embeddings import EncodeWorkers, document_workers
from tests.unit.models.test_embeddings_plain import TEXTS  # texts of every awkward kind, empty to over-long


class ThreadRecordingModel:
    """Vectors that name their text (its length, its first character); records the threads used
    and how many calls ran at once."""

    dim = 3
    device = "cpu"

    def __init__(self, concurrent: bool = True):
        self.concurrent = concurrent
        self.calls: list[list[str]] = []
        self.threads: set[str] = set()
        self.running = self.most_at_once = 0
        self._lock = threading.Lock()

    def encode(self, texts: list[str], batch_size: int = 32) -> np.ndarray:
        with self._lock:
            self.calls.append(list(texts))
            self.threads.add(threading.current_thread().name)
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
        time.sleep(0.03)
        with self._lock:
            self.running -= 1
        return expected(texts)


def expected(texts: list[str]) -> np.ndarray:
    return np.array([[len(t), ord(t[0]) if t else 0, 1] for t in texts], dtype=np.float32).reshape(-1, 3)


@pytest.mark.parametrize("n, workers, batch", [(0, 2, 32), (1, 2, 32), (3, 2, 32), (7, 3, 2), (100, 2, 32), (65, 4, 8)])
def test_parts_cover_every_text_once_longest_first(n: int, workers: int, batch: int) -> None:
    texts = [f"text {'x' * ((i * 37) % 23)} {i}" for i in range(n)]
    pool = EncodeWorkers(ThreadRecordingModel(), workers)
    try:
        parts = pool.parts(texts, batch)
        flat = [i for p in parts for i in p]
        assert sorted(flat) == list(range(n))
        assert [len(texts[i]) for i in flat] == sorted((len(t) for t in texts), reverse=True)
        assert all(len(p) <= batch for p in parts)
        if 0 < n < workers * batch:  # fewer batches than workers: one part per worker (or per text)
            assert len(parts) == min(n, workers)
    finally:
        pool.close()


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_on_the_cpu_a_part_holds_at_most_part_tokens_as_padded(device: str) -> None:
    """An ingestion's part keeps its worker from the work behind it: on the CPU a part of long
    chunks is a few of them (about a second of a core), short texts still fill the batch, and an
    over-long text is a part of its own; a GPU's parts are not bounded."""
    model = ThreadRecordingModel()
    model.device = device
    pool = EncodeWorkers(model, 2)
    try:
        budget = pool.PART_TOKENS
        long, short, huge = "l" * 200, "s" * 60, "h" * (3 * budget)
        texts = [short] * 100 + [long] * 40 + [huge] * 2
        parts = pool.parts(texts, 32)
        assert sorted(i for p in parts for i in p) == list(range(len(texts)))
        padded = [len(p) * max(len(texts[i]) for i in p) for p in parts]
        if device == "cuda":
            assert all(len(p) <= 32 for p in parts) and len(parts) == 5
            return
        assert [len(p) for p in parts[:2]] == [1, 1]  # each over-long text alone
        assert all(size <= budget for size, p in zip(padded, parts, strict=True) if len(p) > 1)
        assert [len(p) for p in parts[2:6]] == [budget // 200] * 4  # 10 long texts a part
        assert [len(p) for p in parts if texts[p[0]] == short] == [32, 32, 32, 4]  # the batch, not the budget
        # a call of fewer parts than workers is still shared out
        assert [len(p) for p in pool.parts([long] * 6, 32)] == [3, 3]
        # a model's longest input bounds what a text counts: 256-token chunks, 8 a part
        model.max_seq_length = 256
        assert [len(p) for p in pool.parts(["w" * 5000] * 20, 32)] == [8, 8, 4]
        # a character of several bytes counts them all (a Hangul syllable: up to 3 WordPiece tokens)
        assert [len(p) for p in pool.parts(["한" * 60] * 40, 32)] == [11, 11, 11, 7]  # 180 bytes a text
        # a call of one round is shared out evenly, and each share is still within the budget
        assert [len(p) for p in pool.parts(["w" * 5000] * 10, 32)] == [5, 5]
        assert [len(p) for p in pool.parts([short] * 48, 32)] == [24, 24]
        wide = EncodeWorkers(model, 3)
        try:
            shares = wide.parts(["w" * 5000] + [short] * 39, 32)
            assert len(shares) >= 3 and sorted(i for p in shares for i in p) == list(range(40))
            assert all(len(p) * min(256, max(len(["w" * 5000, short][i > 0]) for i in p)) <= budget for p in shares)
        finally:
            wide.close()
        with pytest.raises(ValueError, match="batch_size"):
            pool.parts(["x"], 0)
    finally:
        pool.close()


async def test_texts_come_back_in_their_places_from_every_worker() -> None:
    model = ThreadRecordingModel()
    pool = EncodeWorkers(model, 2)
    try:
        texts = [f"{chr(65 + i % 26)}{'y' * (i % 7)}" for i in range(10)]  # one batch of 32: split in two
        assert np.array_equal(await pool.encode(texts, 32), expected(texts))
        assert len(model.calls) == 2 and len(model.threads) == 2 and model.most_at_once == 2
        texts = [f"{chr(97 + i % 26)}{'z' * (i % 11)}" for i in range(70)]  # three batches of 32
        assert np.array_equal(await pool.encode(texts, 32), expected(texts))
        assert sorted(len(c) for c in model.calls[2:]) == [6, 32, 32]
        assert (await pool.encode([], 32)).shape == (0, 3)
    finally:
        pool.close()


async def test_a_model_that_is_not_concurrent_gets_one_worker() -> None:
    model = ThreadRecordingModel(concurrent=False)
    pool = EncodeWorkers(model, 4)
    try:
        assert pool.workers == 1
        texts = [f"t{i}" for i in range(100)]
        assert np.array_equal(await pool.encode(texts, 32), expected(texts))
        assert model.most_at_once == 1
    finally:
        pool.close()


def test_the_real_model_runs_a_batch_per_worker_with_one_torch_thread_each(embedding_model) -> None:
    import torch

    before = torch.get_num_threads()
    try:
        pool = document_workers(embedding_model, workers=2)
        assert pool.workers == 2 and torch.get_num_threads() == 1
        pool.close()
        assert document_workers(embedding_model, workers=1).workers == 1 and torch.get_num_threads() >= 1
        assert embedding_model.concurrent
    finally:
        torch.set_num_threads(before)


async def test_the_real_model_gives_one_calls_vectors_from_several_workers(embedding_model) -> None:
    pool = EncodeWorkers(embedding_model, 2)
    try:
        texts = TEXTS * 8
        together = embedding_model.encode(texts, batch_size=4)
        apart = await pool.encode(texts, 4)
        assert apart.shape == together.shape and np.abs(apart - together).max() < 1e-5
    finally:
        pool.close()


@pytest.fixture(params=["plain", pytest.param("sentence-transformers", marks=pytest.mark.slow)])
def either_model(request, embedding_model):  # type: ignore[no-untyped-def]
    if request.param == "plain":
        return embedding_model
    from ragserve.models.embeddings import LocalEmbeddingModel

    return LocalEmbeddingModel(None, device="cpu", plain=False)


def test_encoding_and_counting_tokens_on_several_threads_at_once(either_model) -> None:
    """A fast tokenizer reconfigured by one thread (counting: no padding, no truncation) while
    another is inside it (encoding: padded, truncated) made the encode fail ("Unable to create
    tensor"); the model locks its tokenizer, in its own encode and around sentence-transformers'."""
    embedding_model = either_model
    errors: list[BaseException] = []
    texts = ["Shards restart on another node. " * 80, "short"] * 4
    counted = [len(embedding_model.tokenizer.encode(t, add_special_tokens=True)) for t in texts]

    def encode() -> None:
        try:
            for _ in range(6):
                assert embedding_model.encode(texts, batch_size=8).shape == (8, 384)
        except BaseException as e:
            errors.append(e)

    def count() -> None:
        try:
            for _ in range(300):
                assert embedding_model.count_tokens(texts) == counted
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=f) for f in (encode, encode, count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_chunking_counts_while_the_model_encodes_with_the_same_tokenizer(embedding_model) -> None:
    """The ingress sizes chunks (on worker threads) with its query model's tokenizer while that
    model encodes queries; the chunker's counts reconfigured the shared tokenizer under the
    encode ("Unable to create tensor"). ``hf_token_counter`` counts with its own copy."""
    from ragserve.ingest import hf_token_counter

    count = hf_token_counter(embedding_model.tokenizer)
    errors: list[BaseException] = []
    texts = ["Shards restart on another node. " * 80, "short"] * 4
    expected = [len(embedding_model.tokenizer.encode(t, add_special_tokens=False)) for t in texts]

    encoded = threading.Event()

    def encode() -> None:
        try:
            for _ in range(8):
                assert embedding_model.encode(texts, batch_size=8).shape == (8, 384)
        except BaseException as e:
            errors.append(e)
        finally:
            encoded.set()

    def chunk_counts() -> None:  # for as long as the encodes run
        try:
            while not encoded.is_set():
                assert [count(t) for t in texts] == expected
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=f) for f in (encode, chunk_counts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


async def test_workers_and_token_counts_share_the_model_safely(embedding_model) -> None:
    pool = EncodeWorkers(embedding_model, 2)
    try:
        texts = TEXTS * 6
        vecs, n = await asyncio.gather(
            pool.encode(texts, 4), asyncio.to_thread(embedding_model.count_tokens, texts * 20)
        )
        assert vecs.shape == (len(texts), 384) and len(n) == len(texts) * 20 and min(n) > 0
    finally:
        pool.close()


class GatedModel:
    """Each encode waits until the test lets one more through, and records the order calls began."""

    dim = 3
    device = "cpu"
    concurrent = True

    def __init__(self) -> None:
        self.began: list[str] = []
        self.gate = threading.Semaphore(0)
        self.running = 0
        self._lock = threading.Lock()

    def encode(self, texts: list[str], batch_size: int = 32) -> np.ndarray:
        with self._lock:
            self.began.append(texts[0])
            self.running += 1
        assert self.gate.acquire(timeout=10), "the test never let this call finish"
        with self._lock:
            self.running -= 1
        return expected(texts)


async def _until(condition, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.005)


async def test_interactive_work_goes_before_waiting_bulk_parts_each_in_arrival_order() -> None:
    """A megabyte of document is thousands of bulk parts: a query that comes after them waits for the
    part a worker is on, not for every part queued before it."""
    model = GatedModel()
    pool = EncodeWorkers(model, 2)
    try:
        bulk = asyncio.ensure_future(pool.encode([f"bulk{i:02d}" for i in range(8)], 1, bulk=True))
        await _until(lambda: model.running == 2)  # two bulk parts on the workers, six waiting
        query = asyncio.ensure_future(pool.run(model.encode, ["query"]))
        count = asyncio.ensure_future(pool.run(model.encode, ["count"]))
        await asyncio.sleep(0.05)
        assert model.began == ["bulk00", "bulk01"] and not query.done()
        model.gate.release()  # one bulk part ends: its worker goes to the first interactive call
        await _until(lambda: len(model.began) == 3)
        assert model.began[2] == "query"
        model.gate.release()
        await _until(lambda: len(model.began) == 4)
        assert model.began[3] == "count"  # interactive calls keep their order among themselves
        for _ in range(8):
            model.gate.release()
        vectors = await bulk
        assert np.array_equal(vectors, expected([f"bulk{i:02d}" for i in range(8)]))
        assert np.array_equal((await query), expected(["query"])) and np.array_equal(await count, expected(["count"]))
        assert model.began[4:] == [f"bulk{i:02d}" for i in range(2, 8)]  # the rest of the bulk, in order
        assert pool._free == 2 and not pool._waiting  # every worker back
    finally:
        pool.close()


async def test_a_cancelled_caller_takes_its_waiting_parts_out_and_frees_every_worker() -> None:
    """A client that leaves cancels its request: the parts not started never run, the parts on a
    worker finish and give the worker back then (not before: no more threads than workers)."""
    model = GatedModel()
    pool = EncodeWorkers(model, 2)
    try:
        bulk = asyncio.ensure_future(pool.encode([f"bulk{i:02d}" for i in range(20)], 1, bulk=True))
        await _until(lambda: model.running == 2)
        bulk.cancel()
        with pytest.raises(asyncio.CancelledError):
            await bulk
        later = asyncio.ensure_future(pool.run(model.encode, ["later"]))
        await asyncio.sleep(0.05)
        assert not later.done() and pool._free == 0  # both workers still busy with their parts
        model.gate.release()
        model.gate.release()
        model.gate.release()
        assert np.array_equal(await later, expected(["later"]))
        await _until(lambda: pool._free == 2)
        assert model.began == ["bulk00", "bulk01", "later"]  # none of the 18 waiting parts ran
    finally:
        pool.close()


def test_callers_on_other_event_loops_share_the_workers_in_order() -> None:
    """The Embedder's loop and a thread's own loop (a test, the in-process app) may share one pool: a
    worker freed by one loop's call is handed to a waiter of another on that waiter's loop."""
    model = GatedModel()
    pool = EncodeWorkers(model, 1)
    results: dict[str, np.ndarray] = {}

    def call(name: str) -> None:
        results[name] = asyncio.run(pool.run(model.encode, [name]))

    try:
        first = threading.Thread(target=call, args=("first",))
        first.start()
        deadline = time.monotonic() + 5
        while model.running < 1:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        second = threading.Thread(target=call, args=("second",))
        second.start()
        while not pool._waiting:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        model.gate.release()
        model.gate.release()
        first.join(5)
        second.join(5)
        assert model.began == ["first", "second"] and set(results) == {"first", "second"}
        assert pool._free == 1
    finally:
        pool.close()


async def test_bulk_calls_take_turns_part_by_part() -> None:
    """A small document's batch is not queued behind every part of a large one sent before it: the
    first part of each bulk call goes before the second part of any."""
    model = GatedModel()
    pool = EncodeWorkers(model, 1)
    try:
        large = asyncio.ensure_future(pool.encode([f"large{i}" for i in range(5)], 1, bulk=True))
        await _until(lambda: model.running == 1)
        small = asyncio.ensure_future(pool.encode(["small0"], 1, bulk=True))
        await _until(lambda: len(pool._waiting) == 5)
        for _ in range(6):
            model.gate.release()
        await asyncio.gather(large, small)
        assert model.began == ["large0", "small0", "large1", "large2", "large3", "large4"]
    finally:
        pool.close()


async def test_interactive_calls_take_turns_too() -> None:
    """A query is not queued behind every part of a ``/v1/embeddings`` call of 2,048 inputs sent
    before it (the hostile review): interactive calls take turns part by part as bulk calls do."""
    model = GatedModel()
    pool = EncodeWorkers(model, 1)
    try:
        big = asyncio.ensure_future(pool.encode([f"input{i}" for i in range(5)], 1))
        await _until(lambda: model.running == 1)
        query = asyncio.ensure_future(pool.run(model.encode, ["query"]))
        await _until(lambda: len(pool._waiting) == 5)
        for _ in range(6):
            model.gate.release()
        await asyncio.gather(big, query)
        assert model.began[:2] == ["input0", "query"]
    finally:
        pool.close()


def test_a_waiter_whose_loop_stopped_does_not_keep_the_worker_from_other_loops() -> None:
    """A waiter's loop that stops without being closed (a synchronous wrapper's
    ``run_until_complete`` that returned, or ``asyncio.run`` between its last run and its close)
    would never run the callback handing it the worker: the worker goes on to the next caller, and
    the stopped loop's waiter gets back in line if its loop runs again."""
    model = GatedModel()
    pool = EncodeWorkers(model, 1)
    stopped = asyncio.new_event_loop()
    try:
        holder = stopped.create_task(pool.run(model.encode, ["holder"]))
        waiter = stopped.create_task(pool.run(model.encode, ["waiter"]))
        stopped.run_until_complete(asyncio.sleep(0.05))  # holder on the worker, waiter in line; the loop stops
        assert model.began == ["holder"] and len(pool._waiting) == 1
        model.gate.release()  # holder's part ends while its loop is stopped
        deadline = time.monotonic() + 5
        while pool._free != 1:  # the worker was not handed to the stopped loop's waiter
            assert time.monotonic() < deadline, (pool._free, pool._waiting)
            time.sleep(0.01)

        async def later() -> np.ndarray:
            return await asyncio.wait_for(pool.run(model.encode, ["later"]), 5)

        model.gate.release()
        assert np.array_equal(asyncio.run(later()), expected(["later"]))
        model.gate.release()
        stopped.run_until_complete(asyncio.wait_for(asyncio.gather(holder, waiter), 5))  # runs again: back in line
        assert model.began == ["holder", "later", "waiter"] and pool._free == 1
    finally:
        stopped.close()
        pool.close()
