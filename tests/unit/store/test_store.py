"""One shard: durability without a clean close, snapshots + change-log replay, filters, paging,
idempotence helpers, deletes, export, and concurrent readers during writes."""

from __future__ import annotations

import multiprocessing
import sqlite3
import threading
from pathlib import Path

import numpy as np
import pytest

from ragserve.store import (
    ChunkWrite,
    DimensionMismatchError,
    DocumentWrite,
    IndexNotFoundError,
    Shard,
    read_export,
)
from ragserve.store.filters import filter_sql

DIM = 16
rng = np.random.default_rng(7)


def unit(v: np.ndarray) -> np.ndarray:
    return (v / np.linalg.norm(v)).astype(np.float32)


def doc(
    i: int, *, chunks: int = 2, meta: dict | None = None, vecs: list[np.ndarray] | None = None, text: str | None = None
) -> DocumentWrite:
    vecs = vecs or [unit(rng.normal(size=DIM)) for _ in range(chunks)]
    return DocumentWrite(
        doc_id=f"d{i}",
        text=text or f"document {i}",
        metadata=meta or {"n": i},
        hash_value=f"h{i}",
        chunks=[ChunkWrite(f"n{i}-{k}", k, f"chunk {k} of {i}", v) for k, v in enumerate(vecs)],
    )


def top(shard: Shard, index: str, vec: np.ndarray, k: int = 3, flt=None) -> list[tuple[str, int]]:
    return [(h.doc_id, h.chunk_index) for h in shard.search(index, vec, k, flt)]


def test_writes_survive_a_crash_without_snapshot(tmp_path: Path) -> None:
    s = Shard(tmp_path, snapshot_every=0)
    docs = [doc(i) for i in range(30)]
    s.upsert_documents("ix", docs)
    probe = docs[11].chunks[1].vector
    before = top(s, "ix", probe)
    del s  # no close(), no snapshot: the process "crashed"
    reopened = Shard(tmp_path)
    assert reopened.count_documents("ix") == 30 and reopened.count_chunks("ix") == 60
    assert top(reopened, "ix", probe) == before
    hit = reopened.search("ix", probe, 1)[0]
    assert (hit.doc_id, hit.chunk_index) == ("d11", 1) and hit.score == pytest.approx(1.0, abs=1e-5)
    reopened.close()


def test_snapshot_then_changes_replay_equals_rebuild(tmp_path: Path) -> None:
    s = Shard(tmp_path / "a", snapshot_every=0)
    s.upsert_documents("ix", [doc(i) for i in range(20)])
    s.snapshot()
    s.upsert_documents("ix", [doc(i) for i in range(20, 30)])  # after the snapshot
    s.upsert_documents("ix", [doc(3, chunks=3)])  # replace one
    s.delete_documents("ix", ["d5", "d25"])
    probes = [unit(rng.normal(size=DIM)) for _ in range(5)]
    expected = [top(s, "ix", p, 10) for p in probes]
    del s
    replayed = Shard(tmp_path / "a")
    assert replayed._mirror["ix"].ntotal == replayed.count_chunks("ix") == 2 * 27 + 3
    assert [top(replayed, "ix", p, 10) for p in probes] == expected
    # a full rebuild (snapshot files removed) gives the same answers
    for f in (tmp_path / "a" / "faiss").iterdir():
        f.unlink()
    rebuilt = Shard(tmp_path / "a")
    assert [top(rebuilt, "ix", p, 10) for p in probes] == expected


def test_automatic_snapshots_truncate_the_change_log(tmp_path: Path) -> None:
    s = Shard(tmp_path, snapshot_every=10)
    s.upsert_documents("ix", [doc(i) for i in range(8)])  # 16 changes -> snapshot
    pending = s._write.execute("SELECT COUNT(*) FROM changes").fetchone()[0]
    assert pending == 0 and list((tmp_path / "faiss").glob("*.faiss"))
    s.close()
    assert Shard(tmp_path).count_chunks("ix") == 16


def test_filter_pagination_total_and_truncation(tmp_path: Path) -> None:
    s = Shard(tmp_path)
    s.upsert_documents(
        "ix", [doc(i, meta={"team": "a" if i % 3 == 0 else "b", "i": i}, text="x" * (i + 1)) for i in range(25)]
    )
    page, total = s.list_documents("ix", limit=10, offset=0)
    assert total == 25 and [d.doc_id for d in page] == [f"d{i}" for i in range(10)]
    page, total = s.list_documents("ix", limit=10, offset=20)
    assert total == 25 and [d.doc_id for d in page] == [f"d{i}" for i in range(20, 25)]
    page, total = s.list_documents("ix", limit=100, metadata_filter={"team": "a"})
    assert total == 9 and all(d.metadata["team"] == "a" for d in page)
    page, total = s.list_documents("ix", limit=3, offset=3, metadata_filter={"team": "a"})
    assert [d.doc_id for d in page] == ["d9", "d12", "d15"] and total == 9
    page, _ = s.list_documents("ix", limit=100, max_text_length=5)
    assert [(len(d.text), d.is_truncated) for d in page][:7] == [
        (1, False),
        (2, False),
        (3, False),
        (4, False),
        (5, False),
        (5, True),
        (5, True),
    ]
    with pytest.raises(ValueError):
        s.list_documents("ix", limit=0)
    with pytest.raises(ValueError):
        s.list_documents("ix", limit=1001)


def test_filters_respect_json_types(tmp_path: Path) -> None:
    s = Shard(tmp_path)
    s.upsert_documents(
        "ix",
        [
            doc(1, meta={"flag": True}),
            doc(2, meta={"flag": 1}),
            doc(3, meta={"flag": "1"}),
            doc(4, meta={"flag": None}),
            doc(5, meta={'we"ird key': 2.5}),
            doc(6, meta={}),
        ],
    )
    ids = lambda flt: sorted(d.doc_id for d in s.list_documents("ix", limit=100, metadata_filter=flt)[0])  # noqa: E731
    assert ids({"flag": True}) == ["d1"]
    assert ids({"flag": 1}) == ["d2"]
    assert ids({"flag": "1"}) == ["d3"]
    assert ids({"flag": None}) == ["d4"]
    assert ids({'we"ird key': 2.5}) == ["d5"]
    assert ids({"flag": 1, "other": 2}) == []
    with pytest.raises(ValueError):
        filter_sql({"x": [1, 2]})


def test_filter_applies_before_scoring(tmp_path: Path) -> None:
    s = Shard(tmp_path)
    target = unit(rng.normal(size=DIM))
    near = [doc(i, vecs=[unit(target + 0.01 * rng.normal(size=DIM))], meta={"kind": "near"}) for i in range(20)]
    far = [doc(100 + i, vecs=[unit(-target + 0.3 * rng.normal(size=DIM))], meta={"kind": "far"}) for i in range(5)]
    s.upsert_documents("ix", near + far)
    hits = s.search("ix", target, 5, {"kind": "far"})
    assert len(hits) == 5 and {h.metadata["kind"] for h in hits} == {"far"}
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert s.search("ix", target, 5, {"kind": "none"}) == []
    assert len(s.search("ix", target, 100)) == 25


def test_upsert_replaces_chunks_and_find_by_hash(tmp_path: Path) -> None:
    s = Shard(tmp_path)
    old = doc(1, chunks=3)
    s.upsert_documents("ix", [old, doc(2)])
    assert s.find_by_hash("ix", ["h1", "h2", "nope"]) == {"h1": "d1", "h2": "d2"}
    new_vec = unit(rng.normal(size=DIM))
    s.upsert_documents("ix", [DocumentWrite("d1", "new text", {"v": 2}, "h1b", [ChunkWrite("x", 0, "new", new_vec)])])
    assert s.count_chunks("ix") == 3
    assert top(s, "ix", old.chunks[2].vector, 5).count(("d1", 2)) == 0  # old chunks gone from search
    assert s.search("ix", new_vec, 1)[0].text == "new"
    got = s.get_documents("ix", ["d1", "zz"])
    assert list(got) == ["d1"] and got["d1"].hash_value == "h1b" and got["d1"].metadata == {"v": 2}
    # the replaced document keeps its place in the listing
    assert [d.doc_id for d in s.list_documents("ix")[0]] == ["d1", "d2"]


def test_delete_and_drop(tmp_path: Path) -> None:
    s = Shard(tmp_path)
    docs = [doc(i) for i in range(5)]
    s.upsert_documents("ix", docs)
    assert s.delete_documents("ix", ["d1", "d9", "d1"]) == (["d1"], ["d9"])
    assert all(h.doc_id != "d1" for h in s.search("ix", docs[1].chunks[0].vector, 10))
    assert s.count_documents("ix") == 4
    s.snapshot()
    assert s.drop_index("ix") and not s.drop_index("ix")
    assert not s.has_index("ix") and s.list_indexes() == []
    assert not list((tmp_path / "faiss").glob("*"))
    with pytest.raises(IndexNotFoundError):
        s.search("ix", docs[0].chunks[0].vector, 1)
    s.close()
    assert Shard(tmp_path).list_indexes() == []


def test_dimension_checks(tmp_path: Path) -> None:
    s = Shard(tmp_path)
    s.create_index("ix", DIM)
    s.create_index("ix", DIM)
    with pytest.raises(DimensionMismatchError):
        s.create_index("ix", DIM + 1)
    with pytest.raises(DimensionMismatchError):
        s.upsert_documents("ix", [doc(1, vecs=[unit(rng.normal(size=DIM + 1))])])
    with pytest.raises(DimensionMismatchError):
        s.search("ix", np.ones(3, dtype=np.float32), 1)
    with pytest.raises(ValueError):
        s.search("ix", np.ones(DIM, dtype=np.float32), 0)
    assert s.search("ix", unit(np.ones(DIM)), 3) == []
    with pytest.raises(ValueError):
        Shard(tmp_path / "other", faiss_kind="annoy")


def test_a_refused_search_opens_no_read_connection(tmp_path: Path) -> None:
    """Arguments are checked before a thread's read connection is opened: a stream of bad searches
    from many threads leaves no connection behind."""
    s = Shard(tmp_path)
    s.create_index("ix", DIM)
    bad = [
        lambda: s.search("nope", unit(np.ones(DIM)), 1),
        lambda: s.search("ix", np.ones(3, dtype=np.float32), 1),
        lambda: s.search_candidates("ix", unit(np.ones(DIM)), "x", 1, mode="fuzzy"),
        lambda: s.search_candidates("ix", unit(np.ones(DIM)), "x", 0),
    ]
    errors: list[Exception] = []

    def run(call) -> None:
        try:
            call()
        except (IndexNotFoundError, ValueError) as e:  # DimensionMismatchError is a ValueError
            errors.append(e)

    threads = [threading.Thread(target=run, args=(call,)) for call in bad]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(errors) == len(bad)
    assert s._readers._all == []
    s.close()


def _count_export(args: tuple[str, object]) -> int:
    path, barrier = args
    barrier.wait()  # type: ignore[attr-defined]
    _, it = read_export(path)
    return sum(1 for _ in it)


def test_an_export_is_one_file_that_many_processes_read_at_once(tmp_path: Path) -> None:
    """/load has every shard read every part at the same moment; opening a part like a shard
    database (WAL pragma on open) failed with "database is locked" in about a third of tries."""
    s = Shard(tmp_path / "s")
    s.upsert_documents("ix", [doc(i) for i in range(20)])
    ctx = multiprocessing.get_context("fork")
    with ctx.Manager() as manager, ctx.Pool(4) as pool:
        for trial in range(8):
            part = tmp_path / f"snap{trial}" / "part.sqlite"
            assert s.export_index("ix", part) == 20
            assert sorted(p.name for p in part.parent.iterdir()) == ["part.sqlite"]  # no -wal/-shm
            conn = sqlite3.connect(part)
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
            conn.close()
            barrier = manager.Barrier(4)
            assert pool.map(_count_export, [(str(part), barrier)] * 4) == [20] * 4


def test_export_round_trip(tmp_path: Path) -> None:
    s = Shard(tmp_path / "s")
    docs = [doc(i, chunks=1 + i % 3) for i in range(12)]
    s.upsert_documents("ix", docs)
    s.upsert_documents("other", [doc(99)])
    assert s.export_index("ix", tmp_path / "out" / "part.sqlite") == 12
    dim, it = read_export(tmp_path / "out" / "part.sqlite")
    got = list(it)
    assert dim == DIM and [d.doc_id for d in got] == [d.doc_id for d in docs]
    for a, b in zip(got, docs, strict=True):
        assert (a.text, a.metadata, a.hash_value) == (b.text, b.metadata, b.hash_value)
        assert [c.node_id for c in a.chunks] == [c.node_id for c in b.chunks]
        assert np.allclose(a.chunks[0].vector, b.chunks[0].vector)
    fresh = Shard(tmp_path / "t")
    fresh.upsert_documents("copy", got)
    assert top(fresh, "copy", docs[4].chunks[0].vector, 1) == [("d4", 0)]


def test_concurrent_readers_during_writes(tmp_path: Path) -> None:
    s = Shard(tmp_path, snapshot_every=50)
    s.upsert_documents("ix", [doc(i) for i in range(10)])
    errors: list[BaseException] = []
    stop = threading.Event()

    def reader() -> None:
        try:
            while not stop.is_set():
                s.search("ix", unit(rng.normal(size=DIM)), 5)
                s.list_documents("ix", limit=10, metadata_filter={"n": 3})
                s.count_documents("ix")
        except BaseException as e:  # pragma: no cover - only on failure
            errors.append(e)

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for t in threads:
        t.start()
    for batch in range(10, 210, 20):
        s.upsert_documents("ix", [doc(i) for i in range(batch, batch + 20)])
        s.delete_documents("ix", [f"d{batch}"])
    stop.set()
    for t in threads:
        t.join()
    assert errors == []
    assert s.count_documents("ix") == 210 - 10
    assert s._mirror["ix"].ntotal == s.count_chunks("ix") == 2 * 200
    assert s.verify() == []
