"""Files to indexable text: markdown and text as they are, HTML, PDF, DOCX and PPTX converted by
well-kept libraries, code files tagged with their language for the code-aware chunker.

Pure (bytes in, text out, no I/O), so the CLI (``ragserve ingest``) and the server's upload
route (``POST /indexes/{name}/files``) convert a file the same way and agree on its hash.

Choices and why:

- PDF (pypdf): one section per page, so every document, and every retrieved source, carries its
  page number; pages without extractable text (scans) are left out.
- HTML (BeautifulSoup on lxml's parser, then markdownify): scripts, styles and page chrome removed,
  the rest turned into markdown so headings and lists survive and the sentence chunker splits on them.
- DOCX (mammoth, then markdownify): mammoth maps Word styles to semantic HTML (headings, lists,
  tables), a better reading of a document than its raw runs.
- PPTX (python-pptx): one deck, a ``## Slide N`` heading before each slide, speaker notes kept.

The converter libraries are imported when a file of their kind is converted, so reading markdown
never pays for them and a missing one is an error naming the package, not an import failure.

Hostile files (issue 21): every step is linear in its input (no backtracking pattern; HTML deeper
than MAX_HTML_DEPTH flattened before markdownify's recursion); an Office file is bounded by its zip
directory before it is unpacked and a PDF stream while it is unpacked (``max_unpacked_bytes``); a
title is one bounded line (``clean_title``). The server converts in a process of its own, bounded in
time and memory (``convert_isolated``).
"""

from __future__ import annotations

import hashlib
import io
import math
import multiprocessing
import re
import zipfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import PurePath
from typing import Any

from ragserve.api.documents import id_character

# Extensions the code-aware chunker has a grammar for (ragserve.ingest.code.SUPPORTED_LANGUAGES).
CODE_LANGUAGES: dict[str, str] = {
    ".py": "python",
    ".pyi": "python",
    ".js": "javascript",
    ".mjs": "javascript",
    ".cjs": "javascript",
    ".jsx": "javascript",
    ".ts": "typescript",
    ".mts": "typescript",
    ".cts": "typescript",
    ".tsx": "tsx",
    ".go": "go",
    ".java": "java",
    ".rs": "rust",
    ".c": "c",
    ".h": "c",
    ".cc": "cpp",
    ".cpp": "cpp",
    ".cxx": "cpp",
    ".hpp": "cpp",
    ".hh": "cpp",
    ".hxx": "cpp",
}
MARKDOWN_EXTENSIONS = frozenset({".md", ".markdown", ".mdx"})
# Plain text indexed as it is (sentence chunking): prose formats, configs and code without a grammar.
TEXT_EXTENSIONS = frozenset(
    {
        ".txt",
        ".text",
        ".rst",
        ".adoc",
        ".asciidoc",
        ".org",
        ".tex",
        ".csv",
        ".tsv",
        ".log",
        ".json",
        ".jsonl",
        ".yaml",
        ".yml",
        ".toml",
        ".ini",
        ".cfg",
        ".conf",
        ".xml",
        ".sql",
        ".sh",
        ".bash",
        ".zsh",
        ".ps1",
        ".rb",
        ".php",
        ".kt",
        ".kts",
        ".scala",
        ".swift",
        ".cs",
        ".lua",
        ".r",
        ".pl",
        ".proto",
        ".graphql",
        ".css",
        ".scss",
        ".vue",
        ".svelte",
        ".dockerfile",
    }
)
TEXT_FILENAMES = frozenset({"readme", "license", "changelog", "makefile", "dockerfile", "notice", "authors"})
HTML_EXTENSIONS = frozenset({".html", ".htm", ".xhtml"})
BINARY_KINDS = {".pdf": "pdf", ".docx": "docx", ".pptx": "pptx"}
ZIP_KINDS = frozenset({"docx", "pptx"})  # Office files are zip archives: bounded before they are unpacked
_BINARY_CHECK = 8192
MAX_DOC_ID = 256  # ragserve.api.documents.Document.doc_id
#: A title longer than this is cut (at a space when there is one) and ends with an ellipsis: it is
#: shown to people and stored as metadata, whose strings are bounded (ragserve.api.values.MAX_VALUE_CHARS).
MAX_TITLE_CHARS = 512
#: An archive may unpack to at most this many times its own size (beyond _RATIO_FLOOR bytes):
#: Office XML compresses 5-20x, a zip bomb 1000x. The absolute bound is a setting (max_unpacked_bytes).
MAX_UNPACK_RATIO = 100
_RATIO_FLOOR = 1024 * 1024
#: HTML elements nested deeper than this are replaced by their text: markdownify converts
#: recursively (three Python frames a level), so a page nested thousands deep would exhaust the stack.
MAX_HTML_DEPTH = 64
#: pypdf's per-stream output bounds (its Configuration), lowered to max_unpacked_bytes.
_PDF_STREAM_BOUNDS = (
    "maximum_declared_stream_length",
    "array_based_stream_maximum_output_length",
    "jbig2_maximum_output_length",
    "lzw_maximum_output_length",
    "run_length_maximum_output_length",
    "zlib_maximum_output_length",
    "brotli_maximum_output_length",
    "image_maximum_buffer_size",
    "stream_decoding_work_maximum_length",
)
#: File modification times a document can record, in Unix seconds: what a datetime holds, up to
#: 9999-12-31T23:59:59Z (uploads also refuse times before 1970).
MIN_MTIME = -62_135_596_800.0
MAX_MTIME = 253_402_300_799.0


class ConversionError(ValueError):
    """The file cannot be turned into text; the message says why (a client mistake, never a crash)."""


class ConversionTooLarge(ConversionError):
    """The file would unpack to, or cost, more than the limits allow (a 413, not a 400)."""


class ConversionTimeout(ConversionError):
    """Converting the file took longer than ``max_convert_seconds``: its shape, not its size (422)."""


class ConverterCrashed(ConversionError):
    """The conversion process died without an answer (killed for memory, a crash) (422)."""


class ConverterUnavailable(RuntimeError):
    """No conversion process could be started: the server's trouble, not the file's (503)."""


@dataclass(frozen=True)
class Section:
    """A part of a file that becomes one document: the whole file, or one PDF page."""

    text: str
    page: int | None = None  # 1-based page number (PDF)


@dataclass
class Converted:
    """What a file becomes. ``file_type`` is one of markdown, text, html, pdf, docx, pptx, code."""

    sections: list[Section]  # empty for an empty file
    title: str
    file_type: str
    language: str | None = None  # the code chunker's language, for code files
    pages: int | None = None  # pages in the file (PDF), including those without text
    warnings: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.title = clean_title(self.title)

    @property
    def text_chars(self) -> int:
        return sum(len(s.text) for s in self.sections)


def file_kind(filename: str) -> str | None:
    """The kind a file name converts as, or None when it is not a supported file."""
    p = PurePath(filename)
    ext = p.suffix.lower()
    if ext in CODE_LANGUAGES:
        return "code"
    if ext in MARKDOWN_EXTENSIONS:
        return "markdown"
    if ext in HTML_EXTENSIONS:
        return "html"
    if ext in BINARY_KINDS:
        return BINARY_KINDS[ext]
    if ext in TEXT_EXTENSIONS or (not ext and p.name.lower() in TEXT_FILENAMES):
        return "text"
    return None


def is_supported(filename: str) -> bool:
    return file_kind(filename) is not None


def clean_title(title: str) -> str:
    """One line of at most MAX_TITLE_CHARS characters: whitespace runs (newlines included) become
    one space, control characters and lone surrogates go, a longer title is cut at a space."""
    title = "".join(c for c in title if c.isprintable() or c.isspace())
    title = " ".join(title.encode("utf-8", "replace").decode("utf-8").split())
    if len(title) <= MAX_TITLE_CHARS:
        return title
    cut = title.rfind(" ", MAX_TITLE_CHARS // 2, MAX_TITLE_CHARS)
    return title[: cut if cut > 0 else MAX_TITLE_CHARS - 1].rstrip() + "\u2026"


def convert(
    data: bytes, filename: str, *, max_unpacked_bytes: int | None = None, max_sections: int | None = None
) -> Converted:
    """Convert the bytes of ``filename`` (its extension decides how). Raises ConversionError, and
    ConversionTooLarge when an Office file (a zip archive) would unpack to more than
    ``max_unpacked_bytes`` (None: no absolute bound) or to more than MAX_UNPACK_RATIO times its size,
    or when a PDF has more than ``max_sections`` pages of text (each is a document at least: a file
    the caller would refuse, found before the rest of its pages are read)."""
    kind = file_kind(filename)
    stem = PurePath(filename).stem or PurePath(filename).name
    if kind is None:
        raise ConversionError(f"unsupported file type: {PurePath(filename).suffix or PurePath(filename).name!r}")
    if kind in ZIP_KINDS:
        check_archive(data, kind.upper(), max_unpacked_bytes)
    if kind == "pdf":
        return _pdf(data, stem, max_unpacked_bytes, max_sections)
    if kind == "docx":
        return _docx(data, stem)
    if kind == "pptx":
        return _pptx(data, stem)
    text = decode_text(data)
    sections = [Section(text)] if text.strip() else []  # an empty file (an empty __init__.py) has nothing to index
    if kind == "html":
        return _html(text, stem)
    if kind == "markdown":
        return Converted(sections, markdown_title(text) or stem, "markdown")
    if kind == "code":
        language = CODE_LANGUAGES[PurePath(filename).suffix.lower()]
        return Converted(sections, PurePath(filename).name, "code", language=language)
    return Converted(sections, stem, "text")


#: Modules the conversion processes' server imports once, so a conversion pays only for a fork.
_PRELOAD = ["ragserve.ingest.convert", "bs4", "lxml.html", "markdownify", "mammoth", "pptx", "pypdf"]
_PROCESS_NAME = "ragserve-convert"
_context: Any = None


def _without_main(get_preparation_data: Any) -> Any:
    """multiprocessing tells each child how to import the parent's ``__main__`` (a fork server's
    child, like a spawned one, runs the parent's main script again as ``__mp_main__``: inside a Ray
    replica, Ray's worker script, which imports Ray, each conversion). A conversion needs nothing of
    it, so this process's children are told nothing; every other process is left as it was."""

    def prepare(name: str) -> Any:
        data = get_preparation_data(name)
        if name == _PROCESS_NAME:
            data.pop("init_main_from_path", None)
            data.pop("init_main_from_name", None)
        return data

    prepare.__wrapped__ = get_preparation_data  # type: ignore[attr-defined]
    return prepare


def _forkserver() -> Any:
    global _context
    if _context is None:
        from multiprocessing import spawn

        if not hasattr(spawn.get_preparation_data, "__wrapped__"):
            spawn.get_preparation_data = _without_main(spawn.get_preparation_data)
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(_PRELOAD)
        _context = ctx
    return _context


def convert_isolated(
    data: bytes,
    filename: str,
    *,
    max_unpacked_bytes: int | None,
    timeout_s: float,
    memory_bytes: int | None = None,
    max_sections: int | None = None,
) -> Converted:
    """:func:`convert` in a process of its own, stopped after ``timeout_s`` seconds (ConversionTimeout)
    and allowed ``memory_bytes`` more address space than it starts with (ConversionTooLarge): the
    converters' cost is linear in their bounded input, but a thread cannot be stopped, and XML parsed
    into objects takes tens of times its size. A process that dies without an answer (killed for
    memory, a crash) is a ConverterCrashed; one that cannot be started a ConverterUnavailable.
    Processes come from a fork server that has the converters imported, so each costs a fork."""
    context = _forkserver()
    receive, send = context.Pipe(duplex=False)
    proc = context.Process(
        target=_convert_child,
        args=(send, data, filename, max_unpacked_bytes, memory_bytes, max_sections),
        name=_PROCESS_NAME,
        daemon=True,
    )
    try:
        proc.start()
    except (OSError, EOFError, ValueError) as e:  # no process, no fork server (BrokenPipeError is an OSError)
        receive.close()
        send.close()
        raise ConverterUnavailable(f"the server could not start a conversion process ({type(e).__name__}: {e})") from e
    send.close()
    try:
        if not receive.poll(timeout_s):
            raise ConversionTimeout(
                f"the file could not be converted within {timeout_s:g} s (max_convert_seconds): its content "
                "takes too long to convert; simplify it or convert it to text or markdown first"
            )
        try:
            status, payload = receive.recv()
        except EOFError:
            proc.join(1)
            raise ConverterCrashed(
                f"the converter crashed on this file without an answer (exit code {proc.exitcode}): "
                "it may need more memory than the server allows (max_convert_memory_bytes), or be damaged"
            ) from None
    finally:
        receive.close()
        if proc.is_alive():
            proc.kill()
        proc.join()
    if status == "ok":
        return payload
    raise (ConversionTooLarge if status == "too large" else ConversionError)(payload)


def _convert_child(
    send: Any,
    data: bytes,
    filename: str,
    max_unpacked_bytes: int | None,
    memory_bytes: int | None,
    max_sections: int | None = None,
) -> None:
    if memory_bytes:
        _limit_memory(memory_bytes)
    too_much = f"converting the file needs more than {memory_bytes} bytes of memory (max_convert_memory_bytes)"
    try:
        converted = convert(data, filename, max_unpacked_bytes=max_unpacked_bytes, max_sections=max_sections)
        result: tuple[str, Any] = ("ok", converted)
    except MemoryError:
        result = ("too large", too_much)
    except ConversionTooLarge as e:
        result = ("too large", str(e))
    except ConversionError as e:  # a converter that wraps every error wraps a MemoryError too
        result = ("too large", too_much) if isinstance(e.__cause__, MemoryError) else ("error", str(e))
    except Exception as e:  # a converter's bug must still be an answer, not a lost process
        result = ("error", f"the file could not be converted: {type(e).__name__}: {e}")
    send.send(result)
    send.close()


def _limit_memory(memory_bytes: int) -> None:
    """This process's address space: what it holds now plus ``memory_bytes`` (Linux; else no bound)."""
    try:
        import resource

        with open("/proc/self/statm") as f:
            now = int(f.read().split()[0]) * resource.getpagesize()
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = now + memory_bytes
        if hard == resource.RLIM_INFINITY or limit < hard:
            resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    except (ImportError, OSError, ValueError):
        pass


def decode_text(data: bytes) -> str:
    """UTF-8 (with or without a BOM) or UTF-16 with a BOM; anything else that is not binary is read
    as cp1252/latin-1 rather than refused. NUL bytes mean a binary file, which is refused."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        try:
            return data.decode("utf-16")
        except UnicodeDecodeError as e:
            raise ConversionError(f"not valid UTF-16 text: {e}") from e
    if b"\x00" in data[:_BINARY_CHECK]:
        raise ConversionError("binary file (contains NUL bytes), not text")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        try:
            return data.decode("cp1252")
        except UnicodeDecodeError:
            return data.decode("latin-1")


def markdown_title(text: str) -> str | None:
    """The front-matter ``title:`` or the first ATX heading (usually the document's ``# Title``).

    String methods, line by line, not regular expressions: a heading line of 64 KB of spaces made
    the backtracking patterns this replaced take tens of seconds. Linear in the text's length."""
    lines = text.split("\n")
    if lines[0].rstrip() == "---":  # front matter: its title: line counts once the closing --- is found
        found = None
        for line in lines[1:]:
            if line.startswith("---"):
                if found:
                    return found
                break
            if found is None and line.startswith("title:"):
                value = line[len("title:") :].strip()
                value = value[1:] if value[:1] in ("'", '"') else value
                found = clean_title(value[:-1] if value[-1:] in ("'", '"') else value)
    for line in lines:
        if not line.startswith("#"):
            continue
        hashes = len(line) - len(line.lstrip("#"))
        if hashes <= 6 and line[hashes : hashes + 1] in (" ", "\t"):
            title = line[hashes:].strip().rstrip("#").strip()
            if title and (title := clean_title(title)):
                return title
    return None


def check_archive(data: bytes, what: str, max_unpacked_bytes: int | None) -> None:
    """Refuse an Office file before it is unpacked: not a zip archive (ConversionError), or entries
    that add up, by the archive's central directory, to more than ``max_unpacked_bytes`` or to more
    than MAX_UNPACK_RATIO times the file's size (ConversionTooLarge). A header that lies about an
    entry's size cannot get past this: ``zipfile``, which mammoth and python-pptx read with, never
    returns more bytes than the directory declares (it stops there, and the CRC check fails)."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            infos = archive.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError) as e:
        raise ConversionError(f"not a {what} file: it is not a zip archive ({e})") from e
    total = sum(max(info.file_size, 0) for info in infos)
    if max_unpacked_bytes is not None and total > max_unpacked_bytes:
        raise ConversionTooLarge(
            f"the {what} file unpacks to {total} bytes; at most {max_unpacked_bytes} are accepted "
            "(max_unpacked_bytes): split the document"
        )
    if total > _RATIO_FLOOR and total > MAX_UNPACK_RATIO * len(data):
        raise ConversionTooLarge(
            f"the {what} file unpacks to {total} bytes, {total // max(len(data), 1)} times its size; at most "
            f"{MAX_UNPACK_RATIO} times is accepted (a compression bomb?)"
        )


def _tidy(text: str) -> str:
    """Trailing spaces off, at most one blank line in a row: converters leave both behind."""
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n")]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def _require(module: str, package: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ConversionError(f"converting this file type needs the {package!r} package: pip install {package}") from e


def _html_to_markdown(html: str) -> tuple[str, str | None]:
    """Markdown of an HTML page and its title (``<title>`` or the first ``<h1>``)."""
    bs4 = _require("bs4", "beautifulsoup4")
    markdownify = _require("markdownify", "markdownify")
    # lxml's parser (libxml2), not CPython's html.parser: that one rescans the rest of the page at
    # every unclosed construct ("<a " runs, an unclosed "<!--"), quadratic (100 KB took minutes).
    soup = bs4.BeautifulSoup(html, "lxml")
    title = None
    if soup.title and soup.title.get_text(strip=True):
        title = soup.title.get_text(strip=True)
    elif soup.find("h1"):
        title = soup.find("h1").get_text(" ", strip=True) or None
    for tag in soup(
        ["script", "style", "noscript", "template", "svg", "canvas", "iframe", "head", "nav", "form", "button"]
    ):
        tag.decompose()
    body = soup.body or soup
    _flatten_deep(bs4, body)
    # wrap=True without a width: whitespace runs in text become one space, as a browser shows them;
    # without it markdownify normalises them with a pattern that is quadratic on a long run of spaces.
    # strip_pre="strip_one" for the same reason: the default strips <pre> text with another one.
    # No backslash before "_" and "*" in text: the markdown is read (embedded, searched, quoted), not
    # rendered, and escaping split identifiers (snake\_case) for search and doubled a page of "_"
    # into twice the characters and tokens.
    converter = markdownify.MarkdownConverter(
        heading_style="ATX",
        bullets="-",
        strip=["img"],
        wrap=True,
        wrap_width=None,
        strip_pre="strip_one",
        escape_underscores=False,
        escape_asterisks=False,
    )
    return _tidy(converter.convert_soup(body)), title


def _flatten_deep(bs4: Any, root: Any) -> None:
    """Replace every element MAX_HTML_DEPTH levels below ``root`` by its text (bs4 walks a tree
    without recursion, markdownify does not), so any nesting depth converts."""
    stack = [(root, 0)]
    while stack:
        tag, depth = stack.pop()
        for child in list(tag.children):
            if not isinstance(child, bs4.Tag):
                continue
            if depth + 1 >= MAX_HTML_DEPTH:
                child.replace_with(bs4.NavigableString(child.get_text(" ")))
            else:
                stack.append((child, depth + 1))


def _html(text: str, stem: str) -> Converted:
    md, title = _html_to_markdown(text)
    if not md:
        raise ConversionError("the HTML page has no text")
    return Converted([Section(md)], title or stem, "html")


def _pdf(data: bytes, stem: str, max_unpacked_bytes: int | None = None, max_sections: int | None = None) -> Converted:
    pypdf = _require("pypdf", "pypdf")
    defaults = pypdf.get_configuration()  # pypdf's own bounds (75 MB a stream), lowered to ours
    bounds = {
        name: min(getattr(defaults, name), max_unpacked_bytes) for name in _PDF_STREAM_BOUNDS if max_unpacked_bytes
    }
    try:
        with pypdf.apply_configuration(**bounds):
            reader = pypdf.PdfReader(io.BytesIO(data))
            if reader.is_encrypted and not reader.decrypt(""):
                raise ConversionError("the PDF is encrypted with a password")
            sections = []
            for number, page in enumerate(reader.pages, start=1):
                text = _tidy(page.extract_text() or "")
                if text:
                    sections.append(Section(text, page=number))
                    if max_sections is not None and len(sections) > max_sections:
                        raise ConversionTooLarge(
                            f"the PDF has more than {max_sections} pages of text (page {number} of "
                            f"{len(reader.pages)}), and each is a document; at most {max_sections} documents "
                            "are indexed from one file (max_documents_per_request): split it into several files"
                        )
            pages = len(reader.pages)
            meta_title = (reader.metadata.title if reader.metadata else None) or ""
    except ConversionError:  # ConversionTooLarge too
        raise
    except pypdf.errors.LimitReachedError as e:
        raise ConversionTooLarge(
            f"the PDF goes beyond a bound of its reader (a stream may unpack to at most {max_unpacked_bytes} "
            f"bytes, max_unpacked_bytes): {e}"
        ) from e
    except Exception as e:  # pypdf raises many kinds of errors for a damaged file
        raise ConversionError(f"unreadable PDF: {e}") from e
    if not sections:
        raise ConversionError(f"the PDF's {pages} page(s) have no extractable text (a scan needs OCR first)")
    out = Converted(sections, str(meta_title).strip() or stem, "pdf", pages=pages)
    if len(sections) < pages:
        out.warnings.append(f"{pages - len(sections)} of {pages} pages have no text and were skipped")
    return out


def _docx(data: bytes, stem: str) -> Converted:
    mammoth = _require("mammoth", "mammoth")
    no_images = mammoth.images.img_element(lambda image: {"src": ""})  # images are dropped: never read them
    try:
        html = mammoth.convert_to_html(io.BytesIO(data), convert_image=no_images).value
    except RecursionError as e:  # mammoth reads the XML tree recursively
        raise ConversionError("unreadable DOCX: its elements are nested too deeply to convert") from e
    except Exception as e:  # a damaged file
        raise ConversionError(f"unreadable DOCX: {e}") from e
    md, title = _html_to_markdown(f"<html><body>{html}</body></html>")
    if not md:
        raise ConversionError("the DOCX document has no text")
    return Converted([Section(md)], title or markdown_title(md) or stem, "docx")


def _pptx(data: bytes, stem: str) -> Converted:
    _require("pptx", "python-pptx")
    from pptx import Presentation

    try:
        return _pptx_text(Presentation(io.BytesIO(data)), stem)
    except ConversionError:
        raise
    except Exception as e:  # a damaged file, at opening or while its slides are read
        raise ConversionError(f"unreadable PPTX: {e}") from e


def _pptx_text(deck: Any, stem: str) -> Converted:
    parts: list[str] = []
    first_title = None
    for number, slide in enumerate(deck.slides, start=1):
        title_shape = slide.shapes.title
        title = title_shape.text_frame.text.strip() if title_shape is not None and title_shape.has_text_frame else ""
        first_title = first_title or title or None
        lines: list[str] = []
        for shape in slide.shapes:
            if shape is title_shape:
                continue
            if shape.has_text_frame:
                lines += [p for p in (para.text.strip() for para in shape.text_frame.paragraphs) if p]
            if getattr(shape, "has_table", False) and shape.has_table:
                for row in shape.table.rows:
                    lines.append(" | ".join(cell.text.strip() for cell in row.cells))
        if slide.has_notes_slide:
            notes = slide.notes_slide.notes_text_frame.text.strip() if slide.notes_slide.notes_text_frame else ""
            if notes:
                lines.append(f"Notes: {notes}")
        if title or lines:
            parts.append("\n\n".join([f"## Slide {number}" + (f": {title}" if title else ""), *lines]))
    if not parts:
        raise ConversionError("the presentation has no text")
    core_title = (deck.core_properties.title or "").strip()
    return Converted([Section(_tidy("\n\n".join(parts)))], core_title or first_title or stem, "pptx")


def split_text(text: str, max_chars: int) -> list[str]:
    """``text`` in parts of at most ``max_chars`` characters, cut at a blank line, else a line end,
    else a space, so a file larger than the server's document limit is sent as several documents."""
    if max_chars < 1:
        raise ValueError("max_chars must be positive")
    parts: list[str] = []
    start, end = 0, len(text)
    while end - start > max_chars:  # by index: slicing off the rest each time was quadratic
        stop = start + max_chars
        cut = -1
        for sep in ("\n\n", "\n", " "):
            at = text.rfind(sep, start, stop)
            if at - start > max_chars // 2:
                cut = at + len(sep)
                break
        if cut <= start:
            cut = stop
        part = text[start:cut].strip()
        if part:
            parts.append(part)
        start = cut
    if text[start:].strip():
        parts.append(text[start:].strip())
    return parts


def iso_mtime(mtime: float) -> str:
    """UTC ISO 8601, to the microsecond when the file system gives one: a sync skips a file whose
    recorded mtime is unchanged, so a whole-second mtime would miss an edit made in the same second.
    Raises ConversionError for a time that is not finite or not within MIN_MTIME..MAX_MTIME."""
    if not (math.isfinite(mtime) and MIN_MTIME <= mtime <= MAX_MTIME):
        raise ConversionError(
            f"mtime must be a finite number of seconds from {MIN_MTIME:.0f} to {MAX_MTIME:.0f} "
            f"(years 1 to 9999), got {mtime!r}"
        )
    dt = datetime.fromtimestamp(mtime, tz=timezone.utc)
    return dt.isoformat(timespec="microseconds" if dt.microsecond else "seconds").replace("+00:00", "Z")


def doc_id_for(rel: str, suffix: str = "") -> str:
    """``rel`` + ``suffix``; a path too long for an id keeps its start and a hash of the whole, and
    so does a path with characters an id may not hold (``id_character``: a file name may hold a
    newline), each shown as ``?``, and a blank one (a file named " ")."""
    doc_id = rel + suffix
    printable = "".join(c if id_character(c) else "?" for c in rel)
    if len(doc_id) <= MAX_DOC_ID and printable == rel and rel.strip():
        return doc_id
    digest = hashlib.sha256(rel.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{printable[: MAX_DOC_ID - len(suffix) - 18]}~{digest}{suffix}"


def file_documents(rel: str, mtime: float, converted: Converted, max_chars: int) -> list[dict[str, Any]]:
    """The documents a converted file becomes, as the document API takes them. The id is the
    relative path ``rel`` (``#p<page>`` for a PDF page, ``#part<n>`` for a part of a file larger than
    ``max_chars``); the metadata holds path, title, file type, mtime, page(s), part(s), and
    ``split_type: code`` with the ``language`` for code, so the server chunks it by syntax."""
    base: dict[str, Any] = {
        "path": rel,
        "title": converted.title,
        "file_type": converted.file_type,
        "mtime": iso_mtime(mtime),
    }
    if converted.language:
        base.update(split_type="code", language=converted.language)
    if converted.pages:
        base["pages"] = converted.pages
    docs: list[dict[str, Any]] = []
    for section in converted.sections:
        parts = split_text(section.text, max_chars) if len(section.text) > max_chars else [section.text]
        page_suffix = f"#p{section.page}" if section.page is not None else ""
        for i, text in enumerate(parts, start=1):
            meta = dict(base)
            if section.page is not None:
                meta["page"] = section.page
            suffix = page_suffix
            if len(parts) > 1:
                meta.update(part=i, parts=len(parts))
                suffix = f"{page_suffix}.part{i}" if page_suffix else f"#part{i}"
            docs.append({"doc_id": doc_id_for(rel, suffix), "text": text, "metadata": meta})
    return docs
