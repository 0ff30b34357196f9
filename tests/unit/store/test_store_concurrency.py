"""One shard under concurrent writers: index creation, drops racing writes, FAISS kept in commit
order, and the self-check (every chunk row has exactly one vector) that runs at open.

The races are forced, not hoped for: a hook pauses one writer at the exact point where the old code
let another one in, and gives up after a short timeout when the fixed code (correctly) keeps the
other writer out."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ragserve.store import ChunkWrite, DocumentWrite, Shard
from ragserve.store.types import IndexDroppedError, IndexExistsError

DIM = 16
PAUSE_S = 0.5  # how long a paused writer waits for the one that (on the old code) overtook it


def unit(v: np.ndarray) -> np.ndarray:
    return (v / np.linalg.norm(v)).astype(np.float32)


def make_doc(doc_id: str, seed: int, chunks: int = 2) -> DocumentWrite:
    r = np.random.default_rng(seed)
    return DocumentWrite(
        doc_id=doc_id,
        text=f"{doc_id} v{seed}",
        metadata={"seed": seed},
        hash_value=f"h{seed}",
        chunks=[
            ChunkWrite(f"{doc_id}-{k}", k, f"{doc_id} chunk {k} v{seed}", unit(r.normal(size=DIM)))
            for k in range(chunks)
        ],
    )


def consistent(s: Shard, index: str) -> bool:
    """FAISS holds exactly one vector per chunk row (checked without the shard's own verify)."""
    return s._mirror[index].ntotal == s.count_chunks(index)


def run(name: str, fn: Callable[[], Any], errors: list[BaseException]) -> threading.Thread:
    def body() -> None:
        try:
            fn()
        except BaseException as e:  # pragma: no cover - only on failure
            errors.append(e)

    t = threading.Thread(target=body, name=name)
    t.start()
    return t


def pause_after_commit(s: Shard, monkeypatch, thread: str) -> threading.Event:
    """Make the first SQLite transaction that ``thread`` commits pause right after COMMIT (for at
    most PAUSE_S); returns the event set when it is paused. The old code released the write lock
    there and only then touched FAISS, so another writer could slip in; the fixed one still holds it."""
    real = s._transaction
    paused = threading.Event()

    @contextmanager
    def hooked() -> Iterator[Any]:
        with real() as db:
            yield db
        if threading.current_thread().name == thread and not paused.is_set():
            paused.set()
            threading.Event().wait(PAUSE_S)

    monkeypatch.setattr(s, "_transaction", hooked)
    return paused


def test_two_first_writes_to_a_new_index_both_stay_searchable(tmp_path: Path, monkeypatch) -> None:
    """Writer B creates the new index and pauses before installing its empty FAISS index; writer A
    (same new index, same shard) must not complete in between only to see B replace FAISS."""
    s = Shard(tmp_path, snapshot_every=0)
    a, b = make_doc("a", 1), make_doc("b", 2)
    paused = pause_after_commit(s, monkeypatch, "B")
    errors: list[BaseException] = []
    tb = run("B", lambda: s.upsert_documents("ix", [b]), errors)
    assert paused.wait(5)
    ta = run("A", lambda: s.upsert_documents("ix", [a]), errors)
    ta.join()
    tb.join()
    assert errors == []
    assert s.count_chunks("ix") == 4 and consistent(s, "ix"), "acknowledged chunks missing from FAISS"
    assert s.search("ix", a.chunks[0].vector, 1)[0].doc_id == "a"
    assert s.verify() == []


def test_concurrent_updates_of_one_document_leave_no_ghost_vectors(tmp_path: Path, monkeypatch) -> None:
    """Update A commits, then pauses before its FAISS add; update B of the same document commits
    and applies. A's vectors must not land after B's (they would be ghosts: vectors with no row)."""
    s = Shard(tmp_path, snapshot_every=0)
    s.upsert_documents("ix", [make_doc("d", 0)])
    ver_a, ver_b = make_doc("d", 1), make_doc("d", 2)
    paused = pause_after_commit(s, monkeypatch, "A")
    errors: list[BaseException] = []
    ta = run("A", lambda: s.upsert_documents("ix", [ver_a]), errors)
    assert paused.wait(5)
    tb = run("B", lambda: s.upsert_documents("ix", [ver_b]), errors)
    ta.join()
    tb.join()
    assert errors == []
    assert s.count_chunks("ix") == 2 and consistent(s, "ix"), "ghost vectors of an overwritten version"
    text = s.get_documents("ix", ["d"])["d"].text
    live = ver_a if text == ver_a.text else ver_b
    hits = s.search("ix", ver_a.chunks[0].vector, 2) + s.search("ix", ver_b.chunks[0].vector, 2)
    assert {h.text for h in hits} <= {c.text for c in live.chunks}
    assert s.verify() == []


def test_a_snapshot_never_records_a_write_without_its_vectors(tmp_path: Path, monkeypatch) -> None:
    """A snapshot taken while a committed write had not reached FAISS recorded the write (and
    truncated its change log) without its vectors: after a restart they were missing."""
    s = Shard(tmp_path, snapshot_every=0)
    s.upsert_documents("ix", [make_doc("x", 0)])
    paused = pause_after_commit(s, monkeypatch, "A")
    errors: list[BaseException] = []
    write = s.upsert_documents
    ta = run("A", lambda: write("ix", [make_doc("y", 1)]), errors)
    assert paused.wait(5)
    s.snapshot()  # between A's commit and A's FAISS add, on the old code
    ta.join()
    assert errors == []
    del s  # a crash: no close(), no further snapshot
    reopened = Shard(tmp_path)
    assert reopened.count_chunks("ix") == 4 and consistent(reopened, "ix")


def test_a_drop_between_a_writes_check_and_its_commit_leaves_no_orphan_rows(tmp_path: Path, monkeypatch) -> None:
    """The drop lands after the write checked that the index exists and before it commits: the old
    code committed rows for the dropped index and then failed (KeyError, a 500)."""
    s = Shard(tmp_path, snapshot_every=0)
    s.upsert_documents("ix", [make_doc("a", 1)])
    real = s._transaction
    dropper: list[threading.Thread] = []
    errors: list[BaseException] = []

    def drop_first():  # type: ignore[no-untyped-def]
        if not dropper:  # the drop runs in another thread; the fixed code makes it wait for the write
            dropper.append(run("D", lambda: s.drop_index("ix"), errors))
            dropper[0].join(PAUSE_S)
        return real()

    monkeypatch.setattr(s, "_transaction", drop_first)
    with suppress(IndexDroppedError):
        s.upsert_documents("ix", [make_doc("b", 2)])
    dropper[0].join()
    assert errors == []
    rows = s._write.execute("SELECT COUNT(*) FROM chunks WHERE index_name = 'ix'").fetchone()[0]
    if s.has_index("ix"):  # the write came after the drop: a new index holding just that write
        assert rows == 2 and consistent(s, "ix")
    else:
        assert rows == 0
    assert s.verify() == []


def test_a_write_for_a_dropped_generation_is_refused_and_stores_nothing(tmp_path: Path) -> None:
    s = Shard(tmp_path, snapshot_every=0)
    gen = s.ensure_index("ix", DIM)
    s.upsert_documents("ix", [make_doc("a", 1)], generation=gen)
    assert s.drop_index("ix", generation=gen)
    with pytest.raises(IndexDroppedError):
        s.upsert_documents("ix", [make_doc("b", 2)], generation=gen)
    assert not s.has_index("ix")
    assert s._write.execute("SELECT COUNT(*) FROM chunks").fetchone()[0] == 0
    # the name is reused: a new generation, and nothing of the old one comes back
    new_gen = s.ensure_index("ix", DIM)
    assert new_gen > gen and s.count_chunks("ix") == 0
    # a shard still holding an older generation drops it when a newer one writes to it
    other = Shard(tmp_path / "other", snapshot_every=0)
    other.upsert_documents("ix", [make_doc("old", 3)], generation=gen)
    other.upsert_documents("ix", [make_doc("new", 4)], generation=new_gen)
    assert sorted(d.doc_id for d in other.list_documents("ix")[0]) == ["new"]
    with pytest.raises(IndexDroppedError):  # and refuses the old one from then on
        other.upsert_documents("ix", [make_doc("late", 5)], generation=gen)
    assert other.verify() == [] and s.verify() == []


def test_open_verifies_and_rebuilds_a_faiss_snapshot_that_disagrees_with_sqlite(tmp_path: Path, caplog) -> None:
    s = Shard(tmp_path, snapshot_every=0)
    s.upsert_documents("ix", [make_doc(f"d{i}", i) for i in range(5)])
    assert s.verify() == []
    s._mirror["ix"].add(np.stack([unit(np.ones(DIM))]), np.asarray([10_000], dtype=np.int64))  # a ghost
    assert any("10000" in p or "without a row" in p for p in s.verify())
    s.snapshot()  # the damaged FAISS state is now on disk
    del s
    with caplog.at_level("WARNING", logger="ragserve.store"):
        reopened = Shard(tmp_path)
    assert "rebuilding" in caplog.text
    assert reopened.verify() == [] and consistent(reopened, "ix")


def test_open_removes_rows_of_an_index_that_no_longer_exists(tmp_path: Path) -> None:
    """Orphans left by the old drop/write race are removed at open, so a reused name starts empty."""
    s = Shard(tmp_path, snapshot_every=0)
    s.upsert_documents("ix", [make_doc("a", 1)])
    s._write.execute("DELETE FROM indexes WHERE name = 'ix'")
    assert s.verify() != []
    del s
    reopened = Shard(tmp_path)
    assert reopened.verify() == []
    reopened.upsert_documents("ix", [make_doc("b", 2)])
    assert [d.doc_id for d in reopened.list_documents("ix")[0]] == ["b"]


def test_a_load_swaps_its_staging_copy_in_once_and_never_over_a_newer_index(tmp_path: Path) -> None:
    s = Shard(tmp_path, snapshot_every=0)
    s.upsert_documents("ix", [make_doc("live", 1)])
    s.upsert_documents("~staging~1~ix", [make_doc("snap", 2)])
    gen = s.replace_index("~staging~1~ix", "ix")
    assert gen is not None and sorted(d.doc_id for d in s.list_documents("ix")[0]) == ["snap"]
    assert s.replace_index("~staging~1~ix", "ix") == gen  # a retried call changes nothing
    assert [d.doc_id for d in s.list_documents("ix")[0]] == ["snap"] and s.list_indexes() == ["ix"]
    # another shard: a writer of the load's generation got there first, and its document wins
    other = Shard(tmp_path / "other", snapshot_every=0)
    other.upsert_documents("ix", [make_doc("old", 3)], generation=gen - 1)
    other.upsert_documents("~staging~1~ix", [make_doc("snap", 4), make_doc("both", 5)])
    other.upsert_documents("ix", [make_doc("both", 6)], generation=gen)  # drops gen - 1 on the way
    assert other.replace_index("~staging~1~ix", "ix", generation=gen) == gen
    got = {d.doc_id: d.text for d in other.list_documents("ix")[0]}
    assert got == {"snap": "snap v4", "both": "both v6"}
    # a load older than the index the shard holds is dropped instead of swapped in
    other.upsert_documents("~staging~2~ix", [make_doc("stale", 7)])
    assert other.replace_index("~staging~2~ix", "ix", generation=gen - 1) is None
    assert other.list_indexes() == ["ix"] and "stale" not in {d.doc_id for d in other.list_documents("ix")[0]}
    assert s.verify() == [] and other.verify() == []
    with pytest.raises(IndexExistsError):
        s.replace_index("~staging~3~ix", "ix", overwrite=False)


def test_a_shard_that_restarts_during_a_load_keeps_its_staging_copy(tmp_path: Path) -> None:
    """A staging copy survives a restart (the swap that follows still finds it); one whose load
    is long gone is removed at open; a swap that finds its copy missing is a 409, not an empty part."""
    from ragserve.errors import ConflictError
    from ragserve.service.shard_service import STAGING_MAX_AGE_S, ShardService

    svc = ShardService(tmp_path, 0, 1)
    svc._shard.upsert_documents("~staging~a~ix", [make_doc("a", 1)])
    svc._shard.upsert_documents("~staging~b~ix", [make_doc("b", 2)])
    svc._shard._write.execute(
        "UPDATE indexes SET created_at = created_at - ? WHERE name = '~staging~b~ix'", (STAGING_MAX_AGE_S + 1,)
    )
    svc.close()
    reopened = ShardService(tmp_path, 0, 1)
    assert reopened._shard.list_indexes() == ["~staging~a~ix"] and reopened.list_indexes() == []
    with pytest.raises(ConflictError, match="interrupted"):
        reopened.replace_index("~staging~b~ix", "ix", expect_staged=True)
    assert reopened.replace_index("~staging~a~ix", "ix", expect_staged=True) is not None
    assert reopened.list_indexes() == ["ix"] and reopened.verify() == []
    reopened.close()
