"""Hostile files: every converter and every title pattern is linear on its worst shapes (timed with a
generous bound: the old code took tens of seconds or more on the same inputs), an Office file is
bounded before it is unpacked, any nesting depth converts, and a title is bounded. Issue 21."""

from __future__ import annotations

import io
import os
import time
import zipfile
from collections.abc import Callable
from typing import Any

import pytest

from ragserve.ingest.convert import (
    MAX_HTML_DEPTH,
    MAX_TITLE_CHARS,
    ConversionError,
    ConversionTimeout,
    ConversionTooLarge,
    ConverterCrashed,
    ConverterUnavailable,
    clean_title,
    convert,
    convert_isolated,
    iso_mtime,
    markdown_title,
    split_text,
)
from tests.filemakers import make_docx, make_pdf, make_pptx

MB = 1_000_000
#: Generous: each of these takes well under a second on an idle core without coverage, and 3 s of CPU
#: under coverage on a slow day of the shared host (a quadratic shape of a megabyte takes hours).
BOUND_S = 10.0
#: For a conversion in another process, timed by the wall clock (the child's CPU time is not this
#: thread's): what matters is that it ends far sooner than its 30 s time limit, also on a machine
#: whose load is ten times its cores.
PROCESS_BOUND_S = 30.0


def timed(fn: Callable[[], Any], clock: Callable[[], float] = time.thread_time) -> tuple[Any, float]:
    """What ``fn`` returns (or the ConversionError it raises) and the CPU time this thread spent on
    it (the shared machine's load does not count); ``clock=time.perf_counter`` for a conversion that
    runs in another process."""
    start = clock()
    try:
        out: Any = fn()
    except ConversionError as e:
        out = e
    return out, clock() - start


# ~1 MB of the shapes that made the old patterns backtrack: a heading of spaces or tabs with no
# text after, runs of '#', front matter that never closes.
MARKDOWN_SHAPES = {
    "heading of spaces": "# " + " " * MB + "\x01",
    "heading text, then spaces": "# x" + " " * MB + "\x01",
    "heading text, then spaces and tabs": "## x" + " \t" * (MB // 2) + "\x01",
    "heading of spaces, text last": "#" + " " * MB + "x",
    "heading of tabs and hashes": "# " + "\t#" * (MB // 2) + "\x01",
    "hashes": "#" * MB,
    "front matter never closed": "---\n" + "key: value\n" * (MB // 11),
    "front matter of titles never closed": "---\n" + "title: 'x\n" * (MB // 10),
    "front matter title of spaces": "---\ntitle: " + " " * MB + "\n",
    "empty headings": "# \n" * (MB // 3),
}


@pytest.mark.parametrize("name", MARKDOWN_SHAPES)
def test_markdown_title_is_linear_on_worst_shapes(name: str) -> None:
    text = MARKDOWN_SHAPES[name]
    _, seconds = timed(lambda: markdown_title(text))
    assert seconds < BOUND_S, f"{name}: {seconds:.2f}s"
    out, seconds = timed(lambda: convert(text.encode(), "worst.md"))
    assert seconds < BOUND_S, f"{name}: {seconds:.2f}s"
    assert not isinstance(out, Exception) and len(out.title) <= MAX_TITLE_CHARS and out.title


def test_markdown_title_reads_what_it_read_before() -> None:
    assert markdown_title('---\ntitle: "Guide"\nauthor: me\n---\n# Other\n') == "Guide"
    assert markdown_title("---\ntitle: 'Quoted'\n---\n") == "Quoted"
    assert markdown_title("---\nauthor: me\n---\n## Second level ##\n") == "Second level"
    assert markdown_title("intro\n#not a heading\n####### seven\n#\ttabbed  #\n") == "tabbed"
    assert markdown_title("---\ntitle: never closed\n# Heading\n") == "Heading"
    assert markdown_title("# \n#   #\n# Real\n") == "Real"
    assert markdown_title("no heading at all") is None


HTML_SHAPES = {
    "spaces in a paragraph": "<p>a" + " " * MB + "b</p>",
    "spaces in pre": "<pre>a" + " " * MB + "b</pre>",
    "spaces and newlines": "<p>a" + " \n" * (MB // 2) + "b</p>",
    "newlines in pre": "<div><pre>a" + "\n" * MB + "</pre>b</div>",
    "tabs in a heading": "<h1>a" + "\t" * MB + "b</h1>",
    # element-heavy shapes: linear, but bs4 and markdownify cost ~20-50 us an element, so fewer of them
    "nested 20,000 deep": "<div>" * 20_000 + "x",
    "inline nested 15,000 deep, closed": "<b>" * 15_000 + "x" + "</b>" * 15_000,
    "lists nested 10,000 deep": "<ul><li>" * 10_000 + "x",
    "10,000 tiny paragraphs": "<p>a</p>" * 10_000,
    # constructs never closed: CPython's html.parser (bs4's "html.parser") rescans the rest of the
    # page at each one, quadratic (100 KB of "<a " took 94 s); lxml's parser is linear on them
    "runs of '<a '": "<p>x</p>" + "<a " * (MB // 3),
    "runs of '<!--'": "<p>x</p>" + "<!--" * (MB // 4),
    "one '<!--' never closed": "<p>x</p><!--" + "x" * MB,
    "runs of '</a'": "<p>x</p>" + "</a" * (MB // 3),
    "runs of '<![CDATA['": "<p>x</p>" + "<![CDATA[" * (MB // 9),
    "runs of '<?'": "<p>x</p>" + "<?" * (MB // 2),
    "runs of '<!x'": "<p>x</p>" + "<!x" * (MB // 3),
    "runs of '&#'": "<p>x</p>" + "&#" * (MB // 2),
    "attribute runs '<a b=b=b='": "<p>x</p><a b" + "=b" * (MB // 2),
    "an attribute value never closed": '<p>x</p><a b="' + "x" * MB,
}


@pytest.mark.parametrize("name", HTML_SHAPES)
def test_html_is_linear_on_worst_shapes_and_any_depth_converts(name: str) -> None:
    out, seconds = timed(lambda: convert(HTML_SHAPES[name].encode(), "worst.html"))
    assert seconds < BOUND_S, f"{name}: {seconds:.2f}s"
    assert not isinstance(out, Exception), out
    assert "a" in out.sections[0].text or "x" in out.sections[0].text


def test_deep_html_keeps_its_text() -> None:
    html = "<div>" * 5_000 + "<p>deep <b>text</b></p>" + "</div>" * 5_000 + "<p>after</p>"
    text = convert(html.encode(), "deep.html").sections[0].text
    assert "deep" in text and "text" in text and "after" in text
    shallow = "<div>" * (MAX_HTML_DEPTH - 3) + "<h2>Kept</h2><p>as <b>markdown</b></p>"
    assert "## Kept" in (t := convert(shallow.encode(), "s.html").sections[0].text) and "**markdown**" in t


def _zip(entries: dict[str, bytes], compression: int = zipfile.ZIP_DEFLATED) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression) as z:
        for name, data in entries.items():
            z.writestr(name, data)
    return buf.getvalue()


def test_a_zip_bomb_is_refused_before_it_is_unpacked() -> None:
    bomb = _zip({"word/document.xml": b"\0" * 200_000_000})
    assert len(bomb) < 300_000
    for name in ("bomb.docx", "bomb.pptx"):
        out, seconds = timed(lambda: convert(bomb, name, max_unpacked_bytes=64 * 1024 * 1024))  # noqa: B023
        assert isinstance(out, ConversionTooLarge) and "200000000 bytes" in str(out) and "67108864" in str(out)
        assert seconds < 3.0  # refused from the zip directory: unpacking 200 MB would take far longer
    # the ratio bounds what fits under the absolute limit: 10 MB from a 10 KB file
    with pytest.raises(ConversionTooLarge, match="times its size"):
        convert(_zip({"word/document.xml": b" " * 10_000_000}), "r.docx", max_unpacked_bytes=10**9)


def test_a_zip_whose_directory_lies_about_sizes_is_refused_while_reading() -> None:
    """The central directory says 100 bytes; the stream holds 50 MB. zipfile stops at the
    declared size and fails the CRC check: an unreadable file (400), never 50 MB in memory."""
    real = make_docx([("", "text")])
    buf = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(real)) as src, zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for info in src.infolist():
            data = src.read(info)
            if info.filename == "word/document.xml":
                data += b"<!--" + b" " * 50_000_000 + b"-->"
            z.writestr(info.filename, data)
    lying = bytearray(buf.getvalue())
    patched, start = 0, 0
    while (at := lying.find(b"PK\x01\x02", start)) != -1:  # central directory records
        name_len = int.from_bytes(lying[at + 28 : at + 30], "little")
        if lying[at + 46 : at + 46 + name_len] == b"word/document.xml":
            lying[at + 24 : at + 28] = (100).to_bytes(4, "little")  # its uncompressed size
            patched += 1
        start = at + 4
    assert patched == 1
    out, seconds = timed(lambda: convert(bytes(lying), "lying.docx", max_unpacked_bytes=1024 * 1024))
    assert isinstance(out, ConversionError) and not isinstance(out, ConversionTooLarge), out
    assert seconds < BOUND_S


@pytest.mark.parametrize("name", ["garbage.docx", "garbage.pptx", "bomb.pdf", "garbage.pdf"])
def test_a_body_that_is_not_its_kind_is_a_conversion_error(name: str) -> None:
    body = _zip({"a.xml": b"\0" * 10_000_000}) if name.startswith("bomb") else b"\x00\x01not this kind" * 100
    with pytest.raises(ConversionError):
        convert(body, name, max_unpacked_bytes=64 * 1024 * 1024)


def test_office_files_of_tens_of_thousands_of_tiny_paragraphs() -> None:
    """DOCX and PPTX worst shapes: linear, and what compresses like a bomb is refused at once."""
    docx = make_docx([("", "a")] * 5_000)  # stored, not compressed: mammoth reads every paragraph (~100 us each)
    out, seconds = timed(lambda: convert(docx, "tiny.docx", max_unpacked_bytes=64 * 1024 * 1024))
    assert not isinstance(out, Exception) and seconds < BOUND_S, seconds
    with zipfile.ZipFile(io.BytesIO(docx)) as z:  # the same shape, 1.2 MB of it, deflated: 300x
        parts = {i.filename: z.read(i) for i in z.infolist()}
    body = parts["word/document.xml"]
    para = b"<w:p><w:r><w:t>a</w:t></w:r></w:p>"
    parts["word/document.xml"] = body.replace(para * 5_000, para * 36_000)
    out, seconds = timed(lambda: convert(_zip(parts), "tiny.docx", max_unpacked_bytes=64 * 1024 * 1024))
    assert isinstance(out, ConversionTooLarge) and seconds < 3.0, (out, seconds)
    deck = make_pptx([("Slide", "\n".join("a" * 10_000))])
    out, seconds = timed(lambda: convert(deck, "tiny.pptx", max_unpacked_bytes=64 * 1024 * 1024))
    assert not isinstance(out, Exception) and seconds < BOUND_S, (out, seconds)


def test_titles_are_bounded_on_every_path() -> None:
    long = "word " * 40_000  # 200,000 characters
    for data, name in (
        (f"# {long}\nbody".encode(), "a.md"),
        (f"---\ntitle: {long}\n---\nbody".encode(), "b.md"),
        (f"<html><head><title>{long}</title></head><body><p>body</p></body></html>".encode(), "c.html"),
        (f"<h1>{long}</h1><p>body</p>".encode(), "d.html"),
        (make_docx([("Heading1", long), ("", "body")]), "e.docx"),
        (make_pptx([(long, "body")]), "f.pptx"),
        (make_pdf(["body"], title=long), "g.pdf"),
    ):
        title = convert(data, name, max_unpacked_bytes=64 * 1024 * 1024).title
        assert 0 < len(title) <= MAX_TITLE_CHARS and title.startswith("word word") and title.endswith("\u2026"), name
    assert clean_title("a\n\tb\x00\x07 c\ud800") == "a b c"  # one line, no control characters or lone surrogates
    assert clean_title("x" * 1000) == "x" * (MAX_TITLE_CHARS - 1) + "\u2026"


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan"), 1e20, -1e20])
def test_iso_mtime_refuses_what_a_date_cannot_hold(value: float) -> None:
    with pytest.raises(ConversionError, match="mtime must be a finite number"):
        iso_mtime(value)
    assert iso_mtime(253_402_300_799) == "9999-12-31T23:59:59Z"


def test_isolated_conversion_is_stopped_at_its_time_limit() -> None:
    """A thread cannot be stopped: the server converts in a process of its own and stops it."""
    assert convert_isolated(b"# Title\nbody", "a.md", max_unpacked_bytes=None, timeout_s=30).title == "Title"
    slow = make_docx([("", "a")] * 20_000)  # seconds of mammoth
    out, seconds = timed(
        lambda: convert_isolated(slow, "slow.docx", max_unpacked_bytes=None, timeout_s=0.3), time.perf_counter
    )
    # the file's shape, not its size: a 422, not a 413 "split the file"
    assert isinstance(out, ConversionTimeout) and not isinstance(out, ConversionTooLarge), out
    assert "max_convert_seconds" in str(out) and "split" not in str(out) and seconds < PROCESS_BOUND_S, (out, seconds)
    with pytest.raises(ConversionError, match="not a zip archive") as err:
        convert_isolated(b"garbage", "g.docx", max_unpacked_bytes=None, timeout_s=30)
    assert not isinstance(err.value, ConversionTooLarge)
    bomb = _zip({"word/document.xml": b"\0" * 20_000_000})
    with pytest.raises(ConversionTooLarge, match="max_unpacked_bytes"):
        convert_isolated(bomb, "b.docx", max_unpacked_bytes=1024 * 1024, timeout_s=30)


def test_split_text_is_linear() -> None:
    """A large text in small parts: slicing the rest off at each cut was quadratic."""
    text = ("word " * 19 + "end.\n") * 100_000  # 10 MB
    parts, seconds = timed(lambda: split_text(text, 1000))
    assert seconds < BOUND_S and len(parts) >= 10_000 and all(len(p) <= 1000 for p in parts)
    assert "".join(parts).replace(" ", "").replace("\n", "") == text.replace(" ", "").replace("\n", "")


def _patched(data: bytes, part: str, edit: Callable[[bytes], bytes]) -> bytes:
    with zipfile.ZipFile(io.BytesIO(data)) as src:
        return _zip({i.filename: edit(src.read(i)) if i.filename == part else src.read(i) for i in src.infolist()})


def test_office_files_nested_thousands_deep_are_a_conversion_error() -> None:
    """mammoth reads recursively, python-pptx's lxml stops at depth 256: a 4xx, never a crash."""
    n = 5_000
    docx = make_docx([("", "MARK")])
    deep = {
        "links.docx": _patched(
            docx,
            "word/document.xml",
            lambda b: b.replace(b"<w:r><w:t>MARK", b"<w:hyperlink>" * n + b"<w:r><w:t>MARK").replace(
                b"</w:t></w:r>", b"</w:t></w:r>" + b"</w:hyperlink>" * n
            ),
        ),
        "tables.docx": _patched(
            docx,
            "word/document.xml",
            lambda b: b.replace(b"<w:body>", b"<w:body>" + b"<w:tbl><w:tr><w:tc>" * n).replace(
                b"</w:body>", b"</w:tc></w:tr></w:tbl>" * n + b"</w:body>"
            ),
        ),
        "groups.pptx": _patched(
            make_pptx([("T", "MARK")]),
            "ppt/slides/slide1.xml",
            lambda b: b.replace(
                b"<p:spTree>",
                b"<p:spTree>"
                + b'<p:grpSp><p:nvGrpSpPr><p:cNvPr id="99" name="g"/><p:cNvGrpSpPr/><p:nvPr/></p:nvGrpSpPr>'
                b"<p:grpSpPr/>" * n + b"</p:grpSp>" * n,
                1,
            ),
        ),
    }
    for name, data in deep.items():
        out, seconds = timed(lambda: convert(data, name, max_unpacked_bytes=64 * 1024 * 1024))  # noqa: B023
        assert isinstance(out, ConversionError) and "unreadable" in str(out) and seconds < BOUND_S, (name, out)
    assert "nested too deeply" in str(timed(lambda: convert(deep["links.docx"], "l.docx"))[0])


def test_a_pdf_stream_is_bounded_while_it_is_unpacked() -> None:
    """pypdf's per-stream bounds (75 MB) lowered to max_unpacked_bytes: a 413, not 20 MB of spaces read."""
    bomb = make_pdf(["pumps"], padding=20_000_000)
    assert len(bomb) < 100_000
    out, seconds = timed(lambda: convert(bomb, "bomb.pdf", max_unpacked_bytes=10 * 1024 * 1024))
    assert isinstance(out, ConversionTooLarge) and "max_unpacked_bytes" in str(out) and seconds < BOUND_S, out
    small = convert(make_pdf(["pumps"], padding=1000), "small.pdf", max_unpacked_bytes=10 * 1024 * 1024)
    assert small.sections[0].text == "pumps"


def test_isolated_conversion_is_bounded_in_memory() -> None:
    """XML parsed into objects takes tens of times its size: the process's address space is bounded."""
    xml_heavy = make_docx([("", "a")] * 60_000)  # 2 MB of XML, hundreds of MB as mammoth's DOM
    out, seconds = timed(
        lambda: convert_isolated(xml_heavy, "m.docx", max_unpacked_bytes=None, timeout_s=30, memory_bytes=48 << 20),
        time.perf_counter,
    )
    assert isinstance(out, ConversionTooLarge) and "max_convert_memory_bytes" in str(out), out
    assert seconds < PROCESS_BOUND_S
    small = make_docx([("", "a")] * 100)
    assert convert_isolated(small, "s.docx", max_unpacked_bytes=None, timeout_s=30, memory_bytes=256 << 20).sections


def _die(*args: Any) -> None:
    os._exit(9)  # what an OOM kill or a segfault leaves: no answer on the pipe


def test_a_converter_that_dies_or_cannot_start_is_an_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """A child killed without an answer is a ConverterCrashed; a process that cannot be started a
    ConverterUnavailable (the server's trouble), never an unhandled error."""
    import ragserve.ingest.convert as convert_module

    monkeypatch.setattr(convert_module, "_convert_child", _die)
    with pytest.raises(ConverterCrashed, match="crashed"):
        convert_isolated(b"# T\nx", "a.md", max_unpacked_bytes=None, timeout_s=30)
    monkeypatch.undo()

    context = convert_module._forkserver()

    def broken_start(self: Any) -> None:
        raise BrokenPipeError("fork server gone")

    monkeypatch.setattr(type(context.Process(target=print)), "start", broken_start)
    with pytest.raises(ConverterUnavailable, match="could not start"):
        convert_isolated(b"# T\nx", "a.md", max_unpacked_bytes=None, timeout_s=30)


def test_a_conversion_process_does_not_run_the_parent_main_script(tmp_path: Any) -> None:
    """multiprocessing has a fork server's child import the parent's ``__main__`` script again (in a
    Ray replica, Ray's worker script): a conversion does not."""
    import subprocess
    import sys

    marker = tmp_path / "imports"
    script = tmp_path / "main_script.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {os.getcwd()!r})\n"
        f"open({str(marker)!r}, 'a').write(__name__ + '\\n')\n"
        "if __name__ == '__main__':\n"
        "    from ragserve.ingest.convert import convert_isolated\n"
        "    for _ in range(3):\n"
        "        assert convert_isolated(b'# T\\nx', 'a.md', max_unpacked_bytes=None, timeout_s=30).title == 'T'\n"
    )
    subprocess.run([sys.executable, str(script)], check=True, timeout=60, cwd=tmp_path)
    assert marker.read_text().split() == ["__main__"]


def test_a_pdf_with_more_pages_of_text_than_documents_allowed_stops_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    """A hostile probe's 20,000-page PDF was converted whole before the 1,000-document refusal."""
    import pypdf

    data = make_pdf([f"Page {i} about pumps." if i % 3 else "" for i in range(1, 61)])
    read: list[int] = []
    extract = pypdf.PageObject.extract_text

    def counted(self: Any, *args: Any, **kwargs: Any) -> str:
        read.append(1)
        return extract(self, *args, **kwargs)

    monkeypatch.setattr(pypdf.PageObject, "extract_text", counted)
    with pytest.raises(ConversionTooLarge, match=r"more than 10 pages of text \(page 16 of 60\)"):
        convert(data, "big.pdf", max_sections=10)
    assert len(read) == 16  # pages 3, 6, 9, 12 and 15 have no text and do not count
    assert len(convert(data, "big.pdf", max_sections=40).sections) == 40  # the bound itself is accepted
    with pytest.raises(ConversionTooLarge, match="max_documents_per_request"):
        convert_isolated(data, "big.pdf", max_unpacked_bytes=None, timeout_s=PROCESS_BOUND_S, max_sections=39)
