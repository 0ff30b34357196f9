"""The ``ragserve`` CLI against the whole application over real HTTP (uvicorn on loopback, real
shards and embedder, the fake OpenAI upstream as LLM): what a person typing the commands sees."""

from __future__ import annotations

import json
import os
import threading
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ragserve.cli.client import RagClient
from ragserve.cli.main import main
from ragserve.cli.sync import Limits, Syncer, sync_id_for
from ragserve.rag.answerable import NOT_COVERED_ANSWER
from tests.filemakers import make_pdf
from tests.live_server import live_app


@pytest.fixture(scope="module")
def server(tmp_path_factory, embedding_model) -> Iterator[str]:
    from ragserve.testing.embedder import InProcessEmbedder

    with live_app(
        tmp_path_factory.mktemp("cli"),
        InProcessEmbedder(embedding_model),
        answer="Pumps are serviced weekly [1].",
        max_document_chars=3000,
    ) as (url, _):
        yield url


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def tree(root: Path) -> Path:
    (root / "docs").mkdir(parents=True)
    (root / "src").mkdir()
    (root / ".gitignore").write_text("secret.md\nbuild/\n")
    (root / ".git").mkdir()
    (root / "docs" / "pumps.md").write_text(
        "# Pump servicing\n\nLine 3's pump is serviced every week by the maintenance crew.\n"
    )
    (root / "docs" / "valves.html").write_text("<title>Valves</title><p>Valves are inspected monthly.</p>")
    (root / "docs" / "manual.pdf").write_bytes(make_pdf(["Page one covers safety.", "Page two covers cleaning."]))
    (root / "docs" / "secret.md").write_text("# Secret\n\nnot for the index")
    (root / "build").mkdir()
    (root / "build" / "out.md").write_text("# Built\n\ngenerated")
    (root / "src" / "calc.py").write_text("def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n")
    (root / "src" / "__init__.py").write_text("")
    (root / "docs" / "big.txt").write_text("\n\n".join(f"Section {i}. " + "filler words " * 40 for i in range(12)))
    (root / "docs" / "image.png").write_bytes(b"\x89PNG\r\n")
    return root


def docs_of(url: str, index: str) -> dict[str, dict]:
    with RagClient(url) as c:
        return {d["doc_id"]: d for d in c.iter_documents(index, max_text_length=None)}


def test_ingest_then_sync_updates_skips_and_deletes(server: str, tmp_path: Path, capsys, monkeypatch) -> None:
    root = tree(tmp_path / "proj")
    monkeypatch.chdir(root)
    monkeypatch.setenv("RAGSERVE_URL", server)
    code, out, err = run(capsys, "ingest", ".", "--index", "proj", "--exclude", "*.html")
    assert code == 0, out + err
    assert "4 added, 0 updated, 0 unchanged, 0 deleted, 0 failed" in out
    assert "skipped src/__init__.py: empty file" in out
    docs = docs_of(server, "proj")
    assert set(docs) == {
        "docs/pumps.md",
        "docs/manual.pdf#p1",
        "docs/manual.pdf#p2",
        "src/calc.py",
        *(f"docs/big.txt#part{i}" for i in range(1, 1 + sum(k.startswith("docs/big") for k in docs))),
    }
    assert sum(k.startswith("docs/big.txt#part") for k in docs) >= 2  # larger than max_document_chars: split
    assert all(len(d["text"]) <= 3000 for d in docs.values())
    assert docs["docs/manual.pdf#p2"]["metadata"] | {"mtime": None} == {
        "path": "docs/manual.pdf",
        "title": "manual",
        "file_type": "pdf",
        "page": 2,
        "pages": 2,
        "mtime": None,
        "source": "ragserve-cli",  # the sync's mark: only documents carrying it are ever updated or deleted
        "sync_root": sync_id_for(root),
        "size": (root / "docs" / "manual.pdf").stat().st_size,  # with mtime: unchanged without being read
        "documents": 2,  # the file's documents: a file not all of whose documents are stored is sent again
    }
    assert docs["src/calc.py"]["metadata"]["split_type"] == "code"
    assert docs["src/calc.py"]["metadata"]["language"] == "python"
    assert docs["docs/pumps.md"]["metadata"]["title"] == "Pump servicing"

    # second run: nothing to do
    code, out, _ = run(capsys, "ingest", ".", "--index", "proj", "--exclude", "*.html", "--json")
    report = json.loads(out)
    assert code == 0 and report["unchanged"] == 4 and report["documents_sent"] == 0 and report["ok"]
    assert report["stats"]["documents"] == len(docs)

    # touched only: unchanged, nothing re-embedded; edited: updated; removed: stale, then deleted
    os.utime(root / "src" / "calc.py", (1_700_000_000, 1_700_000_000))
    (root / "docs" / "pumps.md").write_text("# Pump servicing\n\nPumps are now serviced every second week.\n")
    (root / "docs" / "manual.pdf").write_bytes(make_pdf(["Page one covers safety."]))
    code, out, _ = run(capsys, "ingest", ".", "--index", "proj", "--json")  # now with the HTML file
    report = json.loads(out)
    assert sorted(report["updated"]) == ["docs/manual.pdf", "docs/pumps.md"] and report["added"] == ["docs/valves.html"]
    assert report["unchanged"] == 2
    docs = docs_of(server, "proj")
    assert "docs/manual.pdf#p2" not in docs and "every second week" in docs["docs/pumps.md"]["text"]
    # the same mtime and size hide an edit unless --checksum (as with rsync -c); another size does not
    pumps = root / "docs" / "pumps.md"
    before = pumps.stat()
    pumps.write_text("# Pump servicing\n\nPumps are now serviced every fourth week.\n")  # as long as "second"
    os.utime(pumps, ns=(before.st_atime_ns, before.st_mtime_ns))
    one = ("ingest", str(pumps), "--index", "proj", "--base", ".", "--json")  # a file of the sync of "."
    assert json.loads(run(capsys, *one)[1])["unchanged"] == 1
    assert json.loads(run(capsys, *one, "--checksum")[1])["updated"] == ["docs/pumps.md"]
    pumps.write_text("# Pump servicing\n\nPumps are now serviced every third week.\n")
    os.utime(pumps, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert json.loads(run(capsys, *one)[1])["updated"] == ["docs/pumps.md"]
    (root / "docs" / "valves.html").unlink()
    code, out, _ = run(capsys, "ingest", "docs", "--index", "proj", "--base", ".", "--json")
    assert json.loads(out)["stale"] == ["docs/valves.html"] and "docs/valves.html" in docs_of(server, "proj")
    code, out, _ = run(capsys, "ingest", "docs", "--index", "proj", "--base", ".", "--delete", "--json")
    report = json.loads(out)
    assert code == 0 and report["deleted"] == ["docs/valves.html"] and report["documents_deleted"] == 1
    after = docs_of(server, "proj")
    assert "docs/valves.html" not in after and "src/calc.py" in after  # outside the synced folder: kept


def test_failures_are_reported_and_exit_non_zero(server: str, tmp_path: Path, capsys) -> None:
    (tmp_path / "good.md").write_text("# Good\n\nA fine document about turbines.")
    (tmp_path / "broken.pdf").write_bytes(b"%PDF-1.4 garbage")
    with zipfile.ZipFile(tmp_path / "bomb.docx", "w", zipfile.ZIP_DEFLATED) as z:  # 100 MB of zeros in ~100 KB
        z.writestr("word/document.xml", b"\0" * 100_000_000)
    code, out, _ = run(capsys, "--url", server, "ingest", str(tmp_path), "--index", "mixed", "--base", str(tmp_path))
    assert code == 1
    assert "1 added" in out and "2 failed" in out and "broken.pdf: unreadable PDF" in out
    assert "bomb.docx: the DOCX file unpacks to 100000000 bytes" in out  # the server's limit, before unpacking
    code, _, err = run(capsys, "--url", server, "ingest", str(tmp_path / "nope"), "--index", "mixed")
    assert code == 2 and "no such file" in err
    code, _, err = run(capsys, "--url", server, "ingest", str(tmp_path), "--index", "bad name")
    assert code == 2 and "invalid index name" in err
    code, _, err = run(capsys, "--url", "http://127.0.0.1:9", "indexes")
    assert code == 1 and "cannot reach ragserve" in err


def test_stop_between_batches_leaves_no_file_half_indexed(server: str, tmp_path: Path) -> None:
    for i in range(6):
        (tmp_path / f"report{i}.pdf").write_bytes(make_pdf([f"Report {i} page one.", f"Report {i} page two."]))
    stop = threading.Event()
    with RagClient(server) as client:
        syncer = Syncer(client, "stopped", [tmp_path], base=tmp_path, batch_documents=2, limits=Limits())
        sent: list[int] = []
        original = client.add_documents

        def add_then_stop(index: str, documents: list[dict], **kw: Any) -> list[dict]:  # Ctrl-C in the 2nd batch
            sent.append(len(documents))
            result = original(index, documents, **kw)
            if len(sent) == 2:
                stop.set()
            return result

        client.add_documents = add_then_stop  # type: ignore[method-assign]
        report = syncer.run(stop)
    assert report.interrupted and len(report.added) == 2 and len(report.not_processed) == 4
    assert sent == [2, 2]  # each batch is one whole file (two pages)
    ids = set(docs_of(server, "stopped"))
    assert ids == {f"{f}#p{p}" for f in report.added for p in (1, 2)}
    with RagClient(server) as client:  # running again finishes the job
        assert len(Syncer(client, "stopped", [tmp_path], base=tmp_path).run().added) == 4
    assert len(docs_of(server, "stopped")) == 12


def test_chat_query_and_indexes(server: str, tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("RAGSERVE_URL", server)
    (tmp_path / "pumps.md").write_text("# Pumps\n\nLine 3's pump was serviced in week 22 by the night shift.")
    assert run(capsys, "ingest", str(tmp_path), "--index", "plant", "--base", str(tmp_path), "-q")[0] == 0
    code, out, _ = run(capsys, "chat", "--index", "plant", "When was the pump of line 3 serviced?")
    assert code == 0
    assert out.startswith("Pumps are serviced weekly [1].\n")
    assert "Sources" in out and "[1] pumps.md — Pumps  (score" in out
    # the passage of the source that supports an answer, under the answer, before the sources
    assert '\nEvidence\n  [1] "Line 3\'s pump was serviced in week 22 by the night shift."  (score' in out
    assert out.index("Evidence") < out.index("Sources")
    code, out, _ = run(capsys, "chat", "--index", "plant", "--json", "When was the pump serviced?")
    answer = json.loads(out)
    assert answer["mode"] == "rag" and answer["sources"][0]["doc_id"] == "pumps.md"
    assert answer["answerable"] is True and "week 22" in answer["evidence"][0]["text"]
    code, out, _ = run(capsys, "chat", "hello")  # no index: passthrough, said so
    assert "answered without the index: the request named no index" in out
    code, out, _ = run(capsys, "--json", "query", "--index", "plant", "pump service week")
    assert json.loads(out)["source_nodes"][0]["metadata"]["path"] == "pumps.md"
    assert "week 22" in json.loads(out)["evidence"][0]["text"]
    code, out, _ = run(capsys, "query", "--index", "plant", "When was the pump of line 3 serviced?")
    assert "\nEvidence\n  [1] \"Line 3's pump was serviced in week 22" in out
    # a question the documents do not cover: said plainly, with the closest source, and no model answer
    code, out, _ = run(capsys, "chat", "--index", "plant", "How do I connect the pump to a solar panel?")
    assert code == 0 and out.startswith(NOT_COVERED_ANSWER) and "Pumps are serviced" not in out
    assert "[1] pumps.md — Pumps  (score" in out
    code, out, _ = run(capsys, "chat", "--index", "plant", "--json", "How do I connect the pump to a solar panel?")
    assert (json.loads(out)["answerable"], json.loads(out)["reason"]) == (False, "not_covered")
    code, out, _ = run(capsys, "indexes", "--json")
    plant = next(r for r in json.loads(out) if r["index_name"] == "plant")
    assert plant["documents"] == 1 and plant["chunks"] >= 1 and plant["bytes"] > 50
    code, out, _ = run(capsys, "indexes")
    assert "plant" in out and "documents" in out
    code, _, err = run(capsys, "query", "--index", "missing", "anything")
    assert code == 1 and "No such index: 'missing' exists." in err
    # --index repeated: the indexes are searched as one, each source naming its index
    (tmp_path / "lamps.md").write_text("# Lamps\n\nThe desk lamp of line 3 charges over USB-C.")
    assert run(capsys, "ingest", str(tmp_path / "lamps.md"), "-i", "office", "--base", str(tmp_path), "-q")[0] == 0
    code, out, _ = run(capsys, "--json", "query", "-i", "plant", "-i", "office", "-i", "plant", "pump lamp line 3")
    assert code == 0 and {n["index_name"] for n in json.loads(out)["source_nodes"]} == {"plant", "office"}
    code, out, _ = run(capsys, "chat", "-i", "plant", "-i", "office", "--json", "How does the lamp of line 3 charge?")
    assert {s["index_name"] for s in json.loads(out)["sources"]} <= {"plant", "office"}
    code, _, err = run(capsys, "query", "-i", "plant", "-i", "missing", "anything")
    assert code == 1 and "No such index: 'missing' exists." in err


def test_stats_route(server: str, tmp_path: Path) -> None:
    text = "# Å\n\n" + "Ålpha text about compressors. " * 20
    (tmp_path / "a.md").write_text(text, encoding="utf-8")
    assert main(["--url", server, "ingest", str(tmp_path), "--index", "statsidx", "--base", str(tmp_path), "-q"]) == 0
    s = httpx.get(f"{server}/indexes/statsidx/stats").json()
    assert s["documents"] == 1 and s["chunks"] >= 1 and s["bytes"] == len(text.encode("utf-8"))
    assert s["index_kind"] == "flat" and s["dimension"] == 384 and s["vectors"] == s["chunks"]
    assert s["vector_bytes"] == s["vectors"] * 384 * 4
    assert sum(sh["documents"] for sh in s["shards"]) == 1
    assert httpx.get(f"{server}/indexes/none/stats").status_code == 404
    assert httpx.get(f"{server}/indexes/bad%20name/stats").status_code == 400


def test_api_keys(tmp_path: Path, embedding_model, capsys, monkeypatch) -> None:
    from ragserve.testing.embedder import InProcessEmbedder

    with live_app(tmp_path / "s", InProcessEmbedder(embedding_model), api_keys=["sk-test"]) as (url, _):
        code, _, err = run(capsys, "--url", url, "indexes")
        assert code == 1 and "Missing API key" in err
        monkeypatch.setenv("RAGSERVE_API_KEY", "sk-test")
        assert run(capsys, "--url", url, "indexes", "--json") == (0, "[]\n", "")


def test_delete_removes_only_what_this_folders_sync_created(server: str, tmp_path: Path, capsys) -> None:
    """--delete and updates touch only documents carrying this folder's mark: not a UI upload, not
    another client's document (with a ``path``), not another folder's sync, not an unmarked document
    indexed before the mark; a file whose id another owner holds fails instead of overwriting it."""
    a, b = tmp_path / "a", tmp_path / "b"
    for folder, names in ((a, ("guide.md", "notes.md", "mine.md")), (b, ("guide.md", "b-only.md"))):
        folder.mkdir()
        for name in names:
            (folder / name).write_text(f"# {name}\n\nWritten in {folder.name} about {name}.")
    with httpx.Client(base_url=server) as http:  # before any sync: a UI upload with a path the folder has
        r = http.post("/indexes/own/files", params={"filename": "notes.md", "path": "mine.md"}, content=b"# UI\n\nup")
        assert r.status_code == 200, r.text
        r = http.post(  # another client's documents, one under the same path as a file of the folder
            "/index",
            json={
                "index_name": "own",
                "documents": [
                    {"doc_id": "other", "text": "Another client's text.", "metadata": {"path": "old.md"}},
                    {"doc_id": "legacy.md", "text": "Indexed by an old CLI.", "metadata": {"path": "legacy.md"}},
                ],
            },
        )
        assert r.status_code == 200, r.text
    code, out, _ = run(capsys, "--url", server, "ingest", str(a), "--index", "own", "--delete", "--json")
    report = json.loads(out)
    assert code == 1 and report["added"] == ["guide.md", "notes.md"]
    assert report["failed"][0]["path"] == "mine.md" and "already in the index" in report["failed"][0]["reason"]
    code, out, _ = run(capsys, "--url", server, "ingest", str(b), "--index", "own", "--delete", "--json")
    report = json.loads(out)  # the other folder: its guide.md would take a's id, so it is refused
    assert code == 1 and report["added"] == ["b-only.md"] and report["deleted"] == []
    assert report["failed"][0]["path"] == "guide.md" and "another folder" in report["failed"][0]["reason"]
    docs = docs_of(server, "own")
    assert "in a about guide.md" in docs["guide.md"]["text"] and docs["mine.md"]["text"] == "# UI\n\nup"

    (a / "notes.md").unlink()
    (a / "mine.md").unlink()
    (a / "guide.md").unlink()
    (a / "new.md").write_text("# New\n\nA new file.")
    code, out, _ = run(capsys, "--url", server, "ingest", str(a), "--index", "own", "--delete", "--json")
    report = json.loads(out)
    assert code == 0 and report["deleted"] == ["guide.md", "notes.md"] and report["documents_deleted"] == 2
    code, out, _ = run(capsys, "--url", server, "ingest", str(b), "--index", "own", "--delete", "--json")
    report = json.loads(out)  # a's guide.md is gone, so b's may take the id now
    assert code == 0 and report["deleted"] == [] and report["added"] == ["guide.md"]
    docs = docs_of(server, "own")
    assert set(docs) == {"mine.md", "other", "legacy.md", "b-only.md", "new.md", "guide.md"}
    assert "in b about guide.md" in docs["guide.md"]["text"]


def test_a_folder_outside_the_current_directory_keeps_its_own_ids(
    server: str, tmp_path: Path, capsys, monkeypatch
) -> None:
    """Ids are paths relative to the folder given, whatever the working directory: files with the
    same name in two subfolders both get in, later runs find them unchanged, --delete finds them."""
    root = tmp_path / "outside" / "docs"
    for sub in ("alpha", "beta"):
        (root / sub).mkdir(parents=True)
        (root / sub / "README.md").write_text(f"# {sub}\n\nThe {sub} readme.")
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    sync = ("--url", server, "ingest", "--index", "far", "--json")
    code, out, _ = run(capsys, *sync, "../outside/docs")
    assert code == 0 and json.loads(out)["added"] == ["alpha/README.md", "beta/README.md"]
    docs = docs_of(server, "far")
    assert set(docs) == {"alpha/README.md", "beta/README.md"}
    assert {d["metadata"]["path"] for d in docs.values()} == {"alpha/README.md", "beta/README.md"}
    for cwd in (tmp_path, root / "alpha", Path("/")):  # the same folder from elsewhere: the same documents
        monkeypatch.chdir(cwd)
        code, out, _ = run(capsys, *sync, str(root))
        report = json.loads(out)
        assert code == 0 and report["unchanged"] == 2 and report["added"] == [] and report["documents_sent"] == 0
    (root / "beta" / "README.md").unlink()
    monkeypatch.chdir(tmp_path / "here")
    code, out, _ = run(capsys, *sync, "../outside/docs", "--delete")
    assert code == 0 and json.loads(out)["deleted"] == ["beta/README.md"]
    assert set(docs_of(server, "far")) == {"alpha/README.md"}
    code, _, err = run(capsys, "--url", server, "ingest", str(root), "--index", "far", "--base", str(tmp_path / "here"))
    assert code == 2 and "not inside --base" in err


def test_links_leaving_the_folder_are_skipped_and_reported(server: str, tmp_path: Path, capsys) -> None:
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "credentials.md").write_text("# Credentials\n\npassword: hunter2")
    root = tmp_path / "site"
    root.mkdir()
    (root / "page.md").write_text("# Page\n\nA public page.")
    (root / "creds.md").symlink_to(secret / "credentials.md")
    (root / "keys").symlink_to(secret)
    code, out, _ = run(capsys, "--url", server, "ingest", str(root), "--index", "links")
    assert code == 0 and "1 added" in out
    assert "skipped 2 links leaving the folder: creds.md, keys" in out
    assert set(docs_of(server, "links")) == {"page.md"}
    code, out, _ = run(capsys, "--url", server, "ingest", str(root), "--index", "links", "--json")
    assert json.loads(out)["links_outside"] == ["creds.md", "keys"]


def test_an_unconvertible_file_fails_alone(server: str, tmp_path: Path, capsys, monkeypatch) -> None:
    """A file the converter chokes on (deeply nested HTML made the HTML converter recurse past
    Python's limit) is reported with its reason; the rest is indexed and the exit status says
    something failed. The converter's failure is injected, so the test holds whatever the converter
    learns to handle."""
    from ragserve.cli import sync
    from ragserve.ingest.convert import convert

    def choking(data: bytes, filename: str, **limits: int):
        if filename == "deep.html":
            raise RecursionError("maximum recursion depth exceeded")
        return convert(data, filename, **limits)

    monkeypatch.setattr(sync, "convert", choking)
    (tmp_path / "a.md").write_text("# A\n\nFirst file.")
    (tmp_path / "deep.html").write_text("<div>" * 5_000 + "text")
    (tmp_path / "z.md").write_text("# Z\n\nLast file.")
    code, out, err = run(capsys, "--url", server, "ingest", str(tmp_path), "--index", "deep")
    assert code == 1, out + err
    assert "2 added" in out and "1 failed" in out
    assert "failed  deep.html: cannot convert the file: RecursionError: maximum recursion depth exceeded" in out
    assert "Traceback" not in out + err
    assert set(docs_of(server, "deep")) == {"a.md", "z.md"}


def test_a_converter_error_of_any_kind_spares_the_other_files(server: str, tmp_path: Path) -> None:
    from ragserve.ingest.convert import convert

    for name in ("a.md", "b.md", "c.md"):
        (tmp_path / name).write_text(f"# {name}\n\nText of {name}.")

    def flaky(data: bytes, filename: str):
        if filename == "b.md":
            raise KeyError("a bug in a converter")
        return convert(data, filename)

    with RagClient(server) as client:
        report = Syncer(client, "flaky", [tmp_path], convert_file=flaky).run()
    assert report.added == ["a.md", "c.md"] and not report.ok
    assert report.failed == [("b.md", "cannot convert the file: KeyError: 'a bug in a converter'")]


def test_chat_json_writes_only_json_on_stdout(server: str, tmp_path: Path, capsys, monkeypatch) -> None:
    """Interactive ``chat --json``: one JSON object per answer on stdout; the prompt goes to stderr."""
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO("When is the pump serviced?\nAnd the valves?\n\n"))
    code, out, err = run(capsys, "--url", server, "chat", "--json")
    assert code == 0
    decoder, pos, objects = json.JSONDecoder(), 0, []
    while pos < len(out):  # the whole of stdout is a sequence of JSON values, nothing else
        while pos < len(out) and out[pos].isspace():
            pos += 1
        if pos < len(out):
            value, pos = decoder.raw_decode(out, pos)
            objects.append(value)
    assert len(objects) == 2 and all(o["answer"] == "Pumps are serviced weekly [1]." for o in objects), out
    assert "you> " not in out and err.count("you> ") == 3


@pytest.fixture(scope="module")
def small_pages(tmp_path_factory, embedding_model) -> Iterator[str]:
    """A server whose largest listing page is 3 documents."""
    from ragserve.testing.embedder import InProcessEmbedder

    with live_app(tmp_path_factory.mktemp("pages"), InProcessEmbedder(embedding_model), max_list_limit=3) as (url, _):
        yield url


def test_docs_list_pages_through_an_index(small_pages: str, tmp_path: Path, capsys) -> None:
    server = small_pages
    for i in range(7):
        (tmp_path / f"note{i}.md").write_text(f"# Note {i}\n\nThe text of note number {i}.")
    (tmp_path / "page.html").write_text("<title>Page</title><p>An HTML page.</p>")
    assert run(capsys, "--url", server, "ingest", str(tmp_path), "--index", "listed", "-q")[0] == 0
    with httpx.Client(base_url=server) as http:
        assert http.post("/index", json={"index_name": "listed", "documents": [{"text": "By hand."}]}).is_success
    # --limit beyond the server's page (max_list_limit 3 here): paged with offset/limit
    code, out, _ = run(capsys, "--url", server, "docs", "list", "--index", "listed", "--limit", "100", "--json")
    listing = json.loads(out)
    assert code == 0 and listing["total"] == 9 and listing["count"] == 9
    ids = [d["doc_id"] for d in listing["documents"]]
    assert len(set(ids)) == 9 and {f"note{i}.md" for i in range(7)} | {"page.html"} <= set(ids)
    code, out, _ = run(capsys, "--url", server, "docs", "list", "-i", "listed", "-n", "4", "--offset", "3", "--json")
    assert [d["doc_id"] for d in json.loads(out)["documents"]] == ids[3:7]
    code, out, _ = run(capsys, "--url", server, "docs", "list", "-i", "listed", "--filter", "file_type=html", "--json")
    assert [d["doc_id"] for d in json.loads(out)["documents"]] == ["page.html"]
    code, out, _ = run(capsys, "--url", server, "docs", "list", "-i", "listed", "--limit", "5")
    assert code == 0 and "documents 1–5 of 9" in out and "4 more: --offset 5" in out and "ragserve ingest" in out
    code, out, err = run(capsys, "--url", server, "docs", "list", "-i", "nothing")
    assert code == 1 and out == "" and "No such index" in err and len(err.strip().splitlines()) == 1
    code, out, err = run(capsys, "--url", server, "docs", "list", "-i", "listed", "--filter", "[1]", "--json")
    assert code == 2 and "--filter must be a JSON object" in err and json.loads(out)["error"]["message"]
    with pytest.raises(SystemExit) as exit_:  # argparse's usage error
        main(["--url", server, "docs", "list", "-i", "listed", "--limit", "0"])
    assert exit_.value.code == 2 and "--limit/-n: must be at least 1, got 0" in capsys.readouterr().err


def test_errors_are_one_line_never_a_traceback(tmp_path: Path, capsys, monkeypatch) -> None:
    """Whatever answers (a web page that is not ragserve, a broken stream, nothing at all) or
    whatever key is given, every command ends with a one-line message and a non-zero status."""
    from tests.live_server import serve

    async def not_ragserve(scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        body = b"<html>a web page, not ragserve</html>"
        if scope["path"] == "/v1/chat/completions":
            body = b"data: {not json\n\n"
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/html")]})
        await send({"type": "http.response.body", "body": body})

    (tmp_path / "a.md").write_text("# A\n\ntext")
    with serve(not_ragserve) as url:
        for argv in (
            ("indexes",),
            ("--json", "indexes"),
            ("docs", "list", "--index", "x"),
            ("query", "--index", "x", "hi"),
            ("chat", "hi"),
            ("chat", "--no-stream", "hi"),
            ("ingest", str(tmp_path), "--index", "x"),
        ):
            code, out, err = run(capsys, "--url", url, *argv)
            assert code == 1, (argv, out, err)
            assert "Traceback" not in out + err and len(err.strip().splitlines()) == 1, (argv, err)
            assert "did not answer with JSON" in err or "not JSON" in err, (argv, err)
            if "--json" in argv:
                assert json.loads(out)["error"]["status"] == 200
    code, out, err = run(capsys, "--url", "http://127.0.0.1:9", "--api-key", "ключ", "indexes")
    assert code == 2 and "API key must be printable ASCII" in err and "Traceback" not in err
    code, out, err = run(capsys, "--url", "http://127.0.0.1:9", "ingest", str(tmp_path), "--index", "x", "--json")
    assert code == 1 and "cannot reach ragserve" in err and "cannot reach" in json.loads(out)["error"]["message"]
    code, _, err = run(capsys, "--url", "http://127.0.0.1:9", "query", "-i", "x", "--filter", "nokey", "q")
    assert code == 2 and "--filter expects key=value pairs" in err
    for bad in ("http://[::1", "ftp://host", "localhost:8000"):
        code, _, err = run(capsys, "--url", bad, "indexes")
        assert code == 2 and "check --url" in err and "Traceback" not in err, (bad, err)


def test_a_failed_listing_or_deletion_is_reported_not_swallowed(server: str, tmp_path: Path) -> None:
    from ragserve.cli.client import ApiError

    (tmp_path / "a.md").write_text("# A\n\nFirst.")
    (tmp_path / "b.md").write_text("# B\n\nSecond.")
    with RagClient(server) as client:
        syncer = Syncer(client, "denied", [tmp_path], delete=True)
        assert syncer.run().ok
        (tmp_path / "b.md").unlink()

        def denied(*args, **kwargs):
            raise ApiError(403, "this key may not write to index 'denied'")

        client.delete_documents = denied  # type: ignore[method-assign]
        report = syncer.run()
        assert not report.ok and report.fatal == "this key may not write to index 'denied'" and report.deleted == []
        client.iter_documents = denied  # type: ignore[method-assign]
        report = syncer.run()
        assert not report.ok and "may not write" in report.fatal and report.not_processed == ["a.md"]


def test_a_later_run_sees_documents_written_meanwhile(server: str, tmp_path: Path) -> None:
    """The same Syncer runs again and again under --watch: a document another client writes between
    two runs is not taken for the sync's own (neither overwritten nor deleted)."""
    (tmp_path / "a.md").write_text("# A\n\nFirst.")
    with RagClient(server) as client:
        syncer = Syncer(client, "meanwhile", [tmp_path], delete=True)
        assert syncer.run().added == ["a.md"]
        client.add_documents("meanwhile", [{"doc_id": "b.md", "text": "Theirs.", "metadata": {"path": "b.md"}}])
        (tmp_path / "b.md").write_text("# B\n\nMine.")
        report = syncer.run()
        assert [p for p, _ in report.failed] == ["b.md"] and report.deleted == []
    assert docs_of(server, "meanwhile")["b.md"]["text"] == "Theirs."


def test_a_named_sync_follows_its_folder_when_it_moves(server: str, tmp_path: Path, capsys) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    (old / "a.md").write_text("# A\n\nFirst.")
    (old / "b.md").write_text("# B\n\nSecond.")
    sync = ("--url", server, "ingest", "--index", "moved", "--json", "--delete")
    assert run(capsys, *sync, str(old), "--sync-id", "handbook")[0] == 0
    old.rename(new)
    (new / "b.md").unlink()
    code, out, _ = run(capsys, *sync, str(new))  # unnamed, the moved folder is another sync: hands off
    report = json.loads(out)
    assert code == 1 and [f["path"] for f in report["failed"]] == ["a.md"] and report["deleted"] == []
    code, out, _ = run(capsys, *sync, str(new), "--sync-id", "handbook")
    report = json.loads(out)
    assert code == 0 and report["unchanged"] == 1 and report["deleted"] == ["b.md"]
    assert docs_of(server, "moved")["a.md"]["metadata"]["sync_root"] == "handbook"


def _json_values(text: str) -> list:
    decoder, pos, values = json.JSONDecoder(), 0, []
    while pos < len(text):
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos < len(text):
            value, pos = decoder.raw_decode(text, pos)
            values.append(value)
    return values


def test_interactive_chat_reports_every_failed_turn(server: str, capsys, monkeypatch) -> None:
    """Each failed turn of an interactive chat says so (with --json as ``{"error": ...}`` on stdout,
    as the one-shot form does), the chat goes on, and the exit status says a turn failed."""
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO("hi\nagain\n"))
    code, out, err = run(capsys, "--url", server, "chat", "--json", "-i", "nosuch")
    values = _json_values(out)
    assert code == 1 and len(values) == 2, out
    assert all(v["error"]["status"] == 404 and "nosuch" in v["error"]["message"] for v in values), out
    assert err.count("ragserve: ") == 2
    monkeypatch.setattr("sys.stdin", io.StringIO("hi\n"))
    code, out, err = run(capsys, "--url", server, "chat", "-i", "nosuch")
    assert code == 1 and "nosuch" in err


def test_docs_list_never_cuts_an_id(server: str, tmp_path: Path, capsys, monkeypatch) -> None:
    """Ids are what the next command needs: whole at 80 columns and at 120; the other columns give way."""
    folder = tmp_path / "docs" / "valves" / "maintenance"
    folder.mkdir(parents=True)
    (folder / "inspection-schedule-2024.html").write_text(
        "<title>Valve inspection schedule for the whole plant</title><p>" + "Valves are inspected monthly. " * 9
    )
    (folder / "pressure-relief-handbook.pdf").write_bytes(make_pdf(["Relief valves open at 10 bar.", "Page two."]))
    assert run(capsys, "--url", server, "ingest", str(tmp_path), "--index", "wide", "-q")[0] == 0
    ids = {
        "docs/valves/maintenance/inspection-schedule-2024.html",
        "docs/valves/maintenance/pressure-relief-handbook.pdf#p1",
        "docs/valves/maintenance/pressure-relief-handbook.pdf#p2",
    }
    assert set(docs_of(server, "wide")) == ids
    for columns in ("80", "120", "60"):
        monkeypatch.setenv("COLUMNS", columns)
        code, out, _ = run(capsys, "--url", server, "docs", "list", "--index", "wide")
        assert code == 0 and all(i in out for i in ids), out
        assert all(len(line) <= int(columns) or line.strip() in ids for line in out.splitlines()), out


def test_options_are_taken_in_every_position(server: str, tmp_path: Path, capsys) -> None:
    """--json, --url and the other common options before the command, between ``docs`` and
    ``list``, or after: the same everywhere."""
    (tmp_path / "a.md").write_text("# A\n\nText.")
    assert run(capsys, "--url", server, "ingest", str(tmp_path), "--index", "where", "-q")[0] == 0
    for argv in (
        ["--json", "--url", server, "docs", "list", "-i", "where"],
        ["docs", "--json", "--url", server, "list", "-i", "where"],
        ["docs", "list", "--json", "--url", server, "-i", "where"],
        ["--url", "http://127.0.0.1:9", "docs", "--url", server, "list", "--json", "-i", "where"],
    ):
        code, out, err = run(capsys, *argv)
        assert code == 0 and [d["doc_id"] for d in json.loads(out)["documents"]] == ["a.md"], (argv, err)


def test_one_odd_file_fails_alone_never_the_run(server: str, tmp_path: Path, capsys, monkeypatch) -> None:
    """Every step of one file (its name, its modification time, reading, converting, sizing) fails
    that file alone: a name that is not UTF-8 (any bytes are a valid Linux name), an mtime past the
    year 9999, a converter calling ``sys.exit()`` or raising GeneratorExit. The rest is indexed."""
    from dataclasses import replace

    from ragserve.cli import sync
    from ragserve.ingest.convert import convert

    (tmp_path / "a.md").write_text("# A\n\nFirst file.")
    (tmp_path / "z.md").write_text("# Z\n\nLast file.")
    with open(os.path.join(os.fsencode(tmp_path), b"caf\xe9.md"), "wb") as f:
        f.write(b"# Cafe\n\nA latin-1 file name.")
    future = tmp_path / "future.md"
    future.write_text("# Future\n\nFrom the year 11476.")
    os.utime(future, (3e11, 3e11))
    if future.stat().st_mtime != 3e11:  # ext4 clamps it to 2446, tmpfs keeps it: give what tmpfs gives
        found = sync.discover
        monkeypatch.setattr(
            sync,
            "discover",
            lambda *a, **k: [replace(f, mtime=3e11) if f.rel == "future.md" else f for f in found(*a, **k)],
        )
    (tmp_path / "exit.md").write_text("# Exit\n\nThe converter exits.")
    (tmp_path / "gen.md").write_text("# Gen\n\nThe converter closes.")

    def converter(data: bytes, filename: str, **limits: int):
        if filename == "exit.md":
            raise SystemExit(3)
        if filename == "gen.md":
            raise GeneratorExit
        return convert(data, filename, **limits)

    monkeypatch.setattr(sync, "convert", converter)
    code, out, err = run(capsys, "--url", server, "ingest", str(tmp_path), "--index", "odd", "--json")
    assert code == 1, err
    report = json.loads(out)
    assert report["added"] == ["a.md", "z.md"]
    failed = {f["path"]: f["reason"] for f in report["failed"]}
    assert failed.pop("caf\\xe9.md") == "the file name is not valid UTF-8 (rename the file to index it)"
    assert failed.pop("future.md").startswith("its modification time cannot be recorded (mtime must be a finite")
    assert failed == {
        "exit.md": "cannot convert the file: SystemExit: 3",
        "gen.md": "cannot convert the file: GeneratorExit",
    }
    assert set(docs_of(server, "odd")) == {"a.md", "z.md"}
    code, out, err = run(capsys, "--url", server, "ingest", str(tmp_path), "--index", "odd")
    assert code == 1 and "2 unchanged" in out and "failed  caf\\xe9.md: the file name is not valid UTF-8" in out
    assert "Traceback" not in out + err


def test_a_file_gone_before_it_is_read_is_taken_as_gone(server: str, tmp_path: Path, capsys, monkeypatch) -> None:
    """A file removed between the listing of its folder and its reading is not a failure: it is gone,
    listed as stale, and with --delete its documents go like any removed file's."""
    from ragserve.cli import sync

    (tmp_path / "a.md").write_text("# A\n\nStays.")
    gone = tmp_path / "gone.md"
    gone.write_text("# Gone\n\nSoon removed.")
    assert run(capsys, "--url", server, "ingest", str(tmp_path), "--index", "gone", "-q")[0] == 0
    found = sync.discover

    def discover(*a, **k):
        files = found(*a, **k)
        gone.unlink(missing_ok=True)  # removed right after the listing
        return files

    monkeypatch.setattr(sync, "discover", discover)
    for delete in ((), ("--delete",)):
        gone.write_text("# Gone\n\nChanged, so it must be read.")
        os.utime(gone, (time.time() + 10, time.time() + 10))
        code, out, _ = run(capsys, "--url", server, "ingest", str(tmp_path), "--index", "gone", "--json", *delete)
        report = json.loads(out)
        assert code == 0 and report["failed"] == [], out
        assert (report["deleted"], report["stale"]) == ((["gone.md"], []) if delete else ([], ["gone.md"]))
    assert set(docs_of(server, "gone")) == {"a.md"}


def test_a_folder_whose_name_is_not_utf8_is_synced(server: str, tmp_path: Path, capsys) -> None:
    """The folder given may have any bytes in its name (its files' ids are relative to it); a path
    that is not UTF-8 in a message is written escaped, never an error of its own."""
    folder = os.path.join(os.fsencode(tmp_path), b"d\xe9")
    os.mkdir(folder)
    with open(os.path.join(folder, b"a.md"), "wb") as f:
        f.write(b"# A\n\nIn a latin-1 folder.")
    code, out, err = run(capsys, "--url", server, "ingest", os.fsdecode(folder), "--index", "latin", "--json")
    assert code == 0 and json.loads(out)["added"] == ["a.md"], err
    code, out, err = run(capsys, "--url", server, "ingest", os.fsdecode(folder) + "x", "--index", "latin", "--json")
    assert code == 2 and "no such file or directory" in json.loads(out)["error"]["message"]


def test_delete_never_removes_what_it_could_not_read(server: str, tmp_path: Path, capsys, monkeypatch) -> None:
    """A subfolder that cannot be read (EACCES, EIO) is a failure, not an empty folder: --delete
    removes nothing under it, and nothing under it is listed as gone."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.md").write_text("# A\n\nReadable.")
    (tmp_path / "sub" / "b.md").write_text("# B\n\nIn a folder soon unreadable.")
    assert run(capsys, "--url", server, "ingest", str(tmp_path), "--index", "locked", "-q")[0] == 0
    (tmp_path / "a.md").unlink()
    scandir = os.scandir

    def failing(path):  # what a non-root user gets from a mode-000 folder (root ignores modes)
        if Path(path).name == "sub":
            raise PermissionError(13, "Permission denied")
        return scandir(path)

    monkeypatch.setattr(os, "scandir", failing)
    code, out, _ = run(capsys, "--url", server, "ingest", str(tmp_path), "--index", "locked", "--delete", "--json")
    report = json.loads(out)
    assert code == 1
    assert report["failed"] == [{"path": "sub", "reason": "cannot read the folder: Permission denied"}]
    assert report["deleted"] == ["a.md"] and report["stale"] == []
    assert set(docs_of(server, "locked")) == {"sub/b.md"}
    monkeypatch.setattr(os, "scandir", lambda path: failing(Path(path).parent / "sub"))  # every folder
    code, out, _ = run(capsys, "--url", server, "ingest", str(tmp_path), "--index", "locked", "--delete", "--json")
    report = json.loads(out)
    assert code == 1 and report["failed"] == [{"path": ".", "reason": "cannot read the folder: Permission denied"}]
    assert report["deleted"] == [] and set(docs_of(server, "locked")) == {"sub/b.md"}


def test_ingest_of_a_glob_is_the_ingest_of_the_folder(server: str, tmp_path: Path, capsys, monkeypatch) -> None:
    """``cd proj && ragserve ingest docs/*`` with links in docs pointing out of it (a folder and a
    file): both are left out and listed, the ids are those of ``ragserve ingest docs``, and so is the
    sync (a later ``ingest docs --delete`` finds everything unchanged)."""
    proj, outside = tmp_path / "proj", tmp_path / "outside"
    (proj / "docs" / "sub").mkdir(parents=True)
    (outside / "deep").mkdir(parents=True)
    (proj / "docs" / "a.md").write_text("# A\n\nalpha")
    (proj / "docs" / "sub" / "b.md").write_text("# B\n\nbeta")
    (outside / "secret.md").write_text("# S\n\nsecret")
    (outside / "deep" / "s2.md").write_text("# S2\n\nsecret2")
    (proj / "docs" / "ext").symlink_to(outside)
    (proj / "docs" / "s.md").symlink_to("../../outside/secret.md")
    monkeypatch.chdir(proj)
    names = [f"docs/{n}" for n in sorted(os.listdir("docs"))]
    code, out, err = run(capsys, "--url", server, "ingest", *names, "-i", "glob", "--json")
    report = json.loads(out)
    assert code == 0, err
    assert sorted(report["added"]) == ["a.md", "sub/b.md"] and sorted(report["links_outside"]) == ["ext", "s.md"]
    assert set(docs_of(server, "glob")) == {"a.md", "sub/b.md"}
    code, out, _ = run(capsys, "--url", server, "ingest", "docs", "-i", "glob", "--delete", "--json")
    report = json.loads(out)
    assert code == 0 and report["unchanged"] == 2 and report["added"] == report["deleted"] == []
    code, out, _ = run(capsys, "--url", server, "ingest", *names, "-i", "glob", "-q")
    assert code == 0 and "2 unchanged" in out
    assert "skipped 2 links leaving the folder: ext, s.md (to index a link's target, name the target itself)" in out


def test_a_folder_link_named_alone_is_the_folder_given(server: str, tmp_path: Path, capsys, monkeypatch) -> None:
    """``ragserve ingest notes`` with ``notes`` a link to a folder elsewhere syncs that folder (it is
    what the user named), with the same ids and the same sync as naming the folder itself; a link
    inside it that leaves it is still skipped."""
    real, elsewhere = tmp_path / "store" / "notes", tmp_path / "elsewhere"
    (real / "sub").mkdir(parents=True)
    elsewhere.mkdir()
    (real / "a.md").write_text("# A\n\nalpha")
    (real / "sub" / "b.md").write_text("# B\n\nbeta")
    (elsewhere / "secret.md").write_text("# S\n\nsecret")
    (real / "leak.md").symlink_to(elsewhere / "secret.md")
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes").symlink_to(real)
    monkeypatch.chdir(work)
    code, out, err = run(capsys, "--url", server, "ingest", "notes", "-i", "linked", "--json")
    report = json.loads(out)
    assert code == 0, err
    assert sorted(report["added"]) == ["a.md", "sub/b.md"] and report["links_outside"] == ["leak.md"]
    code, out, _ = run(capsys, "--url", server, "ingest", str(real), "-i", "linked", "--delete", "--json")
    report = json.loads(out)
    assert code == 0 and report["unchanged"] == 2 and report["added"] == report["deleted"] == []


def test_indexes_never_cuts_a_name(server: str, tmp_path: Path, capsys, monkeypatch) -> None:
    """Index names (up to 128 characters) are whole at any width, as document ids are."""
    name = "maintenance-records-of-the-north-plant-valves-and-pumps-" + "x" * 40
    (tmp_path / "a.md").write_text("# A\n\nText.")
    assert run(capsys, "--url", server, "ingest", str(tmp_path), "--index", name, "-q")[0] == 0
    for columns in ("80", "120", "200"):
        monkeypatch.setenv("COLUMNS", columns)
        code, out, _ = run(capsys, "--url", server, "indexes")
        assert code == 0 and name in out, out


def test_a_watch_ends_with_the_status_of_its_last_run(server: str, tmp_path: Path, capsys, monkeypatch) -> None:
    """``--watch`` stopped with Ctrl-C exits 1 when its last run left a file failed, as one run does."""
    from ragserve.cli import main as cli_main

    (tmp_path / "a.md").write_text("# A\n\nFine.")

    def one_more_run(syncer, stop, on_report, poll_s=1.0):  # the watch's loop: one change, then Ctrl-C
        (tmp_path / "bad.pdf").write_bytes(b"%PDF-1.4 not really")
        on_report(syncer.run(stop))
        stop.set()

    monkeypatch.setattr(cli_main, "watch", one_more_run)
    code, out, _ = run(capsys, "--url", server, "ingest", str(tmp_path), "--index", "watched-status", "--watch")
    assert code == 1 and "failed  bad.pdf" in out, out
