"""What the ``ragserve`` command prints: the ingest progress bar and report, an answer's sources, the
tables of indexes and documents, and JSON on stdout. ``ragserve.cli.main`` decides what to print and
when; this module only says how it looks.

Names and whatever the server sends (file names, titles, paths, reasons) are printed through
:func:`printable`: a control character or a bidi control in them (ESC, a newline, a right-to-left
override) is shown as an escape such as ``\\x1b``, so it can neither drive the terminal nor forge a line of the report.

Tables never cut the column that the next command needs (an index name, a document id): the other
columns wrap or shorten instead, and a terminal too narrow for that gets one block per row.
"""

from __future__ import annotations

import json
import sys
import time
import unicodedata
from collections.abc import Sequence
from typing import Any

from rich.cells import cell_len
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, SpinnerColumn, TaskProgressColumn, TextColumn, TimeRemainingColumn
from rich.table import Table

from ragserve.cli.sync import SOURCE, SyncReport

#: Unicode categories never printed as they are: controls, lone surrogates (bytes of a file name
#: that are not UTF-8), line and paragraph separators.
_UNPRINTED = frozenset({"Cc", "Cs", "Zl", "Zp"})
#: Format characters (category Cf) that are printed escaped too: the bidi marks, embeddings,
#: overrides and isolates, which reorder what a terminal shows ("Trojan Source"), and the BOM. The
#: rest of Cf prints as it is: the joiners that build emoji and Indic and Persian words (U+200C,
#: U+200D), the soft hyphen, the tag characters of subdivision flags.
_REORDERING = frozenset({0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A), 0xFEFF})


def printable(text: object, keep: str = "\t") -> str:
    """``text`` with every control or format character but those in ``keep`` written as an escape
    (``\\x1b``, ``\\u202e``; a byte of a name that is not UTF-8 as ``\\xe9``): the one way names and
    server data reach the terminal."""
    s = str(text)
    if s.isprintable():  # the common case, quickly (tab is not printable: it takes the slow path)
        return s
    return "".join(_escaped(c) if c not in keep and _unprinted(c) else c for c in s)


def _unprinted(c: str) -> bool:
    return ord(c) in _REORDERING or unicodedata.category(c) in _UNPRINTED


def _escaped(c: str) -> str:
    n = ord(c)
    if 0xDC80 <= n <= 0xDCFF:  # os.fsdecode's stand-in for a byte that is not UTF-8
        return f"\\x{n - 0xDC00:02x}"
    if n < 0x100:
        return f"\\x{n:02x}"
    return f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def shown_text(text: object) -> str:
    """``text`` as rich markup that prints it as it is, with :func:`printable`'s escapes."""
    return escape(printable(text))


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"  # pragma: no cover


class RichProgress:
    """The ingest progress bar: files, documents, chunks in the index, docs/s and time left (by bytes)."""

    def __init__(self, console: Console):
        self.console = console
        self.progress: Progress | None = None
        self.task: Any = None
        self.files = self.docs = 0
        self.total_files = 0
        self.t0 = time.monotonic()

    def start(self, files: int, total_bytes: int) -> None:
        self.files = self.docs = 0
        self.total_files = files
        self.t0 = time.monotonic()
        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("[bold]ingest"),
            BarColumn(),
            TaskProgressColumn(),
            TextColumn("{task.fields[files]}/{task.fields[total_files]} files"),
            TextColumn("{task.fields[docs]} docs sent"),
            TextColumn("{task.fields[chunks]} chunks"),
            TextColumn("{task.fields[rate]} docs/s"),
            TimeRemainingColumn(),
            console=self.console,
            transient=False,
        )
        self.task = self.progress.add_task(
            "ingest", total=max(total_bytes, 1), files=0, total_files=files, docs=0, chunks="–", rate="0.0"
        )
        self.progress.start()

    def advance(self, files: int, nbytes: int, documents: int) -> None:
        if self.progress is None:
            return
        self.files += files
        self.docs += documents
        rate = self.docs / max(time.monotonic() - self.t0, 1e-6)
        self.progress.update(
            self.task,
            advance=nbytes or (1 if self.total_files == 0 else 0),
            files=self.files,
            docs=self.docs,
            rate=f"{rate:.1f}",
        )

    def chunks(self, total: int) -> None:
        if self.progress is not None:
            self.progress.update(self.task, chunks=total)

    def finish(self) -> None:
        if self.progress is not None:
            self.progress.update(self.task, completed=self.progress.tasks[0].total)
            self.progress.stop()
            self.progress = None


def print_json(obj: Any) -> None:
    text = json.dumps(obj, indent=2, ensure_ascii=False)
    # A path that is not UTF-8 (a name may hold any bytes) as the JSON escape \udce9: stdout never fails on it.
    sys.stdout.write(text.encode("utf-8", errors="backslashreplace").decode("utf-8") + "\n")
    sys.stdout.flush()


def print_report(report: SyncReport, console: Console, stats: dict[str, Any] | None) -> None:
    console.print(
        f"[bold]{shown_text(report.index)}[/bold]: {len(report.added)} added, {len(report.updated)} updated, "
        f"{len(report.unchanged)} unchanged, {len(report.deleted)} deleted, "
        f"[{'red' if report.failed else 'default'}]{len(report.failed)} failed[/] "
        f"({report.documents_sent} documents sent in {report.seconds:.1f} s)"
    )
    for path, reason in report.failed:
        console.print(f"  [red]failed[/red]  {shown_text(path)}: {shown_text(reason)}")
    for path, warning in report.warnings:
        console.print(f"  [yellow]warning[/yellow] {shown_text(path)}: {shown_text(warning)}")
    for path, reason in report.skipped:
        console.print(f"  [dim]skipped {shown_text(path)}: {shown_text(reason)}[/dim]")
    if report.links_outside:
        listed = ", ".join(report.links_outside[:10]) + (", …" if len(report.links_outside) > 10 else "")
        n = len(report.links_outside)
        console.print(
            f"  [yellow]skipped {n} link{'' if n == 1 else 's'} leaving the folder: {shown_text(listed)} "
            "(to index a link's target, name the target itself)[/yellow]"
        )
    if report.stale:
        console.print(
            f"  [yellow]{len(report.stale)} file(s) are gone from disk but still indexed; "
            "run with --delete to remove them[/yellow]"
        )
    for notice in report.notices:
        console.print(f"  [yellow]note[/yellow]    {shown_text(notice)}")
    if report.fatal:
        console.print(f"  [red]stopped: {shown_text(report.fatal)}[/red]")
    if report.interrupted:
        console.print(
            f"  [yellow]interrupted: {len(report.not_processed)} file(s) not processed; every file "
            "sent was indexed whole. Run the same command again to finish.[/yellow]"
        )
    if stats:
        console.print(
            f"  index now: {stats['documents']} documents, {stats['chunks']} chunks, "
            f"{human_bytes(stats['bytes'])} of text"
        )


def _source_line(i: int, node: dict[str, Any]) -> str:
    meta = node.get("metadata") or {}
    where = meta.get("path") or node.get("doc_id")
    page = f" p.{meta['page']}" if meta.get("page") else ""
    title = meta.get("title")
    label = f"{where}{page}" + (f" — {title}" if title and not str(where).endswith(str(title)) else "")
    return f"  [{i}] {label}  (score {float(node.get('score', 0)):.3f})"


def print_sources(nodes: Sequence[dict[str, Any]], console: Console) -> None:
    if not nodes:
        return
    console.print("[bold]Sources[/bold]")
    for i, node in enumerate(nodes, start=1):
        console.print(shown_text(_source_line(i, node)), highlight=False)


#: The most characters of one evidence passage printed (whitespace collapsed; the JSON has it whole).
EVIDENCE_CHARS = 300


def print_evidence(evidence: Sequence[dict[str, Any]], console: Console) -> None:
    """The passages of the sources that best support the answer, as ``[n] "..."`` (n: the source in
    the list below, the answer's ``[n]``), so an answer the sources do not say can be seen."""
    if not evidence:
        return
    console.print("[bold]Evidence[/bold]")
    for e in evidence:
        text = " ".join(str(e.get("text", "")).split())
        if len(text) > EVIDENCE_CHARS:
            text = text[: EVIDENCE_CHARS - 1] + "…"
        line = f'  [{e.get("source")}] "{text}"  (score {float(e.get("score", 0)):.2f})'
        console.print(shown_text(line), highlight=False)


def print_indexes(rows: Sequence[dict[str, Any]], console: Console) -> None:
    """The indexes as a table whose names are never cut (a name is what the next command needs); a
    terminal too narrow for that gets one line per index."""
    cells = [
        tuple(
            escape(printable(c))  # server data, as it is: a control character as an escape
            for c in (
                r["index_name"],
                r.get("documents", "?"),
                r.get("chunks", "?"),
                human_bytes(r["bytes"]) if "bytes" in r else "?",
                r.get("index_kind", "?"),
                len(r.get("shards", [])) if "shards" in r else "?",
            )
        )
        for r in rows
    ]
    widest = max(cell_len(printable(r["index_name"])) for r in rows)
    if console.width < widest + 50:  # a name is never cut (it is what the next command needs)
        for name, docs, chunks, size, kind, shards in cells:
            console.print(
                f"[bold]{name}[/bold]: {docs} documents, {chunks} chunks, {size}, {kind}, {shards} shards",
                soft_wrap=True,
                highlight=False,
            )
        return
    table = Table("index", "documents", "chunks", "bytes", "kind", "shards")
    table.columns[0].no_wrap, table.columns[0].min_width = True, widest
    for row in cells:
        table.add_row(*row)
    console.print(table)


def document_rows(docs: Sequence[dict[str, Any]], console: Console) -> None:
    """The documents as a table whose ids are never cut (an id is what the next command needs):
    the other columns wrap or shorten instead, the path column shows only where it says more than
    the id (a PDF page's file), and a terminal too narrow for that gets one block per document."""
    rows = []
    for d in docs:
        meta = d.get("metadata") or {}
        text = " ".join(str(d.get("text") or "").split())
        rows.append(
            tuple(
                printable(c)
                for c in (
                    d.get("doc_id"),
                    meta.get("path", ""),
                    meta.get("title", ""),
                    meta.get("file_type", ""),
                    "ragserve ingest" if meta.get("source") == SOURCE else "",
                    text[:60] + ("…" if len(text) > 60 else ""),
                )
            )
        )
    widest = max(cell_len(r[0]) for r in rows)
    show_path = any(r[1] not in ("", r[0]) for r in rows)
    if console.width < widest + (50 if show_path else 34):
        for doc_id, path, title, kind, by, text in rows:
            console.print(f"[bold]{escape(doc_id)}[/bold]", soft_wrap=True, highlight=False)
            details = " · ".join(x for x in ((path if path != doc_id else ""), title, kind, by) if x)
            if details:
                console.print(f"  {escape(details)}", soft_wrap=False, highlight=False)
            console.print(f"  [dim]{escape(text)}[/dim]", soft_wrap=False, highlight=False)
        return
    table = Table()
    table.add_column("doc_id", no_wrap=True, min_width=widest)
    if show_path:
        table.add_column("path", overflow="fold")
    for name in ("title", "type", "by"):
        table.add_column(name, overflow="fold")
    table.add_column("text", overflow="ellipsis")
    for doc_id, path, *rest in rows:
        table.add_row(*(escape(c) for c in (doc_id, *([path] if show_path else []), *rest)))
    console.print(table)
