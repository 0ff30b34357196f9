"""A shard's change versions (what the answer cache compares): every write that changes what a search
of an index sees changes the index's version, reads and no-op writes do not, a reopened shard is a
new epoch, and a version that includes a write is only ever read once that write is visible."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ragserve.store import ChunkWrite, DocumentWrite, Shard

DIM = 8
rng = np.random.default_rng(3)


def doc(doc_id: str, text: str = "some text") -> DocumentWrite:
    vec = rng.normal(size=DIM).astype(np.float32)
    vec /= np.linalg.norm(vec)
    return DocumentWrite(doc_id, text, {}, f"h-{doc_id}-{text}", [ChunkWrite(f"{doc_id}-0", 0, text, vec)])


def version(shard: Shard, index: str = "ix") -> tuple[str, int | None, int]:
    return shard.versions([index])[0]


def test_every_write_that_changes_a_search_changes_the_version(tmp_path: Path) -> None:
    s = Shard(tmp_path)
    seen = [version(s)]
    assert seen[0][1:] == (None, 0)  # absent: no generation, stamp 0

    def changed() -> None:
        now = version(s)
        assert now not in seen, now
        seen.append(now)

    s.ensure_index("ix", DIM)
    changed()
    s.upsert_documents("ix", [doc("a"), doc("b")])
    changed()
    s.upsert_documents("ix", [doc("a", "new text")], only_existing=True)  # an update
    changed()
    s.delete_documents("ix", ["b"])
    changed()
    # nothing changes: a read, a delete of what is absent, an update or insert-if-absent that skips all
    s.search("ix", doc("q").chunks[0].vector, 3)
    s.delete_documents("ix", ["nope"])
    s.upsert_documents("ix", [doc("ghost")], only_existing=True)
    s.upsert_documents("ix", [doc("a", "other")], if_absent=True)
    s.snapshot()
    assert version(s) == seen[-1]
    s.drop_index("ix")
    assert version(s)[1:] == (None, 0)
    seen.append(version(s))
    s.upsert_documents("ix", [doc("c")])  # recreated: a new generation and a stamp never seen
    changed()
    assert version(s)[1] is not None and version(s)[1] > seen[2][1]  # type: ignore[operator]
    s.close()


def test_a_load_swap_changes_the_index_and_forgets_the_staging_copy(tmp_path: Path) -> None:
    s = Shard(tmp_path)
    s.upsert_documents("ix", [doc("a")])
    before = version(s)
    s.upsert_documents("~staging~1~ix", [doc("b")])
    assert version(s) == before  # another index (the staging copy) changed, not this one
    s.replace_index("~staging~1~ix", "ix")
    after = version(s)
    assert after != before and after[1] != before[1]
    assert s.versions(["~staging~1~ix"])[0][1:] == (None, 0)
    assert "~staging~1~ix" not in s._stamps  # what is not held is not remembered
    s.close()


def test_a_reopened_shard_is_a_new_epoch(tmp_path: Path) -> None:
    s = Shard(tmp_path)
    s.upsert_documents("ix", [doc("a")])
    first = version(s)
    s.close()
    reopened = Shard(tmp_path)
    again = version(reopened)
    assert again[0] != first[0] and again[1] == first[1]  # same data, same generation, another epoch
    reopened.close()


def test_an_index_is_stamped_only_once_its_change_is_visible_to_searches(tmp_path: Path, monkeypatch) -> None:
    """At the moment a write stamps the index (so that a version read from then on includes it), a
    search already sees the write: added documents are found, deleted ones are not, a dropped index
    is gone. A version read before a search therefore never includes a write the search missed."""
    s = Shard(tmp_path)
    a, b = doc("a"), doc("b")
    expect: dict[str, object] = {}
    checked: list[str] = []
    stamp = s._changed

    def checking(index: str) -> None:
        found = {h.doc_id for h in s.search(index, expect["probe"], 5)}  # type: ignore[arg-type]
        assert (expect["doc"] in found) == expect["present"], (expect, found)
        checked.append(str(expect["doc"]))
        stamp(index)

    monkeypatch.setattr(s, "_changed", checking)
    expect.update(probe=a.chunks[0].vector, doc="a", present=True)
    s.upsert_documents("ix", [a])
    expect.update(probe=b.chunks[0].vector, doc="b", present=True)
    s.upsert_documents("ix", [b])
    expect.update(probe=a.chunks[0].vector, doc="a", present=False)
    s.delete_documents("ix", ["a"])
    assert checked == ["a", "b", "a"]
    s.close()
