"""What a sync may take for its own, what it reads, and what it leaves in the index when a request
fails half-way: the pure helpers on hand-made cases, and ``Syncer`` against an in-memory index that
stores and hashes documents as the server does (no embedder, so these run in milliseconds)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ragserve.cli.client import ApiError
from ragserve.cli.files import FileSelector, discover, left_out_roots
from ragserve.cli.main import main
from ragserve.cli.output import printable
from ragserve.cli.sync import (
    NO_CONDITIONS_NOTICE,
    SOURCE,
    FileRefused,
    Limits,
    Syncer,
    expected_doc_id,
    read_file,
    stored_whole,
    sync_id_for,
)
from ragserve.ingest.convert import Converted, Section, file_documents
from ragserve.ingest.ids import content_hash


class MemoryIndex:
    """The document routes of one server, in memory: documents stored with the server's hash, and
    ``fail`` naming calls (``add:2`` the second add) that answer an error instead."""

    url = "memory://"

    def __init__(self, fail: dict[str, ApiError] | None = None):
        self.docs: dict[str, dict[str, Any]] = {}
        self.features = ["if_exists", "if_hash_value"]  # GET /ui/config's; [] an older server
        self.hooks: dict[str, Any] = {}  # "add:2": run just before the second add is applied
        self.before_add: Any = None  # another client's write, landing just before the next add
        self.before: dict[str, Any] = {}  # the same before the next "update" or "delete"
        self.fail = dict(fail or {})
        self.calls: dict[str, int] = {}

    def _call(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1
        hook = self.hooks.pop(f"{name}:{self.calls[name]}", None)  # another client, just before this call
        if hook is not None:
            hook()
        error = self.fail.pop(f"{name}:{self.calls[name]}", None)
        if error is not None:
            raise error

    def put(self, doc_id: str, text: str, metadata: dict[str, Any]) -> None:
        self.docs[doc_id] = {"doc_id": doc_id, "text": text, "metadata": metadata}

    def config(self) -> dict[str, Any]:
        return {"features": list(self.features)}

    def iter_documents(self, index: str, **kw: Any) -> Iterator[dict[str, Any]]:
        for d in list(self.docs.values()):
            yield {**d, "hash_value": content_hash(d["text"], d["metadata"])}

    def add_documents(
        self, index: str, documents: list[dict[str, Any]], if_exists: str | None = None
    ) -> list[dict[str, Any]]:
        """As the server: each document's record as stored; with ``if_exists="keep"`` a held id
        keeps its document. ``keep_refused``: a server before the option (422 naming it)."""
        self._call("add")
        before, self.before_add = self.before_add, None
        if before is not None:
            before()
        if if_exists is not None and "if_exists" not in self.features:
            raise ApiError(422, "if_exists: Extra inputs are not permitted")
        out = []
        for d in documents:
            if if_exists != "keep" or d["doc_id"] not in self.docs:
                self.put(d["doc_id"], d["text"], dict(d["metadata"]))
            held = self.docs[d["doc_id"]]
            out.append({**held, "hash_value": content_hash(held["text"], held["metadata"])})
        return out

    def _hash(self, doc_id: str) -> str:
        d = self.docs[doc_id]
        return content_hash(d["text"], d["metadata"])

    def update_documents(self, index: str, documents: list[dict[str, Any]]) -> dict[str, Any]:
        """As the server: a document whose stored hash is not its ``if_hash_value`` is left."""
        self._call("update")
        self._before("update")
        if any("if_hash_value" in d for d in documents) and "if_hash_value" not in self.features:
            raise AssertionError("if_hash_value sent to a server that does not list it (it would ignore it)")
        gone = [d for d in documents if d["doc_id"] not in self.docs]
        changed = []
        for d in documents:
            if d["doc_id"] not in self.docs:
                continue
            if d.get("if_hash_value", self._hash(d["doc_id"])) != self._hash(d["doc_id"]):
                changed.append({**self.docs[d["doc_id"]], "hash_value": self._hash(d["doc_id"])})
            else:
                self.put(d["doc_id"], d["text"], dict(d["metadata"]))
        return {"not_found_documents": gone, "conflicting_documents": changed}

    def delete_documents(
        self, index: str, doc_ids: list[str], if_hash_values: dict[str, str] | None = None
    ) -> dict[str, Any]:
        """As the server: a document whose stored hash is not the one ``if_hash_values`` gives is left."""
        self._call("delete")
        self._before("delete")
        if if_hash_values and "if_hash_value" not in self.features:
            raise ApiError(422, "if_hash_values: Extra inputs are not permitted")
        want = if_hash_values or {}
        left = [i for i in doc_ids if i in self.docs and want.get(i, self._hash(i)) != self._hash(i)]
        for i in doc_ids:
            if i not in left:
                self.docs.pop(i, None)
        return {"conflicting_doc_ids": left}

    def _before(self, name: str) -> None:
        hook = self.before.pop(name, None)
        if hook is not None:
            hook()

    def stats(self, index: str) -> dict[str, Any]:
        raise ApiError(404, "no stats here")


def syncer(index: MemoryIndex, root: Path, **kw: Any) -> Syncer:
    return Syncer(index, "mem", [root], base=root, use_jobs=False, **kw)  # type: ignore[arg-type]


def big(root: Path, parts: int = 5) -> Path:
    f = root / "big.txt"
    f.write_text("\n\n".join(f"Section {i}. " + "pump valve crew " * 10 for i in range(parts)))
    return f


# --- whose documents -------------------------------------------------------------------------------
def test_the_expected_id_is_the_id_file_documents_gives_every_document() -> None:
    converted = [
        Converted([Section("whole")], "t", "text"),
        Converted([Section("para one\n\npara two\n\npara three")], "t", "text"),  # split into parts
        Converted([Section("page one", 1), Section("p3 a\n\np3 b\n\np3 c", 3)], "t", "pdf", pages=3),
    ]
    for rel in ("a.md", "dir/x#part2.txt", "odd\nname.md", "long/" + "n" * 300 + ".md"):
        for c in converted:
            for d in file_documents(rel, 1_700_000_000, c, max_chars=12):
                assert expected_doc_id(d["metadata"]) == d["doc_id"], (rel, d["doc_id"])
    # what the sync never gives a path: another name, a part past the count, a page that is no number
    assert expected_doc_id({"path": "a.md"}) != "contract-2024"
    assert expected_doc_id({"path": "a.md", "part": 3, "parts": 2}) is None
    assert expected_doc_id({"path": "a.pdf", "page": "3"}) is None
    assert expected_doc_id({"title": "no path"}) is None


def test_stored_whole_needs_every_document_and_every_part() -> None:
    docs = file_documents("big.txt", 1_700_000_000, Converted([Section("a\n\nb\n\nc")], "t", "text"), 2)
    for d in docs:
        d["metadata"]["documents"] = len(docs)
    stored = {d["doc_id"]: d["metadata"] for d in docs}
    assert len(stored) == 3 and stored_whole(stored)
    assert not stored_whole(dict(list(stored.items())[:2]))  # the last request never arrived
    old = {k: {m: v for m, v in meta.items() if m != "documents"} for k, meta in stored.items()}  # an older CLI
    assert stored_whole(old) and not stored_whole({k: old[k] for k in ("big.txt#part1", "big.txt#part3")})
    pdf = file_documents("r.pdf", 1, Converted([Section("one", 1), Section("two", 2)], "r", "pdf", pages=2), 99)
    for d in pdf:
        d["metadata"]["documents"] = 2
    assert stored_whole({d["doc_id"]: d["metadata"] for d in pdf})
    assert not stored_whole({pdf[0]["doc_id"]: pdf[0]["metadata"]})


def test_a_marked_document_under_a_foreign_id_is_never_taken_for_the_syncs_own(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# A\n\nalpha")
    index = MemoryIndex()
    assert syncer(index, tmp_path).run().added == ["a.md"]
    mark = {"source": SOURCE, "sync_root": sync_id_for(tmp_path)}
    index.put("contract-2024", "The signed contract.", {**mark, "path": "a.md", "mtime": "2001-01-01T00:00:00Z"})
    index.put("hr/salaries", "Salary table.", {**mark, "path": "zz-gone.md"})
    (tmp_path / "a.md").write_text("# A\n\nalpha, edited")
    os.utime(tmp_path / "a.md", (2_000_000_000, 2_000_000_000))
    report = syncer(index, tmp_path, delete=True).run()
    assert report.ok and report.updated == ["a.md"] and report.deleted == []
    assert {"contract-2024", "hr/salaries", "a.md"} == set(index.docs)


# --- half-stored files -----------------------------------------------------------------------------
def test_a_large_file_whose_later_request_fails_leaves_nothing_behind(tmp_path: Path) -> None:
    big(tmp_path)
    (tmp_path / "small.md").write_text("# Small\n\nfine")
    limits = Limits(max_documents_per_request=2, max_document_chars=200)
    for error in (ApiError(422, "refused"), ApiError(500, "server fault")):
        index = MemoryIndex(fail={"add:2": error})
        report = syncer(index, tmp_path, limits=limits).run()
        assert not report.ok and "big.txt" in [p for p, _ in report.failed]
        assert not any(i.startswith("big.txt") for i in index.docs), index.docs.keys()
        again = syncer(index, tmp_path, limits=limits).run()  # the next run sends it whole
        assert again.ok and "big.txt" in again.added
        assert sum(i.startswith("big.txt#part") for i in index.docs) == 5


def test_a_file_whose_documents_are_not_all_stored_is_sent_again(tmp_path: Path) -> None:
    """A run killed between two requests of one file (no undo ran): the next run does not take the
    file for unchanged, though every stored part records its mtime and size."""
    big(tmp_path)
    limits = Limits(max_documents_per_request=2, max_document_chars=200)
    index = MemoryIndex()
    assert syncer(index, tmp_path, limits=limits).run().added == ["big.txt"]
    del index.docs["big.txt#part5"]
    report = syncer(index, tmp_path, limits=limits).run()
    assert report.ok and report.updated == ["big.txt"] and report.documents_sent == 1
    assert "big.txt#part5" in index.docs
    assert syncer(index, tmp_path, limits=limits).run().unchanged == ["big.txt"]


# --- another client writing meanwhile -------------------------------------------------------------
def test_a_document_another_client_writes_under_a_new_files_id_meanwhile_is_kept(tmp_path: Path) -> None:
    """The id of a new file is free when the run reads the index and taken by another client when
    its documents arrive: that document is left as it is (if_exists: keep), the file fails naming
    the writer, and the file's documents that did get in are deleted again; never the other's."""
    big(tmp_path)  # five documents, big.txt#part1..5, in one request
    (tmp_path / "small.md").write_text("# Small\n\nfine")
    limits = Limits(max_document_chars=200)
    index = MemoryIndex()
    index.before_add = lambda: index.put("big.txt#part3", "An upload of someone else.", {"by": "upload"})
    report = syncer(index, tmp_path, limits=limits).run()
    assert report.added == ["small.md"]
    assert [p for p, _ in report.failed] == ["big.txt"]
    reason = report.failed[0][1]
    assert "'big.txt#part3'" in reason and "another client" in reason and "left as it is" in reason
    assert index.docs["big.txt#part3"]["text"] == "An upload of someone else."
    assert sorted(index.docs) == ["big.txt#part3", "small.md"]
    # the next run sees the id as foreign from the start and leaves it too
    again = syncer(index, tmp_path, limits=limits).run()
    assert [p for p, _ in again.failed] == ["big.txt"] and "already in the index" in again.failed[0][1]
    assert index.docs["big.txt#part3"]["text"] == "An upload of someone else."


FOREIGN = ("An upload of someone else.", {"by": "upload"})


def test_a_retried_update_never_overwrites_what_another_client_wrote_meanwhile(tmp_path: Path) -> None:
    """A changed file's part deleted by someone and then written by another client before the sync
    adds it back: the file fails, also when its batch is sent again file by file, and the other
    client's document stays; in a batch of one file alike."""
    limits = Limits(max_document_chars=200)
    for with_small in (True, False):
        root = tmp_path / str(with_small)
        root.mkdir()
        f = big(root)
        if with_small:
            (root / "small.md").write_text("# Small\n\nfine")
        index = MemoryIndex()
        assert syncer(index, root, limits=limits).run().ok
        f.write_text(f.read_text().replace("pump", "PUMP"))
        os.utime(f, (1e9, 1e9))
        if with_small:
            (root / "small.md").write_text("# Small\n\nchanged")
        index.hooks["update:1"] = lambda index=index: index.docs.pop("big.txt#part3")
        index.hooks["add:2"] = lambda index=index: index.put("big.txt#part3", *FOREIGN)
        report = syncer(index, root, limits=limits).run()
        assert [p for p, _ in report.failed] == ["big.txt"], report
        assert report.updated == (["small.md"] if with_small else [])
        assert index.docs["big.txt#part3"]["text"] == FOREIGN[0]
        assert not any(i.startswith("big.txt") and i != "big.txt#part3" for i in index.docs)  # not half there


def test_a_concurrent_run_of_the_same_sync_never_loses_the_other_runs_documents(tmp_path: Path) -> None:
    """Run B of the same sync stores a newer version of a file while run A sends its own: A's
    requests come back with B's documents (another hash), which A never takes for its own, so it
    fails the file and its undo deletes nothing of B's."""
    limits = Limits(max_document_chars=200, max_documents_per_request=2)
    f = big(tmp_path)
    index = MemoryIndex()
    a = syncer(index, tmp_path, limits=limits)
    old = f.read_text()
    b_wrote: dict[str, str] = {}

    def run_b() -> None:
        f.write_text(old.replace("pump", "PUMP"))
        assert syncer(index, tmp_path, limits=limits).run().added == ["big.txt"]
        b_wrote.update({k: v["text"] for k, v in index.docs.items()})
        f.write_text(old)

    index.hooks["add:1"] = run_b  # after A read the index (empty), before its first request lands
    report = a.run()
    assert [p for p, _ in report.failed] == ["big.txt"] and "another run of this sync" in report.failed[0][1]
    assert len(b_wrote) == 5 and {k: v["text"] for k, v in index.docs.items()} == b_wrote


def test_the_undo_of_a_failed_file_leaves_a_part_another_client_rewrote(tmp_path: Path) -> None:
    limits = Limits(max_document_chars=200, max_documents_per_request=2)
    big(tmp_path)
    index = MemoryIndex()

    def foreign_writes() -> None:
        index.put("big.txt#part1", *FOREIGN)  # replaces this run's part1 (another client, replace)
        index.put("big.txt#part5", *FOREIGN)  # and takes part5

    index.hooks["add:3"] = foreign_writes
    report = syncer(index, tmp_path, limits=limits).run()
    assert [p for p, _ in report.failed] == ["big.txt"]
    assert sorted(index.docs) == ["big.txt#part1", "big.txt#part5"]
    assert any("left 1 document(s) of files that failed" in n for n in report.notices), report.notices


def test_a_part_the_undo_left_is_never_overwritten_by_the_file_by_file_retry(tmp_path: Path) -> None:
    """A batch fails (a part of big.txt taken by another client); the undo of big.txt leaves part 1,
    which a hand edit changed just before it; sending the batch again file by file must not update
    part 1 blindly: the retry names the hash this run wrote, meets the hand edit, and leaves it."""
    limits = Limits(max_document_chars=200, max_documents_per_request=3)
    f = big(tmp_path, parts=2)
    (tmp_path / "small.md").write_text("# Small\n\nfine")
    index = MemoryIndex()
    assert syncer(index, tmp_path, limits=limits).run().ok
    f.write_text(f.read_text().replace("pump", "PUMP"))
    os.utime(f, (1e9, 1e9))
    (tmp_path / "small.md").write_text("# Small\n\nchanged")
    index.calls = {}
    index.hooks["update:1"] = lambda: index.docs.pop("big.txt#part2")  # deleted by someone
    index.hooks["add:1"] = lambda: index.put("big.txt#part2", *FOREIGN)  # and taken by another client
    hand = ("Hand edit of part 1.", {"by": "hand"})
    index.hooks["delete:1"] = lambda: index.put("big.txt#part1", *hand)  # lands before the undo
    report = syncer(index, tmp_path, limits=limits).run()
    assert index.docs["big.txt#part1"]["text"] == hand[0] and index.docs["big.txt#part2"]["text"] == FOREIGN[0]
    assert [p for p, _ in report.failed] == ["big.txt"] and report.updated == ["small.md"], report


def test_a_failed_add_back_inside_an_update_keeps_what_the_request_stored(tmp_path: Path) -> None:
    """An update whose document was deleted meanwhile adds it back; that add failing (a 409) fails
    its file only: the other file the update stored is kept, and not taken for another's on retry."""
    (tmp_path / "a.md").write_text("# A\n\nalpha")
    (tmp_path / "b.md").write_text("# B\n\nbeta")
    index = MemoryIndex()
    assert syncer(index, tmp_path).run().added == ["a.md", "b.md"]
    for name, text in (("a.md", "# A\n\nalpha 2"), ("b.md", "# B\n\nbeta 2")):
        (tmp_path / name).write_text(text)
        os.utime(tmp_path / name, (2e9, 2e9))
    index.calls = {}
    index.hooks["update:1"] = lambda: index.docs.pop("a.md")  # another client deletes a.md's document
    index.fail = {"add:1": ApiError(409, "documents were written and deleted by other clients meanwhile; retry")}
    report = syncer(index, tmp_path).run()
    assert report.updated == ["a.md", "b.md"] and report.failed == [], report  # a.md: the retry adds it
    assert index.docs["b.md"]["text"].endswith("beta 2") and index.docs["a.md"]["text"].endswith("alpha 2")


def test_a_server_not_listing_the_features_gets_plain_writes_and_a_notice(tmp_path: Path) -> None:
    """A server whose GET /ui/config lists neither if_exists nor if_hash_value (an older ragserve,
    KAITO's) would refuse or silently ignore them: the sync sends neither, and says so in each
    report that wrote something (--watch asks once)."""
    (tmp_path / "a.md").write_text("# A\n\nalpha")
    index = MemoryIndex()
    index.features = []
    s = syncer(index, tmp_path, delete=True)
    report = s.run()
    assert report.ok and report.added == ["a.md"] and "a.md" in index.docs
    assert report.notices == [NO_CONDITIONS_NOTICE]
    (tmp_path / "a.md").write_text("# A\n\nalpha, edited")
    os.utime(tmp_path / "a.md", (2_000_000_000, 2_000_000_000))
    (tmp_path / "b.md").write_text("# B\n\nbeta")
    again = s.run()
    assert again.added == ["b.md"] and again.updated == ["a.md"] and again.notices == [NO_CONDITIONS_NOTICE]
    (tmp_path / "b.md").unlink()
    third = s.run()
    assert third.deleted == ["b.md"] and "b.md" not in index.docs


def test_a_document_another_client_changes_before_the_syncs_update_or_delete_is_left(tmp_path: Path) -> None:
    """Updates and deletes name the hash the run read (if_hash_value, if_hash_values): a sync
    document another client rewrote meanwhile is neither overwritten nor deleted."""
    (tmp_path / "a.md").write_text("# A\n\nalpha")
    (tmp_path / "b.md").write_text("# B\n\nbeta")
    index = MemoryIndex()
    assert syncer(index, tmp_path).run().added == ["a.md", "b.md"]
    (tmp_path / "a.md").write_text("# A\n\nalpha, edited")
    os.utime(tmp_path / "a.md", (2_000_000_000, 2_000_000_000))
    (tmp_path / "b.md").unlink()

    def other_client(doc_id: str) -> Any:
        return lambda: index.put(doc_id, "Rewritten by hand.", {**index.docs[doc_id]["metadata"], "by": "hand"})

    index.before = {"update": other_client("a.md"), "delete": other_client("b.md")}
    report = syncer(index, tmp_path, delete=True).run()
    assert [p for p, _ in report.failed] == ["a.md"] and "changed by" in report.failed[0][1], report.failed
    assert index.docs["a.md"]["text"] == index.docs["b.md"]["text"] == "Rewritten by hand."
    assert any("left 1 document(s) of deleted files" in n and "'b.md'" in n for n in report.notices), report.notices
    assert report.deleted == [] and report.documents_deleted == 0


# --- what is read ----------------------------------------------------------------------------------
def test_a_file_is_read_only_when_it_is_still_the_file_found(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "secret.md").write_text("SECRET")
    (root / "a.md").write_text("# A\n\nmine")
    (root / "b.md").write_text("# B\n\nmine too")
    a, b = discover([root], root, FileSelector())
    assert read_file(a, 1000) == b"# A\n\nmine"
    (root / "a.md").unlink()
    (root / "a.md").symlink_to(outside / "secret.md")  # swapped after discovery
    with pytest.raises(FileRefused):
        read_file(a, 1000)
    (root / "b.md").unlink()
    os.mkfifo(root / "b.md")  # a pipe would block the read for ever
    with pytest.raises(FileRefused):
        read_file(b, 1000)
    (root / "b.md").unlink()
    with pytest.raises(FileNotFoundError):
        read_file(b, 1000)


def test_the_servers_file_limits_fail_the_file_before_it_is_read_or_sent(tmp_path: Path, monkeypatch) -> None:
    from ragserve.cli import sync

    (tmp_path / "huge.md").write_bytes(b"x" * 5000)
    (tmp_path / "wordy.md").write_text("word " * 300)
    (tmp_path / "ok.md").write_text("# OK\n\nfine")
    opened: list[str] = []
    real_open = os.open
    monkeypatch.setattr(sync.os, "open", lambda path, *a: opened.append(Path(path).name) or real_open(path, *a))
    limits = Limits(max_file_bytes=4000, max_file_text_chars=1000)
    assert Limits.from_config({"limits": {"max_file_bytes": 4000, "max_file_text_chars": 1000}}) == limits
    index = MemoryIndex()
    report = syncer(index, tmp_path, limits=limits).run()
    assert report.added == ["ok.md"] and sorted(p for p, _ in report.failed) == ["huge.md", "wordy.md"]
    assert set(index.docs) == {"ok.md"} and "huge.md" not in opened  # refused by its size, unread


def test_a_changed_size_is_seen_without_checksum_and_older_documents_keep_working(tmp_path: Path) -> None:
    f = tmp_path / "a.md"
    f.write_text("# A\n\nserviced every second week")
    index = MemoryIndex()
    assert syncer(index, tmp_path).run().added == ["a.md"]
    before = f.stat()
    f.write_text("# A\n\nserviced every third week")  # a shorter edit, its mtime put back
    os.utime(f, ns=(before.st_atime_ns, before.st_mtime_ns))
    report = syncer(index, tmp_path).run()
    assert report.updated == ["a.md"] and "third" in index.docs["a.md"]["text"]
    # stored by an older CLI (no size, no count): compared by content, never an error, nothing re-sent
    meta = index.docs["a.md"]["metadata"]
    del meta["size"], meta["documents"]
    report = syncer(index, tmp_path).run()
    assert report.ok and report.unchanged == ["a.md"] and report.documents_sent == 0


# --- paths named on the command line --------------------------------------------------------------
def test_a_path_named_alone_that_is_left_out_is_a_usage_error(tmp_path: Path, capsys, monkeypatch) -> None:
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "build" / "docs").mkdir(parents=True)
    (repo / "build" / "docs" / "api.md").write_text("# API")
    (repo / ".gitignore").write_text("build/\n")
    (repo / "node_modules").mkdir()
    assert [why for _, why in left_out_roots([repo / "build" / "docs"], repo / "build" / "docs")]
    assert left_out_roots([repo / "build" / "docs"], repo / "build" / "docs", gitignore=False) == []
    assert left_out_roots([repo / "node_modules"], repo / "node_modules", gitignore=False)
    monkeypatch.chdir(repo)
    url = ("--url", "http://127.0.0.1:9")  # refused before any request
    code, _, err = run(capsys, *url, "ingest", "build/docs", "--index", "x", "--delete")
    assert code == 2 and "--no-gitignore" in err
    code, _, err = run(capsys, *url, "ingest", "node_modules", "--index", "x")
    assert code == 2 and "node_modules" in err
    # what a left-out path holds is not gone: a glob naming it among others keeps its documents
    (repo / "docs").mkdir()
    (repo / "docs" / "a.md").write_text("# A\n\nalpha")
    (repo / "docs" / "build").mkdir()
    (repo / "docs" / "build" / "b.md").write_text("# B\n\nbeta")
    index = MemoryIndex()
    assert sorted(Syncer(index, "mem", [repo / "docs"], use_jobs=False, gitignore=False).run().added) == [  # type: ignore[arg-type]
        "a.md",
        "build/b.md",
    ]
    named = [repo / "docs" / "a.md", repo / "docs" / "build"]
    report = Syncer(index, "mem", named, base=repo / "docs", delete=True, use_jobs=False).run()  # type: ignore[arg-type]
    assert report.deleted == [] and "build/b.md" in index.docs


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_usage_errors_exit_2(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.md").write_text("# A")
    url = ("--url", "http://127.0.0.1:9")  # nothing answers there: each is refused before a request
    for argv in (
        ("ingest", "", "--index", "x"),
        ("ingest", "a.md", "", "--index", "x"),
        ("ingest", ".", "--index", "x", "--base", ""),
        ("query", "--index", "x", "--filter", "k=nan", "q"),
        ("query", "--index", "x", "--filter", "k=1e999", "q"),
        ("query", "--index", "x", "--filter", '{"k": NaN}', "q"),
        ("query", "--index", "x", "--filter", '{"k": 1e999}', "q"),
    ):
        code, _, err = run(capsys, *url, *argv)
        assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, (argv, err)
    for argv in (
        ("--timeout", "0", "indexes"),
        ("--timeout", "-1", "indexes"),
        ("--timeout", "nan", "indexes"),
        ("indexes", "--timeout", "inf"),
        ("ingest", ".", "--index", "x", "--batch-size", "0"),
        ("ingest", ".", "--index", "x", "--batch-kb", "-5"),
        ("query", "--index", "x", "--top-k", "0", "q"),
    ):
        with pytest.raises(SystemExit) as exit_:
            main([*url, *argv])
        assert exit_.value.code == 2, argv
        capsys.readouterr()


def test_python_dash_m_runs_the_cli() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ragserve.cli", "ingest", "--help"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and "--sync-id" in done.stdout


# --- what reaches the terminal ---------------------------------------------------------------------
def test_control_characters_never_reach_the_terminal() -> None:
    assert printable("plain name.md") == "plain name.md"
    assert printable("a\tb") == "a\tb"
    for forged in ("x.pdf\n  index now: 0 documents", "t\x1b]0;PWNED\x07\x1b[2J", "a\u202egpj.exe", "\x9b2J"):
        shown = printable(forged)
        assert shown.isprintable(), shown
    assert printable("line\nnext", keep="\n") == "line\nnext"
    assert printable(os.fsdecode(b"caf\xe9")) == "caf\\xe9"
    # the joiners of emoji and of Persian and Indic words, a soft hyphen, a flag's tags print as they are
    for name in (
        "👨\u200d👩\u200d👧.md",
        "می\u200cخواهم.md",
        "क्\u200dष.md",
        "co\xadoperate.md",
        "🏴\U000e0067\U000e007f",
    ):
        assert printable(name) == name
    for reordering in ("\u200e", "\u200f", "\u202a", "\u2066", "\u2069", "\ufeff", "\u061c"):
        assert printable(f"a{reordering}b") == f"a\\u{ord(reordering):04x}b"


def test_names_and_server_data_are_printed_escaped(tmp_path: Path) -> None:
    from rich.console import Console

    from ragserve.cli.output import document_rows, print_indexes, print_report, print_sources
    from ragserve.cli.sync import SyncReport

    console = Console(file=(buf := __import__("io").StringIO()), width=200, force_terminal=True, color_system=None)
    evil = "x\x1b[2J\x1b[1;1Hrm -rf / completed"
    report = SyncReport("idx", failed=[(evil, "bad\nreason")], skipped=[(evil, "r")], notices=[evil])
    print_report(report, console, None)
    print_sources([{"doc_id": "d", "score": 1, "metadata": {"path": evil, "title": "t\x1b[8mhidden"}}], console)
    document_rows([{"doc_id": "d\x1b[2J", "text": "x", "metadata": {"path": evil, "title": evil}}], console)
    print_indexes([{"index_name": "i", "index_kind": evil, "documents": 1}], console)
    out = buf.getvalue()
    assert "\x1b[2J" not in out and "\x1b[8m" not in out and "\\x1b[2J" in out
    assert "bad\\x0areason" in out


# --- ragserve eval ---------------------------------------------------------------------------------
def test_eval_never_writes_to_or_drops_an_index_it_did_not_create(tmp_path: Path, capsys) -> None:
    from tests.live_server import serve

    data = tmp_path / "tiny"
    (data / "qrels").mkdir(parents=True)
    (data / "corpus.jsonl").write_text(json.dumps({"_id": "d1", "title": "P", "text": "pumps"}) + "\n")
    (data / "queries.jsonl").write_text(json.dumps({"_id": "q1", "text": "pumps?"}) + "\n")
    (data / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    seen: list[tuple[str, str]] = []

    async def app(scope, receive, send) -> None:  # holds index "taken"; refuses every write
        if scope["type"] != "http":
            return
        seen.append((scope["method"], scope["raw_path"].decode()))
        status, body = 500, b'{"detail": "nope"}'
        if scope["method"] == "GET" and scope["path"] == "/indexes":
            status, body = 200, b'["taken"]'
        await send(
            {"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]}
        )
        await send({"type": "http.response.body", "body": body})

    from ragserve.cli.beir import main as evaluate

    with serve(app) as url:
        assert evaluate([str(data), "--url", url, "--index", "taken"]) == 2
        assert "already exists" in capsys.readouterr().err
        assert all(method == "GET" for method, _ in seen)  # neither written nor dropped
        assert evaluate([str(data), "--url", url, "--index", "bad name/.."]) == 2
        seen.clear()
        assert evaluate([str(data), "--url", url, "--index", "fresh.1"]) == 1  # its own: dropped after the failure
        assert ("DELETE", "/indexes/fresh.1") in seen
