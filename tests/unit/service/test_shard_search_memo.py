"""A shard answers the same search again from memory while nothing in it changed, and any change
(a write to this index or another, a delete, a dropped index) makes the next search run again and
see it: warm questions cost a lookup, and a kept result is never served after a write."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from ragserve.service.shard_service import ShardService, check_layout
from ragserve.store import ChunkWrite, DocumentWrite

DIM = 8


def vec(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
    return v / np.linalg.norm(v)


def doc(doc_id: str, text: str, seed: int) -> DocumentWrite:
    return DocumentWrite(
        doc_id, text, {"n": seed}, f"h-{doc_id}-{seed}", [ChunkWrite(f"{doc_id}-0", 0, text, vec(seed))]
    )


@pytest.fixture
def shard(tmp_path: Path) -> Iterator[ShardService]:
    check_layout(tmp_path, 1)
    s = ShardService(tmp_path, 0, 1)
    for index in ("kb", "other"):
        s.ensure_index(index, DIM)
    s.upsert_documents("kb", [doc("pump", "the pump is serviced in May", 1), doc("fan", "the fan hums", 2)])
    s.upsert_documents("other", [doc("x", "the pump of another index", 3)])
    yield s
    s.close()


class Counting:
    """Counts the searches that reach the store."""

    def __init__(self, shard: ShardService) -> None:
        self.calls = 0
        inner = shard._shard.search_candidates

        def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
            self.calls += 1
            return inner(*args, **kwargs)

        shard._shard.search_candidates = counted  # type: ignore[method-assign]


def search(s: ShardService, text: str = "pump serviced", **kw) -> list:  # type: ignore[no-untyped-def]
    return s.search_indexes(["kb"], vec(1), text, 5, **kw)


def doc_ids(result: list) -> set[str]:  # type: ignore[type-arg]
    (found,) = result
    return {h.doc_id for h in found.dense} | {h.doc_id for h in found.lexical}


def test_the_same_search_again_is_answered_from_memory_and_alike(shard: ShardService) -> None:
    counting = Counting(shard)
    first = search(shard)
    again = search(shard)
    assert counting.calls == 1 and again == first and doc_ids(first) == {"pump", "fan"}
    search(shard, text="fan")  # other arguments: searched
    search(shard, metadata_filter={"n": 1})
    search(shard, mode="dense")
    shard.search_indexes(["kb"], vec(2), "pump serviced", 5)  # another vector
    assert counting.calls == 5


@pytest.mark.parametrize(
    "change",
    [
        lambda s: s.upsert_documents("kb", [doc("valve", "the pump valve", 4)]),
        lambda s: s.upsert_documents("kb", [doc("pump", "the pump is serviced in June", 1)]),  # an update
        lambda s: s.delete_documents("kb", ["pump"]),
        lambda s: s.upsert_documents("other", [doc("y", "pump pump pump", 5)]),  # another index: BM25's statistics
        lambda s: s.drop_index("other"),
    ],
    ids=["add", "update", "delete", "write-to-another-index", "drop-another-index"],
)
def test_any_change_in_the_shard_makes_the_next_search_run_again(shard: ShardService, change) -> None:  # type: ignore[no-untyped-def]
    counting = Counting(shard)
    search(shard)
    change(shard)
    after = search(shard)
    assert counting.calls == 2
    assert after == shard._search_indexes(["kb"], vec(1), "pump serviced", 5, "hybrid", None, 0.0, None)


def test_a_deleted_document_is_never_found_again(shard: ShardService) -> None:
    assert "pump" in doc_ids(search(shard))
    shard.delete_documents("kb", ["pump"])
    assert "pump" not in doc_ids(search(shard))


def test_a_write_during_a_search_leaves_the_kept_result_stale(shard: ShardService) -> None:
    """The change count is read before searching: a write that lands while the search runs is counted
    after it, so the kept result is not taken for current."""
    inner = shard._shard.search_candidates
    state = {"written": False}

    def racing(*args, **kwargs):  # type: ignore[no-untyped-def]
        out = inner(*args, **kwargs)
        if not state["written"]:
            state["written"] = True
            shard.delete_documents("kb", ["pump"])  # lands after the search read the rows
        return out

    shard._shard.search_candidates = racing  # type: ignore[method-assign]
    assert "pump" in doc_ids(search(shard))  # this search began before the delete
    assert "pump" not in doc_ids(search(shard))


def test_a_missing_index_and_errors_are_not_kept(shard: ShardService) -> None:
    assert shard.search_indexes(["nope"], vec(1), "pump", 5) == [None]
    shard.ensure_index("nope", DIM)
    shard.upsert_documents("nope", [doc("z", "pump", 6)])
    (found,) = shard.search_indexes(["nope"], vec(1), "pump", 5)
    assert found is not None and {h.doc_id for h in found.dense} == {"z"}


def test_a_write_that_fails_after_its_rows_are_searchable_still_counts_as_a_change(
    shard: ShardService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A snapshot that fails (a full disk) after the write committed: the client gets the error, the
    rows are searchable, and the change count and the index's version have moved, so neither the
    search memo nor the answer cache serves what was there before."""
    import ragserve.store.mirror as mirror

    search(shard)
    versions, changes = shard.index_versions(["kb"]), shard._shard.changes()
    shard._shard.snapshot_every = 1

    def disk_full(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(mirror, "save_snapshot", disk_full)
    with pytest.raises(OSError):
        shard.upsert_documents("kb", [doc("valve", "pump serviced valve", 1)])
    assert shard.count_documents("kb") == 3  # committed and searchable
    assert shard.index_versions(["kb"]) != versions and shard._shard.changes() != changes
    assert "valve" in doc_ids(search(shard))
    with pytest.raises(OSError):
        shard.delete_documents("kb", ["valve"])
    assert "valve" not in doc_ids(search(shard))
