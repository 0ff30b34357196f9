"""The routes for people: the /ui page and assets (open), its config (keyed, no secrets), file
upload converted on the server, and index stats; every client mistake a 4xx."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest
from fastapi.testclient import TestClient

from ragserve.testing.fake_openai import FakeOpenAI
from ragserve.testing.inprocess import inprocess_app
from tests.filemakers import make_docx, make_pdf

KEY = "sk-routes-test"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def client(tmp_path_factory, embedding_model) -> Iterator[TestClient]:
    from ragserve.testing.embedder import InProcessEmbedder

    with (
        FakeOpenAI(answer="ok", model="fake-model", max_model_len=4096) as fake,
        inprocess_app(
            tmp_path_factory.mktemp("routes"),
            InProcessEmbedder(embedding_model),
            fake.url.replace("http://", "http://user:hunter2@"),
            api_keys=[KEY],
            llm_api_key="sk-upstream-secret",
        ) as (app, _),
        TestClient(app) as c,
    ):
        yield c


def test_page_and_assets_load_without_a_key_but_api_calls_need_one(client: TestClient) -> None:
    r = client.get("/ui", follow_redirects=False)
    assert r.status_code == 308 and r.headers["location"] == "ui/"
    page = client.get("/ui/")
    assert page.status_code == 200 and "<title>ragserve playground</title>" in page.text
    assert "://" not in page.text  # nothing fetched from outside
    for asset, kind in (("app.js", "javascript"), ("md.js", "javascript"), ("style.css", "css")):
        r = client.get(f"/ui/static/{asset}")
        assert r.status_code == 200 and kind in r.headers["content-type"] and "://" not in r.text
    assert client.get("/ui/static/nope.js").status_code == 404
    assert client.get("/ui/static/../indexes").status_code in (401, 404)  # never the API without a key
    assert client.get("/ui/static/%2e%2e/%2e%2e/app/config.py").status_code == 404
    assert client.get("/ui/config").status_code == 401
    assert client.get("/indexes").status_code == 401


def test_config_shows_settings_in_force_and_no_secret(client: TestClient) -> None:
    r = client.get("/ui/config", headers=AUTH)
    assert r.status_code == 200
    c = r.json()
    assert c["model"] == "fake-model" and c["context_window"] == 4096 and c["auth_required"] is True
    assert c["limits"]["max_documents_per_request"] == 1000 and c["settings"]["faiss_index_kind"] == "flat"
    assert c["settings"]["llm_url"].startswith("http://127.0.0.1:")  # credentials in the URL removed
    assert KEY not in r.text and "sk-upstream-secret" not in r.text and "hunter2" not in r.text
    assert "storage_dir" not in c["settings"]


def test_upload_converts_replaces_and_refuses_mistakes(client: TestClient) -> None:
    def up(body: bytes, **params: str):
        return client.post("/indexes/up/files", params=params, content=body, headers=AUTH)

    r = up(
        make_pdf(["Pumps are checked daily.", "Valves are checked weekly.", "Fans are checked monthly."]),
        filename="checks.pdf",
        mtime="1700000000",
    )
    assert r.status_code == 200, r.text
    assert r.json()["doc_ids"] == ["uploads/checks.pdf#p1", "uploads/checks.pdf#p2", "uploads/checks.pdf#p3"]
    listing = client.get("/indexes/up/documents", params={"metadata_filter": '{"page": 2}'}, headers=AUTH).json()
    assert listing["documents"][0]["metadata"] == {
        "path": "uploads/checks.pdf",
        "title": "checks",
        "file_type": "pdf",
        "page": 2,
        "pages": 3,
        "mtime": "2023-11-14T22:13:20Z",
    }
    r = up(make_pdf(["Pumps are checked daily."]), filename="checks.pdf")  # a new, shorter version
    assert r.json()["deleted_doc_ids"] == ["uploads/checks.pdf#p2", "uploads/checks.pdf#p3"]
    assert client.get("/indexes/up/stats", headers=AUTH).json()["documents"] == 1
    r = up(
        make_docx([("Heading1", "Shift plan"), ("", "Night shift starts at ten.")]),
        filename="plan.docx",
        path="team/plan.docx",
    )
    assert r.json()["doc_ids"] == ["team/plan.docx"] and r.json()["title"] == "Shift plan"
    r = up(b"def f():\n    return 1\n", filename="tool.py")
    doc = client.get("/indexes/up/documents", params={"metadata_filter": '{"file_type": "code"}'}, headers=AUTH).json()[
        "documents"
    ][0]
    assert doc["metadata"]["split_type"] == "code" and doc["metadata"]["language"] == "python"

    assert up(b"\x89PNG", filename="photo.png").status_code == 415
    assert up(b"", filename="a.md").status_code == 400
    assert up(b"   \n", filename="a.md").status_code == 400
    assert up(b"%PDF-1.4 broken", filename="b.pdf").status_code == 400
    many = up(make_pdf([f"Page {i}." for i in range(1, 1_002)]), filename="many.pdf")  # 1,001 documents
    assert many.status_code == 413 and "more than 1000 pages of text" in many.json()["detail"]
    assert up(b"text", filename="a.md", path="../../etc/passwd").status_code == 400
    assert up(b"text", filename="a.md", path="/abs.md").status_code == 400
    assert (
        client.post("/indexes/bad%20name/files", params={"filename": "a.md"}, content=b"x", headers=AUTH).status_code
        == 400
    )
    assert client.post("/indexes/up/files", content=b"x", headers=AUTH).status_code == 422  # no filename


def test_upload_names_are_checked_alike_and_each_refusal_names_its_rule(client: TestClient) -> None:
    """filename and path: one normalisation (backslashes are separators) and one set of rules, each
    refusal naming the parameter sent and the rule broken."""

    def up(**params: str) -> httpx.Response:
        return client.post("/indexes/names/files", params=params, content=b"# T\ntext", headers=AUTH)

    refused = {
        (("filename", "a\x00.md"),): ("filename", "control or format characters"),
        (("filename", "a.md\x00.exe"),): ("filename", "control or format characters"),
        (("filename", "a\u202e.md"),): ("filename", "control or format characters"),
        (("filename", ".."),): ("filename", "'..'"),
        (("filename", "a.md"), ("path", "..\\..\\x.md")): ("path", "'..'"),
        (("filename", "a.md"), ("path", "docs\\..\\x.md")): ("path", "'..'"),
        (("filename", "a.md"), ("path", "a\x7fb.md")): ("path", "control or format characters"),
        (("filename", "a.md"), ("path", "a\x85b.md")): ("path", "control or format characters"),  # C1
        (("filename", "a.md"), ("path", "a\u202eb.md")): ("path", "control or format characters"),
        (("filename", "a.md"), ("path", "a\u200bb.md")): ("path", "control or format characters"),
        (("filename", "a.md"), ("path", "a\nb.md")): ("path", "control or format characters"),
        (("filename", "a.md"), ("path", "/abs.md")): ("path", "relative"),
        (("filename", "a.md"), ("path", "dir/")): ("path", "file name"),
    }
    for params, (param, rule) in refused.items():
        r = up(**dict(params))
        body = r.json()
        assert r.status_code == 400 and body["detail"].startswith(param) and rule in body["detail"], (params, body)
    r = up(filename="a.md", path="docs\\sub\\.\\x.md")
    assert r.status_code == 200 and r.json()["path"] == "docs/sub/x.md" and r.json()["doc_ids"] == ["docs/sub/x.md"]
    r = up(filename="a" * 600 + ".md")
    assert r.status_code == 422 and "filename" in r.text
    r = up(filename="a.exe")
    assert r.status_code == 415 and "unsupported file type" in r.json()["detail"]
    assert client.get("/indexes/names/stats", headers=AUTH).json()["documents"] == 1


@pytest.fixture()
def busy_app(tmp_path, embedding_model, monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """At most 2 conversions at once, 2 s each; files named slow* convert for a minute."""
    import ragserve.ingest.convert as convert_module
    from ragserve.testing.embedder import InProcessEmbedder
    from tests.convert_children import slow_unless_quick

    monkeypatch.setattr(convert_module, "_convert_child", slow_unless_quick)
    with (
        FakeOpenAI(answer="ok", model="fake-model", max_model_len=4096) as fake,
        inprocess_app(
            tmp_path, InProcessEmbedder(embedding_model), fake.url, max_concurrent_conversions=2, max_convert_seconds=2
        ) as (app, _),
    ):
        yield app


def test_slow_uploads_are_bounded_and_leave_the_rest_of_the_server_alone(
    busy_app: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Conversions run max_concurrent_conversions at once on threads of their own: a document
    indexed during eight slow uploads answers at once (the default executor, which chunking uses, is
    not theirs); an upload that finds every slot busy past the short wait is a 503 with Retry-After;
    one that runs past max_convert_seconds a 422 naming it; one that waits within the wait converts."""
    import ragserve.service.files as files

    async def main() -> None:
        transport = httpx.ASGITransport(app=busy_app)  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=60) as ac:

            async def upload(name: str) -> httpx.Response:
                return await ac.post(f"/indexes/kb/files?filename={name}", content=b"# T\nslow text")

            monkeypatch.setattr(files, "CONVERT_QUEUE_WAIT_S", 0.3, raising=False)
            slow = [asyncio.create_task(upload(f"slow{i}.md")) for i in range(8)]
            await asyncio.sleep(0.2)
            start = time.perf_counter()
            small = {"index_name": "kb", "documents": [{"text": "a small doc", "doc_id": "z"}]}
            r = await ac.post("/index", json=small)
            took = time.perf_counter() - start
            assert r.status_code == 200 and took < 1.5, (r.text, took)
            answers = await asyncio.gather(*slow)
            statuses = sorted(a.status_code for a in answers)
            assert statuses == [422, 422] + [503] * 6, [a.text for a in answers]
            for a in answers:
                if a.status_code == 422:
                    assert a.json()["detail"].startswith("slow") and "max_convert_seconds" in a.json()["detail"]
                    assert "split" not in a.json()["detail"]
                else:
                    assert int(a.headers["retry-after"]) >= 1 and "max_concurrent_conversions" in a.json()["detail"]

            monkeypatch.setattr(files, "CONVERT_QUEUE_WAIT_S", 5.0)
            slow = [asyncio.create_task(upload(f"slow{i}.md")) for i in range(2)]
            await asyncio.sleep(0.2)
            quick = await upload("quick.md")  # waits for a slot, within the wait: converted
            assert quick.status_code == 200, quick.text
            assert [a.status_code for a in await asyncio.gather(*slow)] == [422, 422]

    asyncio.run(main())


def test_stats_of_missing_index_is_404(client: TestClient) -> None:
    r = client.get("/indexes/missing/stats", headers=AUTH)
    assert r.status_code == 404 and r.json() == {"detail": "No such index: 'missing' exists."}


def test_upload_mtime_must_be_a_finite_time_a_date_can_hold(client: TestClient) -> None:
    """1e20 and inf overflowed the date conversion (a 500): a 422 that says the range."""
    for value in ("1e20", "inf", "-inf", "nan", "253402300800", "-1"):
        r = client.post(
            "/indexes/up/files", params={"filename": "t.md", "mtime": value}, content=b"# T\nbody", headers=AUTH
        )
        assert r.status_code == 422, (value, r.text)
        assert "mtime" in r.text
    r = client.post(
        "/indexes/up/files", params={"filename": "t.md", "mtime": "253402300799"}, content=b"# T\nx", headers=AUTH
    )
    assert r.status_code == 200 and r.json()["title"] == "T"


def test_upload_as_a_multipart_form_is_refused_with_how_to_send_it(client: TestClient) -> None:
    """curl -F stored the multipart envelope as the file's text (a 200): a 415 saying how to send it."""
    r = client.post(
        "/indexes/up/files", params={"filename": "doc.md"}, files={"file": ("doc.md", b"# Doc\ntext")}, headers=AUTH
    )
    assert r.status_code == 415 and "--data-binary" in r.json()["detail"]
    listing = client.get(
        "/indexes/up/documents", params={"metadata_filter": '{"path": "uploads/doc.md"}'}, headers=AUTH
    )
    assert listing.status_code == 404 or listing.json()["total_items"] == 0  # nothing stored


def test_upload_of_hostile_files_is_a_4xx_and_stores_nothing(client: TestClient) -> None:
    import io
    import zipfile

    def up(body: bytes, filename: str):
        return client.post("/indexes/hostile/files", params={"filename": filename}, content=body, headers=AUTH)

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("word/document.xml", b"\0" * 200_000_000)
    bomb = buf.getvalue()
    r = up(bomb, "bomb.docx")
    assert r.status_code == 413 and "max_unpacked_bytes" in r.json()["detail"] and str(64 * 1024 * 1024) in r.text
    assert up(bomb, "bomb.pptx").status_code == 413
    assert up(bomb, "bomb.pdf").status_code == 400  # not a PDF
    assert up(b"\x00garbage" * 100, "garbage.docx").status_code == 400
    assert up(b"\x00garbage" * 100, "garbage.pptx").status_code == 400
    deep = b"<div>" * 20_000 + b"<p>deep text</p>"
    r = up(deep, "deep.html")
    assert r.status_code == 200, r.text
    long = "word " * 20_000  # a 100,000-character title: over the metadata's 65,536 (was a 500)
    for body, name in (
        (f"# {long}\ntext".encode(), "long.md"),
        (f"<title>{long}</title><p>x</p>".encode(), "long.html"),
    ):
        r = up(body, name)
        assert r.status_code == 200, r.text
        assert 0 < len(r.json()["title"]) <= 512
    assert client.get("/indexes/hostile/stats", headers=AUTH).json()["documents"] == 3  # deep, long.md, long.html


def test_the_page_and_its_assets_send_security_headers(client: TestClient) -> None:
    """CSP without inline script or style (the page has none), no framing, no type sniffing."""
    import re

    for path in ("/ui", "/ui/", "/ui/static/app.js", "/ui/static/md.js", "/ui/static/style.css", "/favicon.ico"):
        r = client.get(path, follow_redirects=False)
        csp = r.headers.get("content-security-policy", "")
        assert "frame-ancestors 'none'" in csp and "script-src 'self'" in csp, (path, r.headers)
        assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
        assert r.headers.get("x-frame-options") == "DENY" and r.headers.get("x-content-type-options") == "nosniff"
    page = client.get("/ui/").text
    assert not re.search(r"<script(?![^>]*\bsrc=)", page), "inline script would be blocked by the CSP"
    assert "<style" not in page and not re.search(r"\sstyle=", page) and not re.search(r"\son[a-z]+=", page)


def test_the_key_is_written_to_local_storage_only_when_remembered() -> None:
    """The page's script keeps the API key in sessionStorage, in localStorage only behind the
    "remember" box (tests/ui/test_playground.py checks it in Chromium)."""
    from ragserve.http.routes.playground import UI_DIR

    js = (UI_DIR / "app.js").read_text()
    assert 'id="key-remember"' in (UI_DIR / "index.html").read_text()
    assert "localStorage.setItem(KEY_STORE" not in js
    assert "(remember ? localStorage : sessionStorage).setItem(KEY_STORE, key)" in js


def test_favicon_is_served_with_its_type_and_without_a_key(client: TestClient) -> None:
    """The page links an SVG icon; /favicon.ico (what a browser asks the root for) is a real ICO,
    open like the page (the server has keys here), not a 401 or 404."""
    page = client.get("/ui/").text
    assert '<link rel="icon" href="static/favicon.svg" type="image/svg+xml">' in page
    svg = client.get("/ui/static/favicon.svg")
    assert svg.status_code == 200 and svg.headers["content-type"] == "image/svg+xml"
    assert svg.text.lstrip().startswith("<svg") and "<script" not in svg.text
    ico = client.get("/favicon.ico")
    assert ico.status_code == 200 and ico.headers["content-type"] == "image/vnd.microsoft.icon"
    assert ico.content[:4] == b"\x00\x00\x01\x00" and int.from_bytes(ico.content[4:6], "little") >= 2  # sizes
    assert ico.headers["x-content-type-options"] == "nosniff" and "max-age" in ico.headers["cache-control"]
    static_ico = client.get("/ui/static/favicon.ico")
    assert static_ico.status_code == 200 and static_ico.headers["content-type"] == "image/vnd.microsoft.icon"


def test_the_page_never_writes_html_from_text() -> None:
    """Answers, titles and sources reach the page as text nodes (md.js builds the Markdown with DOM
    calls): neither script assigns innerHTML/outerHTML nor calls insertAdjacentHTML,
    document.write or eval (tests/ui/test_playground.py checks the rendering in Chromium)."""
    import re

    from ragserve.http.routes.playground import UI_DIR

    for name in ("app.js", "md.js"):
        js = (UI_DIR / name).read_text()
        sinks = re.findall(r"\.(?:inner|outer)HTML\b|insertAdjacentHTML|document\.write|\beval\(|new Function", js)
        assert not sinks, (name, sinks)
