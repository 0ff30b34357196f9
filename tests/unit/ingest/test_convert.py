"""The converters: every supported kind of file becomes the text a person would read in it."""

from __future__ import annotations

import pytest

from ragserve.ingest.convert import ConversionError, convert, file_documents, file_kind, split_text
from tests.filemakers import make_docx, make_pdf, make_pptx


def test_markdown_and_code_are_kept_as_they_are() -> None:
    md = convert(b"---\ntitle: Guide\n---\n# Heading\n\nBody text.\n", "guide.md")
    assert md.file_type == "markdown" and md.title == "Guide" and "Body text." in md.sections[0].text
    assert convert(b"# Only heading\ntext", "x.markdown").title == "Only heading"
    code = convert(b"def f():\n    return 1\n", "pkg/mod.py")
    assert (code.file_type, code.language, code.title) == ("code", "python", "mod.py")
    assert convert(b"fn main() {}", "main.rs").language == "rust"
    assert convert(b"export const A = <div/>;", "a.tsx").language == "tsx"
    assert convert(b"", "empty.py").sections == []


def test_html_becomes_markdown_without_scripts_or_chrome() -> None:
    html = (
        b"<html><head><title>Pump manual</title><script>var x = 1;</script></head><body><nav>menu</nav>"
        b"<h2>Servicing</h2><p>Replace the <b>seal</b> every week.</p><ul><li>one</li><li>two</li></ul>"
        b"</body></html>"
    )
    out = convert(html, "manual.html")
    text = out.sections[0].text
    assert out.title == "Pump manual" and out.file_type == "html"
    assert "## Servicing" in text and "Replace the **seal** every week." in text and "- one" in text
    assert "var x" not in text and "menu" not in text


def test_html_and_docx_text_keeps_underscores_and_asterisks_as_written() -> None:
    """The markdown is searched and quoted, not rendered: no backslash splits an identifier, and a
    run of "_" (a form's blank line, or a hostile page of them) is not doubled into "\\_" pairs."""
    html = b"<p>Set max_connections * 2 in pg_hba.conf.</p><p>Name: " + b"_" * 5000 + b"</p>"
    text = convert(html, "tuning.html").sections[0].text
    assert "Set max_connections * 2 in pg_hba.conf." in text and "\\" not in text
    assert len(text) < len(html)
    doc = convert(make_docx([("", "Call read_config() with *args.")]), "api.docx").sections[0].text
    assert "Call read_config() with *args." in doc


def test_pdf_is_one_section_per_page_with_page_numbers() -> None:
    out = convert(make_pdf(["First page about pumps", "", "Third page about valves"], title="Plant manual"), "m.pdf")
    assert out.title == "Plant manual" and out.pages == 3
    assert [(s.page, s.text) for s in out.sections] == [(1, "First page about pumps"), (3, "Third page about valves")]
    assert out.warnings == ["1 of 3 pages have no text and were skipped"]
    with pytest.raises(ConversionError, match="no extractable text"):
        convert(make_pdf([""]), "scan.pdf")
    with pytest.raises(ConversionError, match="unreadable PDF"):
        convert(b"%PDF-1.4 this is not a pdf", "broken.pdf")


def test_docx_and_pptx() -> None:
    doc = convert(make_docx([("Heading1", "Quarterly report"), ("", "Revenue grew by ten percent.")]), "r.docx")
    assert doc.file_type == "docx" and doc.title == "Quarterly report"
    assert "# Quarterly report" in doc.sections[0].text and "Revenue grew by ten percent." in doc.sections[0].text
    deck = convert(make_pptx([("Roadmap", "Ship the CLI"), ("Risks", "Scope creep")]), "plan.pptx")
    text = deck.sections[0].text
    assert deck.title == "Roadmap" and "## Slide 1: Roadmap" in text and "## Slide 2: Risks" in text
    assert "Scope creep" in text


def test_unsupported_and_binary_files_are_refused() -> None:
    assert file_kind("photo.png") is None and file_kind("Makefile") == "text" and file_kind("a.yaml") == "text"
    with pytest.raises(ConversionError, match="unsupported"):
        convert(b"\x89PNG", "photo.png")
    with pytest.raises(ConversionError, match="binary"):
        convert(b"abc\x00def", "notes.txt")
    assert convert("café".encode("cp1252"), "latin.txt").sections[0].text == "café"


def test_split_text_and_documents_ids() -> None:
    text = "\n\n".join(f"Paragraph {i} " + "word " * 30 for i in range(20))
    parts = split_text(text, 500)
    assert all(len(p) <= 500 for p in parts) and len(parts) > 3
    assert " ".join(parts).split() == text.split()  # nothing lost, cuts at paragraph ends
    out = convert(make_pdf(["alpha", "beta"]), "r.pdf")
    docs = file_documents("docs/r.pdf", 0.0, out, 1_000_000)
    assert [d["doc_id"] for d in docs] == ["docs/r.pdf#p1", "docs/r.pdf#p2"]
    assert docs[1]["metadata"] == {
        "path": "docs/r.pdf",
        "title": "r",
        "file_type": "pdf",
        "pages": 2,
        "page": 2,
        "mtime": "1970-01-01T00:00:00Z",
    }
    big = convert(text.encode(), "big.txt")
    ids = [d["doc_id"] for d in file_documents("big.txt", 0.0, big, 500)]
    assert ids[0] == "big.txt#part1" and len(ids) == len(parts)
    long_rel = "d/" * 200 + "x.md"
    (doc,) = file_documents(long_rel, 0.0, convert(b"hi", "x.md"), 100)
    assert len(doc["doc_id"]) <= 256


@pytest.mark.parametrize(
    "rel",
    ["notes/a\nb.md", "tab\there.txt", "nul\x00.md", "bell\x07" + "x" * 400 + ".md", "rtl\u202egpj.md", "ls\u2028"],
)
def test_a_file_name_with_control_characters_gets_an_id_the_api_accepts(rel: str) -> None:
    """A file name may hold a newline; a document id may not (``Document.doc_id``): the id shows
    each as ``?`` and keeps a hash of the whole path, so two such names never share an id."""
    from ragserve.api.documents import Document
    from ragserve.ingest.convert import MAX_DOC_ID, doc_id_for

    doc_id = doc_id_for(rel, "#p2")
    assert Document(text="x", doc_id=doc_id).doc_id == doc_id and len(doc_id) <= MAX_DOC_ID
    assert doc_id.endswith("#p2") and "?" in doc_id
    assert doc_id_for(rel.replace("\n", "\r").replace("\t", "\r").replace("\x00", "\r").replace("\x07", "\r")) != doc_id
    assert doc_id_for("plain/path.md", "#p2") == "plain/path.md#p2"  # a printable path is its own id
    assert (
        doc_id_for("emoji \U0001f468\u200d\U0001f469.md") == "emoji \U0001f468\u200d\U0001f469.md"
    )  # a joiner is text


def test_a_blank_file_name_gets_an_id_the_api_accepts() -> None:
    from ragserve.api.documents import Document
    from ragserve.ingest.convert import doc_id_for

    for rel in (" ", "\u3000"):
        doc_id = doc_id_for(rel)
        assert Document(text="x", doc_id=doc_id).doc_id == doc_id and doc_id != doc_id_for("  ")
