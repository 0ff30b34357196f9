"""The vector store catalog (SQLite) and the mapping of OpenAI filters: paging in both orders and
from both cursors, attach/detach/re-attach, deletion, concurrent writers, and every filter shape
OpenAI defines either mapped or refused by name."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from pydantic import ValidationError

from ragserve.api.vector_stores import openai_filter
from ragserve.errors import BadRequestError
from ragserve.service.vector_store_catalog import VectorStoreCatalog


def eq(key: str, value: object) -> dict:
    return {"type": "eq", "key": key, "value": value}


def both(*filters: dict) -> dict:
    return {"type": "and", "filters": list(filters)}


@pytest.fixture
def catalog(tmp_path: Path) -> VectorStoreCatalog:
    return VectorStoreCatalog(tmp_path / "vs.sqlite3")


def _stores(c: VectorStoreCatalog, n: int) -> list[str]:
    ids = [f"vs_{i:03d}" for i in range(n)]
    for sid in ids:
        c.create_store(sid, f"name {sid}", None, {}, None, [], None)
    return ids


def test_pages_cover_every_store_once_in_either_order(catalog: VectorStoreCatalog) -> None:
    ids = _stores(catalog, 7)
    for order, expected in (("asc", ids), ("desc", ids[::-1])):
        seen: list[str] = []
        after = None
        while True:
            page, more = catalog.list_stores(3, order, after=after)  # type: ignore[arg-type]
            seen += [s.id for s in page]
            if not more:
                break
            after = page[-1].id
        assert seen == expected


def test_before_gives_the_page_just_before_the_cursor(catalog: VectorStoreCatalog) -> None:
    ids = _stores(catalog, 7)
    page, more = catalog.list_stores(2, "asc", before=ids[5])
    assert [s.id for s in page] == ids[3:5] and more
    page, _ = catalog.list_stores(2, "desc", before=ids[1])  # desc: before = newer
    assert [s.id for s in page] == [ids[3], ids[2]]


def test_an_unknown_cursor_pages_from_the_start(catalog: VectorStoreCatalog) -> None:
    ids = _stores(catalog, 3)
    page, _ = catalog.list_stores(10, "asc", after="vs_gone")
    assert [s.id for s in page] == ids


def test_files_attach_reattach_detach_and_delete_with_the_store(catalog: VectorStoreCatalog) -> None:
    catalog.create_store("vs_a", "a", "desc", {"team": "x"}, None, [("file-1", {"k": "v"}, None)], "job_1")
    catalog.create_store("vs_b", "b", None, {}, None, [("file-1", {}, None)], "job_2")
    assert catalog.get_file("vs_a", "file-1").job_id == "job_1"  # type: ignore[union-attr]
    # attached again: the newer job and attributes win, the file keeps its place
    assert catalog.attach(
        "vs_a",
        [("file-2", {}, None), ("file-1", {"k": "w"}, {"max_chunk_size_tokens": 200, "chunk_overlap_tokens": 20})],
        "job_3",
    )
    rec = catalog.get_file("vs_a", "file-1")
    assert rec is not None and (rec.job_id, rec.attributes, rec.chunking) == (
        "job_3",
        {"k": "w"},
        {"max_chunk_size_tokens": 200, "chunk_overlap_tokens": 20},
    )
    assert [f.file_id for f in catalog.all_files("vs_a")] == ["file-1", "file-2"]
    assert [f.file_id for f in catalog.all_files("vs_a", job_id="job_3")] == ["file-1", "file-2"]
    assert sorted(catalog.stores_of_file("file-1")) == ["vs_a", "vs_b"]
    # paging files is per store: a cursor of the same file id in another store does not leak in
    page, more = catalog.list_files("vs_a", 1, "asc")
    assert [f.file_id for f in page] == ["file-1"] and more
    page, more = catalog.list_files("vs_a", 1, "asc", after="file-1")
    assert [f.file_id for f in page] == ["file-2"] and not more
    detached = catalog.detach("vs_a", "file-2")
    assert detached is not None and catalog.detach("vs_a", "file-2") is None
    gone = catalog.delete_store("vs_a")
    assert gone is not None and [f.file_id for f in gone[0]] == ["file-1"]
    # each forgetting recorded what is still to be removed, in its own transaction, until done
    owed = catalog.pending_removals()
    assert [(r.store_id, r.file_id) for r in owed] == [("vs_a", "file-2"), ("vs_a", None)]
    assert owed == [detached[1], gone[1]]
    catalog.removal_done(owed[0].seq)
    assert catalog.pending_removals() == [gone[1]]
    assert catalog.get_store("vs_a") is None and catalog.delete_store("vs_a") is None
    assert not catalog.attach("vs_a", [("file-9", {}, None)], "job_4")  # a deleted store takes nothing
    assert catalog.stores_of_file("file-1") == ["vs_b"]


def test_update_and_reopen_keep_what_was_committed(tmp_path: Path) -> None:
    c = VectorStoreCatalog(tmp_path / "vs.sqlite3")
    c.create_store("vs_a", "a", None, {"x": "1"}, {"max_chunk_size_tokens": 300, "chunk_overlap_tokens": 0}, [], None)
    c.update_store("vs_a", "renamed", {"y": "2"})
    c.close()
    again = VectorStoreCatalog(tmp_path / "vs.sqlite3")
    rec = again.get_store("vs_a")
    assert rec is not None and (rec.name, rec.metadata, rec.chunking) == (
        "renamed",
        {"y": "2"},
        {"max_chunk_size_tokens": 300, "chunk_overlap_tokens": 0},
    )


def test_concurrent_attaches_lose_nothing(catalog: VectorStoreCatalog) -> None:
    catalog.create_store("vs_a", "a", None, {}, None, [], None)

    def attach(t: int) -> None:
        for i in range(50):
            catalog.attach("vs_a", [(f"file-{t}-{i}", {}, None)], f"job_{t}_{i}")

    threads = [threading.Thread(target=attach, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(catalog.all_files("vs_a")) == 200


@pytest.mark.parametrize(
    ("flt", "expected"),
    [
        (None, None),
        (eq("team", "a"), {"team": "a"}),
        (both(eq("n", 3), eq("ok", True)), {"n": 3, "ok": True}),
        (both(both(eq("a", "1"))), {"a": "1"}),  # and inside and
        (both(eq("a", 1), eq("a", 1)), {"a": 1}),
    ],
)
def test_equality_filters_map(flt: dict | None, expected: dict | None) -> None:
    assert openai_filter(flt) == expected


@pytest.mark.parametrize(
    ("flt", "named"),
    [
        ({"type": "ne", "key": "a", "value": 1}, "'ne'"),
        ({"type": "gt", "key": "a", "value": 1}, "'gt'"),
        ({"type": "in", "key": "a", "value": ["x"]}, "'in'"),
        ({"type": "or", "filters": [eq("a", 1)]}, "'or'"),
        (both(eq("a", 1), {"type": "lte", "key": "b", "value": 2}), "filters.filters[1]"),
        ({"type": "regex", "key": "a", "value": "x"}, "unknown filter type"),
        (eq("", 1), "'key'"),
        (eq("a", [1]), "'value'"),
        (eq("a", None), "'value'"),
        (both(), "non-empty"),
        (both(eq("a", 1), eq("a", 2)), "two different"),
        ("eq", "filter object"),
    ],
)
def test_filters_that_cannot_map_are_refused_by_name(flt: object, named: str) -> None:
    with pytest.raises(BadRequestError) as err:
        openai_filter(flt)  # type: ignore[arg-type]
    assert named in err.value.message and err.value.param == "filters"


def test_a_deeply_nested_filter_costs_no_recursion() -> None:
    flt: dict = eq("a", 1)
    for _ in range(100):
        flt = both(flt)
    assert openai_filter(flt) == {"a": 1}
    for _ in range(100_000):  # refused by its size (MAX_FILTER_NODES), still without recursion
        flt = both(flt)
    with pytest.raises(BadRequestError, match="comparisons and compound filters"):
        openai_filter(flt)


def test_a_filter_of_more_comparisons_than_can_matter_is_refused_before_it_is_read() -> None:
    from ragserve.api.vector_stores import MAX_FILTER_NODES, SearchRequest

    eq = {"type": "eq", "key": "a", "value": 1}
    assert openai_filter({"type": "and", "filters": [eq] * (MAX_FILTER_NODES - 1)}) == {"a": 1}
    huge = {"type": "and", "filters": [eq] * 240_000}
    with pytest.raises(BadRequestError, match=f"more than {MAX_FILTER_NODES}"):
        openai_filter(huge)
    nested = {"type": "and", "filters": [{"type": "and", "filters": [eq] * 200}] * 2}
    with pytest.raises(BadRequestError, match=f"more than {MAX_FILTER_NODES}"):
        openai_filter(nested)
    with pytest.raises(ValidationError, match=f"more than {MAX_FILTER_NODES}"):
        SearchRequest.model_validate({"query": "q", "filters": huge})
    # a place is still named where a comparison is wrong
    bad = {"type": "and", "filters": [eq, {"type": "and", "filters": [eq, {"type": "gt", "key": "a", "value": 1}]}]}
    with pytest.raises(BadRequestError, match=r"filters\.filters\[1\]\.filters\[1\]: filter type 'gt'"):
        openai_filter(bad)
