"""The Files API's store: durable (a new store over the same directory sees every file), size-bounded
while it streams (nothing left behind past the limit, nor when a request is cancelled), orphans of
an interrupted write swept, and every call a clear 4xx for a caller's mistake."""

from __future__ import annotations

import asyncio
import io
import os
import sqlite3
import time
from collections.abc import AsyncIterator
from hashlib import sha256
from pathlib import Path

import pytest

from ragserve.errors import BadRequestError, NotFoundError, PayloadTooLargeError
from ragserve.service.file_store import BLOBS_DIR, DB_NAME, TMP_PREFIX, FileStore, new_file_id


async def chunks(data: bytes, size: int = 1000) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


def leftovers(store: FileStore) -> list[str]:
    return sorted(os.listdir(store.blobs))


@pytest.fixture
def store(tmp_path: Path) -> FileStore:
    return FileStore(tmp_path / "files", max_bytes=10_000)


async def test_put_from_chunks_or_a_file_then_read_it_back(store: FileStore) -> None:
    data = os.urandom(9_000)
    a = await store.put("a.bin", "assistants", chunks(data))
    b = await store.put("dir/b.bin", "user_data", io.BytesIO(data))
    assert (a.bytes, a.filename, b.filename, b.purpose) == (9_000, "a.bin", "b.bin", "user_data")
    assert await store.read(a.id) == await store.read(b.id) == data
    assert (await store.path(a.id)).read_bytes() == data
    assert await store.get(a.id) == a
    record, body = await store.stream(b.id)
    assert record == b and b"".join([c async for c in body]) == data
    with sqlite3.connect(store.root / DB_NAME) as db:  # the hash is kept for later dedupe, not on the wire
        assert db.execute("SELECT sha256 FROM files WHERE id = ?", (a.id,)).fetchone() == (sha256(data).hexdigest(),)
    assert leftovers(store) == sorted([a.id, b.id])


async def test_a_file_past_the_limit_is_a_413_and_leaves_nothing(store: FileStore) -> None:
    for source in (chunks(b"x" * 10_001), io.BytesIO(b"x" * 10_001)):
        with pytest.raises(PayloadTooLargeError) as err:
            await store.put("big.bin", "assistants", source)
        assert err.value.param == "file" and "10000" in err.value.message
    assert leftovers(store) == []
    assert (await store.put("max.bin", "assistants", chunks(b"x" * 10_000))).bytes == 10_000


async def test_bad_name_purpose_or_empty_file_is_a_400_and_leaves_nothing(store: FileStore) -> None:
    for name, purpose, data, param in (
        ("../x.md", "assistants", b"x", "filename"),
        ("x\x00.md", "assistants", b"x", "filename"),
        ("x.md", "memes", b"x", "purpose"),
        ("x.md", "assistants", b"", "file"),
    ):
        with pytest.raises(BadRequestError) as err:
            await store.put(name, purpose, chunks(data))
        assert err.value.param == param
    staged = await store.stage(chunks(b"abc"))  # a name checked only at commit: the staged bytes go too
    with pytest.raises(BadRequestError):
        await store.commit(staged, "/abs.md", "assistants")
    assert leftovers(store) == []


async def test_a_cancelled_upload_leaves_nothing(store: FileStore) -> None:
    started = asyncio.Event()

    async def slow() -> AsyncIterator[bytes]:
        yield b"a" * 100
        started.set()
        await asyncio.sleep(60)
        yield b"b"

    task = asyncio.create_task(store.put("slow.bin", "assistants", slow()))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert leftovers(store) == []


async def test_concurrent_puts_are_all_kept(store: FileStore) -> None:
    made = await asyncio.gather(*(store.put(f"f{i}.txt", "batch", chunks(bytes([i]) * 5000, 97)) for i in range(10)))
    assert len({f.id for f in made}) == 10
    for i, f in enumerate(made):
        assert await store.read(f.id) == bytes([i]) * 5000
    assert [f.id for f in (await store.list(order="asc")).data] == sorted(f.id for f in made)


async def test_a_new_store_over_the_same_directory_sees_every_file(tmp_path: Path) -> None:
    first = FileStore(tmp_path, 1000)
    made = [await first.put(f"{i}.md", "assistants", chunks(b"# hi %d" % i)) for i in range(3)]
    await first.delete(made[1].id)
    first.close()
    again = FileStore(tmp_path, 1000)
    assert [f.id for f in (await again.list(order="asc")).data] == [made[0].id, made[2].id]
    assert await again.read(made[2].id) == b"# hi 2"
    with pytest.raises(NotFoundError):
        await again.get(made[1].id)


async def test_opening_sweeps_old_orphans_and_keeps_recent_ones(tmp_path: Path) -> None:
    store = FileStore(tmp_path, 1000)
    kept = await store.put("kept.md", "assistants", chunks(b"kept"))
    blobs = tmp_path / BLOBS_DIR
    old = time.time() - 7200
    for name in ("file-orphan-old", TMP_PREFIX + "old", "file-orphan-new", TMP_PREFIX + "new"):
        (blobs / name).write_bytes(b"left by a crash")
        if name.endswith("old"):
            os.utime(blobs / name, (old, old))
    os.utime(blobs / kept.id, (old, old))  # a file with its row is never swept, however old
    store.close()
    FileStore(tmp_path, 1000)
    assert sorted(os.listdir(blobs)) == sorted([kept.id, "file-orphan-new", TMP_PREFIX + "new"])


async def test_unknown_ids_and_bad_list_parameters(store: FileStore) -> None:
    for call in (store.get, store.read, store.delete, store.path, store.open):
        with pytest.raises(NotFoundError) as err:
            await call("file-missing")
        assert "file-missing" in err.value.message and err.value.param == "file_id"
    for kwargs, param in (({"limit": 0}, "limit"), ({"limit": 10_001}, "limit"), ({"order": "up"}, "order")):
        with pytest.raises(BadRequestError) as err:
            await store.list(**kwargs)  # type: ignore[arg-type]
        assert err.value.param == param
    with pytest.raises(BadRequestError):
        await store.list(purpose="memes")


def test_ids_sort_by_age() -> None:
    ids = [new_file_id(t) for t in (1_700_000_000.001, 1_700_000_000.002, 1_800_000_000.0)]
    assert ids == sorted(ids) and all(len(i) == 29 and i.startswith("file-") for i in ids)
