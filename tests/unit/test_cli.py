"""The ``ragserve`` CLI against the whole application over real HTTP (uvicorn on loopback, real
shards and embedder, the fake OpenAI upstream as LLM): what a person typing the commands sees."""

from __future__ import annotations

import json
import os
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.cli.client import RagClient
from app.cli.main import main
from app.cli.sync import Limits, Syncer
from tests.filemakers import make_pdf
from tests.live_server import live_app


@pytest.fixture(scope="module")
def server(tmp_path_factory, embedding_model) -> Iterator[str]:
    from tests.conftest import InProcessEmbedder

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
    # the same mtime hides an edit unless --checksum (as with rsync -c)
    pumps = root / "docs" / "pumps.md"
    before = pumps.stat()
    pumps.write_text("# Pump servicing\n\nPumps are now serviced every third week.\n")
    os.utime(pumps, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert json.loads(run(capsys, "ingest", str(pumps), "--index", "proj", "--json")[1])["unchanged"] == 1
    assert json.loads(run(capsys, "ingest", str(pumps), "--index", "proj", "--json", "--checksum")[1])["updated"] == [
        "docs/pumps.md"
    ]
    (root / "docs" / "valves.html").unlink()
    code, out, _ = run(capsys, "ingest", "docs", "--index", "proj", "--json")
    assert json.loads(out)["stale"] == ["docs/valves.html"] and "docs/valves.html" in docs_of(server, "proj")
    code, out, _ = run(capsys, "ingest", "docs", "--index", "proj", "--delete", "--json")
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

        def add_then_stop(index: str, documents: list[dict]) -> list[dict]:  # Ctrl-C during the 2nd batch
            sent.append(len(documents))
            result = original(index, documents)
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
    code, out, _ = run(capsys, "chat", "--index", "plant", "--json", "When was the pump serviced?")
    answer = json.loads(out)
    assert answer["mode"] == "rag" and answer["sources"][0]["doc_id"] == "pumps.md"
    code, out, _ = run(capsys, "chat", "hello")  # no index: passthrough, said so
    assert "answered without the index: the request named no index" in out
    code, out, _ = run(capsys, "--json", "query", "--index", "plant", "pump service week")
    assert json.loads(out)["source_nodes"][0]["metadata"]["path"] == "pumps.md"
    code, out, _ = run(capsys, "indexes", "--json")
    plant = next(r for r in json.loads(out) if r["index_name"] == "plant")
    assert plant["documents"] == 1 and plant["chunks"] >= 1 and plant["bytes"] > 50
    code, out, _ = run(capsys, "indexes")
    assert "plant" in out and "documents" in out
    code, _, err = run(capsys, "query", "--index", "missing", "anything")
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
    from tests.conftest import InProcessEmbedder

    with live_app(tmp_path / "s", InProcessEmbedder(embedding_model), api_keys=["sk-test"]) as (url, _):
        code, _, err = run(capsys, "--url", url, "indexes")
        assert code == 1 and "Missing API key" in err
        monkeypatch.setenv("RAGSERVE_API_KEY", "sk-test")
        assert run(capsys, "--url", url, "indexes", "--json") == (0, "[]\n", "")
