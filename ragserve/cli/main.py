"""``ragserve``: index folders, ask questions, look at indexes, from a terminal.

    ragserve ingest docs/ --index docs            # add, update, skip unchanged; --delete, --watch
    ragserve chat --index docs                    # streaming answers with their evidence and sources
    ragserve query --index docs "what is KAITO?"  # KAITO-style /query
    ragserve indexes                              # names, documents, chunks, bytes
    ragserve docs list --index docs --limit 50    # an index's documents, paged

``--url``/``RAGSERVE_URL`` and ``--api-key``/``RAGSERVE_API_KEY`` say where and how; ``--json``
prints machine-readable output instead of tables. Exit status: 0 success, 1 a failure (an API
error, a file that could not be indexed), 2 a usage error, 130 stopped with Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from ragserve.api.documents import validate_index_name
from ragserve.cli.args import at_least, positive_seconds
from ragserve.cli.client import DEFAULT_URL, ApiError, RagClient, default_url
from ragserve.cli.files import given_roots, left_out_roots, sync_base
from ragserve.cli.output import (
    RichProgress,
    document_rows,
    print_evidence,
    print_indexes,
    print_json,
    print_report,
    print_sources,
    printable,
    shown_text,
)
from ragserve.cli.sync import Limits, NoProgress, ProgressSink, Syncer, SyncReport, watch

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
REASONS = {
    "no_index": "the request named no index",
    "tools": "the request uses tools",
    "unsupported_role": "a message has a role RAG does not handle",
    "non_text_content": "a message has non-text content",
    "no_context": "nothing in the index reached the similarity threshold",
}


class UsageError(Exception):
    """A mistake in the command line: a one-line message and exit status 2."""


def _filter_arg(text: str | None) -> dict[str, Any] | None:
    """``--filter '{"k": "v"}'`` or ``--filter k=v,k2=v2``."""
    if not text:
        return None
    text = text.strip()
    if text.startswith(("{", "[")):
        try:
            value = json.loads(text, parse_constant=_no_constant, parse_float=_finite)
        except ValueError as e:
            raise UsageError(f"--filter is not valid JSON: {e}") from None
        if not isinstance(value, dict):
            raise UsageError("--filter must be a JSON object")
        return value
    out: dict[str, Any] = {}
    for pair in text.split(","):
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--filter expects key=value pairs, got {pair!r}")
        v: Any = value.strip()
        for cast in (int, float):
            try:
                v = cast(v)
                break
            except ValueError:
                continue
        if isinstance(v, float) and not math.isfinite(v):
            raise UsageError(
                f"--filter value of {key.strip()!r} is not a finite number: {value.strip()!r} "
                f'(to match it as text, use JSON: --filter \'{{"{key.strip()}": "{value.strip()}"}}\')'
            )
        out[key.strip()] = v
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a filter can hold")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is too large for a number a filter can hold")
    return value


def _index_arg(name: str) -> str:
    try:
        return validate_index_name(name)
    except ValueError as e:
        raise UsageError(str(e)) from None


def _fail(args: argparse.Namespace, console: Console, error: Exception, status: int = EXIT_FAIL) -> int:
    """One line on stderr (never a traceback); with ``--json`` also ``{"error": ...}`` on stdout,
    which then carries nothing but JSON."""
    message = error.message if isinstance(error, ApiError) else str(error)
    line = printable(str(error))  # control characters and bytes that are not UTF-8 as \x1b, \xe9
    console.print(f"[red]ragserve: {escape(line)}[/red]", highlight=False, soft_wrap=True)
    if getattr(args, "json", False):
        print_json({"error": {"status": getattr(error, "status", None), "message": message}})
    return status


# --- ingest -------------------------------------------------------------------------------------
def cmd_ingest(args: argparse.Namespace, client: RagClient, console: Console, out: Console) -> int:
    _index_arg(args.index)
    if any(not p for p in args.paths):  # Path("") is ".": an unset variable would sync the current folder
        raise UsageError("a PATH is empty (an unset shell variable?); name the files or folders to index")
    if args.base is not None and not args.base:
        raise UsageError("--base is empty; name the folder that document ids are relative to")
    roots = [Path(p) for p in args.paths]
    missing = [str(p) for p in roots if not p.exists()]
    if missing:
        raise UsageError(f"no such file or directory: {', '.join(missing)}")
    odd = [str(p) for p in roots if not (p.is_file() or p.is_dir())]
    if odd:
        raise UsageError(f"not a regular file or folder: {', '.join(odd)}")
    try:
        given_base = Path(args.base) if args.base else None
        roots = given_roots(roots, given_base)
        base = sync_base(roots, given_base)
    except ValueError as e:  # a PATH outside --base
        raise UsageError(str(e)) from None
    left_out = left_out_roots(roots, base, gitignore=not args.no_gitignore)
    if left_out and (len(roots) == 1 or len(left_out) == len(roots)):
        # Named alone it would sync nothing, and --delete would take everything under it for gone. A
        # shell glob (docs/*) naming an ignored entry among others skips it, as a walk of docs would.
        name, why = left_out[0]
        raise UsageError(f"{name} is not indexed: {why}")
    limits = Limits.from_config(client.config())
    show_progress = not args.json and not args.quiet
    progress: ProgressSink = RichProgress(console) if show_progress else NoProgress()
    syncer = Syncer(
        client,
        args.index,
        roots,
        base=base,
        include=args.include,
        exclude=args.exclude,
        gitignore=not args.no_gitignore,
        delete=args.delete,
        limits=limits,
        batch_documents=args.batch_size,
        batch_bytes=args.batch_kb * 1024,
        progress=progress,
        checksum=args.checksum,
        sync_id=args.sync_id,
        use_jobs=args.jobs,
    )
    stop = threading.Event()

    def on_sigint(signum: int, frame: Any) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()
        console.print(
            "[yellow]Stopping after the batch in flight (a running ingestion job is cancelled; "
            "Ctrl-C again to abort at once)…[/yellow]"
        )

    previous = (
        signal.signal(signal.SIGINT, on_sigint) if threading.current_thread() is threading.main_thread() else None
    )

    last: list[SyncReport] = []

    def show(report: SyncReport) -> None:
        last[:] = [report]
        stats = None
        if not report.fatal:
            try:
                stats = client.stats(args.index)
            except ApiError:
                stats = None
        if args.json:
            print_json({**report.to_json(), "stats": stats})
        else:
            print_report(report, out, stats)

    try:
        report = syncer.run(stop)
        show(report)
        if args.watch and not stop.is_set() and not report.fatal:
            if not args.json:
                where = shown_text(", ".join(map(str, roots)))
                console.print(f"[dim]watching {where} for changes (Ctrl-C to stop)…[/dim]")
            watch(syncer, stop, show)
            return EXIT_OK if last[0].ok or last[0].interrupted else EXIT_FAIL  # as the last run ended
    except ApiError as e:
        return _fail(args, console, e)
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    if report.interrupted:
        return EXIT_INTERRUPTED
    return EXIT_OK if report.ok else EXIT_FAIL


# --- questions ----------------------------------------------------------------------------------
def _indexes_arg(names: list[str] | None) -> str | list[str] | None:
    """``--index`` given once (a name) or repeated (a list, searched as one ranking), each checked."""
    if not names:
        return None
    checked = list(dict.fromkeys(_index_arg(n) for n in names))
    return checked[0] if len(checked) == 1 else checked


def cmd_query(args: argparse.Namespace, client: RagClient, err: Console, console: Console) -> int:
    params = {"max_tokens": args.max_tokens} if args.max_tokens else None
    index = _indexes_arg(args.index)
    assert index is not None  # --index is required
    answer = client.query(
        index,
        " ".join(args.question),
        top_k=args.top_k,
        metadata_filter=_filter_arg(args.filter),
        llm_params=params,
    )
    if args.json:
        print_json(answer)
        return EXIT_OK
    console.print(escape(printable(answer["response"], keep="\n\t")), highlight=False)
    print_evidence(answer.get("evidence") or [], console)
    print_sources(answer.get("source_nodes") or [], console)
    return EXIT_OK


def _chat_once(
    args: argparse.Namespace, client: RagClient, console: Console, messages: list[dict[str, Any]]
) -> tuple[str, dict[str, Any]]:
    body: dict[str, Any] = {"messages": messages}
    if args.index:
        body.update(index_name=_indexes_arg(args.index), top_k=args.top_k)
    if args.filter:
        body["metadata_filter"] = _filter_arg(args.filter)
    if args.max_tokens:
        body["max_tokens"] = args.max_tokens
    if args.model:
        body["model"] = args.model
    rag: dict[str, Any] = {}
    if args.no_stream or args.json:
        response, mode, reason = client.chat(body)
        text = response["choices"][0]["message"].get("content") or ""
        sources = response.get("source_nodes") or []
        rag = response.get("rag") or {}
        if not args.json:
            console.print(escape(printable(text, keep="\n\t")), highlight=False)
    else:
        text, sources, mode, reason = "", [], "", ""
        for stream in client.chat_stream(body):
            mode, reason = stream.mode, stream.reason
            for event in stream.events:
                if event.get("source_nodes"):
                    sources = event["source_nodes"]
                if event.get("rag"):  # on the first chunk and again on the final one
                    rag = event["rag"]
                for choice in event.get("choices") or []:
                    piece = (choice.get("delta") or {}).get("content") or ""
                    if piece:
                        text += piece
                        sys.stdout.write(printable(piece, keep="\n\t"))
                        sys.stdout.flush()
        sys.stdout.write("\n")
    if not args.json:
        if mode == "passthrough":
            console.print(f"[yellow](answered without the index: {REASONS.get(reason, reason)})[/yellow]")
        print_evidence(rag.get("evidence") or [], console)
        print_sources(sources, console)
    result = {"answer": text, "mode": mode, "reason": reason or None, "sources": sources}
    if rag:
        result.update(evidence=rag.get("evidence"), answerable=rag.get("answerable"))
    return text, result


def _ask(json_mode: bool) -> str:
    """The next line the person types. With ``--json`` stdout carries only JSON, so the prompt goes
    to stderr (``input`` would write it to stdout)."""
    if not json_mode:
        return input("you> ").strip()
    sys.stderr.write("you> ")
    sys.stderr.flush()
    line = sys.stdin.readline()
    if not line:
        raise EOFError
    return line.strip()


def cmd_chat(args: argparse.Namespace, client: RagClient, err: Console, console: Console) -> int:
    history: list[dict[str, Any]] = []
    if args.system:
        history.append({"role": "system", "content": args.system})
    if args.message:
        messages = [*history, {"role": "user", "content": " ".join(args.message)}]
        _, result = _chat_once(args, client, console, messages)
        if args.json:
            print_json(result)
        return EXIT_OK
    if not args.json:
        console.print(
            f"[dim]chatting with {'index ' + ', '.join(args.index) if args.index else 'no index'} — "
            "an empty line or Ctrl-D ends, "
            "/reset starts over[/dim]"
        )
    status = EXIT_OK  # a failed turn is said at once and the chat goes on; the exit status keeps it
    while True:
        try:
            line = _ask(args.json)
        except (EOFError, KeyboardInterrupt):
            (sys.stderr if args.json else sys.stdout).write("\n")
            return status
        if not line:
            return status
        if line == "/reset":
            history = history[:1] if args.system else []
            continue
        messages = [*history, {"role": "user", "content": line}]
        try:
            text, result = _chat_once(args, client, console, messages)
        except ApiError as e:
            status = _fail(args, err, e)  # one line on stderr; with --json {"error": ...} on stdout
            continue
        if args.json:
            print_json(result)
        history = [*messages, {"role": "assistant", "content": text}]


def cmd_mcp(args: argparse.Namespace, client: RagClient, err: Console, console: Console) -> int:
    from ragserve.cli.knowledge import run_stdio  # the MCP SDK loads only for this command

    return run_stdio(client)


def cmd_indexes(args: argparse.Namespace, client: RagClient, err: Console, console: Console) -> int:
    rows = []
    for name in client.indexes():
        try:
            rows.append(client.stats(name))
        except ApiError as e:
            if e.status not in (404, 405):
                raise
            rows.append({"index_name": name})
    if args.json:
        print_json(rows)
        return EXIT_OK
    if not rows:
        console.print("no indexes yet: ragserve ingest PATH --index NAME")
        return EXIT_OK
    print_indexes(rows, console)
    return EXIT_OK


def cmd_docs_list(args: argparse.Namespace, client: RagClient, err: Console, console: Console) -> int:
    """A page of an index's documents (``GET /indexes/{index}/documents``), paged through the
    server's ``offset``/``limit`` when ``--limit`` is larger than the server's largest page."""
    index = _index_arg(args.index)
    flt = _filter_arg(args.filter)
    page = Limits.from_config(client.config()).max_list_limit
    docs: list[dict[str, Any]] = []
    offset, total = args.offset, 0
    while len(docs) < args.limit:
        answer = client.documents_page(
            index,
            limit=min(page, args.limit - len(docs)),
            offset=offset,
            max_text_length=args.text_length,
            metadata_filter=flt,
        )
        got, total = answer["documents"], int(answer["total_items"])
        docs += got
        offset += len(got)
        if not got or offset >= total:
            break
    if args.json:
        print_json({"index": index, "total": total, "offset": args.offset, "count": len(docs), "documents": docs})
        return EXIT_OK
    if not docs:
        what = "no documents match the filter" if flt else "no documents"
        console.print(
            f"{shown_text(index)}: {what}" + (f" from --offset {args.offset} (of {total})" if args.offset else "")
        )
        return EXIT_OK
    console.print(f"{shown_text(index)}: documents {args.offset + 1}–{args.offset + len(docs)} of {total}")
    document_rows(docs, console)
    if args.offset + len(docs) < total:
        console.print(f"[dim]{total - args.offset - len(docs)} more: --offset {args.offset + len(docs)}[/dim]")
    return EXIT_OK


def _sync_id(text: str) -> str:
    if not (1 <= len(text) <= 128 and text.isprintable() and text.strip() == text):
        raise argparse.ArgumentTypeError("must be 1 to 128 printable characters, without spaces at either end")
    return text


# --- entry point --------------------------------------------------------------------------------
def _common(defaults: bool) -> argparse.ArgumentParser:
    """The connection and output options, accepted before and after the command. Sub-commands get
    their own copy with suppressed defaults, so ``ragserve --json query ...`` keeps ``--json``."""
    common = argparse.ArgumentParser(add_help=False)
    d = (lambda v: v) if defaults else (lambda v: argparse.SUPPRESS)
    common.add_argument(
        "--url",
        default=d(None),
        help=f"server URL (env RAGSERVE_URL; default http://127.0.0.1:$RAGSERVE_PORT, else {DEFAULT_URL})",
    )
    common.add_argument("--api-key", default=d(None), help="API key (env RAGSERVE_API_KEY)")
    common.add_argument("--json", action="store_true", default=d(False), help="machine-readable output on stdout")
    common.add_argument("--timeout", type=positive_seconds, default=d(600.0), help="seconds per request (600)")
    return common


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ragserve", description="Index folders into ragserve and ask them questions.", parents=[_common(True)]
    )
    common = _common(False)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "ingest",
        parents=[common],
        help="index (and sync) files and folders",
        description="Index files and folders: new files are added, changed ones updated, "
        "unchanged ones skipped. Document ids are paths relative to the folder given (or --base). "
        "Only documents this folder's sync created are ever updated or deleted.",
    )
    p.add_argument("paths", nargs="+", metavar="PATH")
    p.add_argument("--index", "-i", required=True, help="index name")
    p.add_argument(
        "--include",
        action="append",
        default=[],
        metavar="GLOB",
        help="only files matching (gitignore syntax, relative to --base; repeatable)",
    )
    p.add_argument("--exclude", action="append", default=[], metavar="GLOB", help="leave out matching files")
    p.add_argument("--no-gitignore", action="store_true", help="do not honour .gitignore files")
    p.add_argument(
        "--delete",
        action="store_true",
        help="delete this sync's documents whose files under PATH are gone (or no longer selected); "
        "documents it did not create are never deleted",
    )
    p.add_argument("--watch", action="store_true", help="keep syncing as files change")
    p.add_argument(
        "--checksum", action="store_true", help="compare every file's content hash, not only its modification time"
    )
    p.add_argument(
        "--base",
        help="folder that document ids are relative to and that names the sync (default: the folder given, "
        "or the deepest folder holding all PATHs)",
    )
    p.add_argument(
        "--sync-id",
        type=_sync_id,
        help="the name of this sync, marking its documents (default: a hash of the folder's resolved absolute "
        "path, so the same path on any machine is the same sync: CI runners checking out one repository at "
        "one path update each other's documents); give the same one to keep syncing a folder after moving it, "
        "and a different one on each machine whose folder at that path holds different files",
    )
    p.add_argument(
        "--batch-size",
        type=at_least(1),
        default=16,
        help="documents per request (at most the server's limit)",
    )
    p.add_argument(
        "--batch-kb",
        type=at_least(1),
        default=64,
        help="text per request in KiB, a soft target for a moving progress bar (a larger file goes whole)",
    )
    jobs = p.add_mutually_exclusive_group()
    jobs.add_argument(
        "--jobs",
        dest="jobs",
        action="store_true",
        default=None,
        help="send new files as the server's ingestion jobs (POST /jobs: stored whole by the server, up to "
        "its max_documents_per_job each, polled for progress; Ctrl-C cancels them). Default: automatic, "
        "jobs when more files are new to the index than the server's max_documents_per_request (1000), "
        "and POST /index when the server has no jobs",
    )
    jobs.add_argument(
        "--no-jobs", dest="jobs", action="store_false", help="send new files with POST /index, in batches"
    )
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_ingest)

    for name, helptext in (
        ("query", "ask a question (POST /query)"),
        ("chat", "chat with an index, streaming (POST /v1/chat/completions)"),
    ):
        p = sub.add_parser(name, parents=[common], help=helptext)
        p.add_argument(
            "--index",
            "-i",
            required=name == "query",
            action="append",
            help="index name; repeat it to search several indexes as one",
        )
        p.add_argument("--top-k", type=at_least(1), default=5)
        p.add_argument("--filter", help="metadata filter: JSON object or key=value,key2=value2")
        p.add_argument("--max-tokens", type=at_least(1))
        if name == "query":
            p.add_argument("question", nargs="+")
            p.set_defaults(func=cmd_query)
        else:
            p.add_argument("message", nargs="*", help="one message; none: an interactive chat")
            p.add_argument("--model", help="model name sent upstream (default: the server's)")
            p.add_argument("--system", help="a system prompt")
            p.add_argument("--no-stream", action="store_true", help="wait for the whole answer")
            p.set_defaults(func=cmd_chat)

    p = sub.add_parser("indexes", parents=[common], help="list indexes with documents, chunks and bytes")
    p.set_defaults(func=cmd_indexes)

    docs = sub.add_parser(
        "docs", parents=[common], help="look at an index's documents (ragserve docs list --index NAME)"
    )
    docs_sub = docs.add_subparsers(dest="docs_command", required=True, metavar="COMMAND")
    p = docs_sub.add_parser(
        "list",
        parents=[common],
        help="list an index's documents (GET /indexes/{index}/documents, paged)",
        description="List an index's documents in the server's stable order: id, path, title, type, "
        "whether `ragserve ingest` wrote it, and the start of the text.",
    )
    p.add_argument("--index", "-i", required=True, help="index name")
    p.add_argument("--limit", "-n", type=at_least(1), default=20, help="documents to show (20); pages as needed")
    p.add_argument("--offset", type=at_least(0), default=0, help="skip this many documents first (0)")
    p.add_argument("--filter", help="metadata filter: JSON object or key=value,key2=value2")
    p.add_argument(
        "--text-length", type=at_least(1), default=200, help="characters of each document's text to fetch (200)"
    )
    p.set_defaults(func=cmd_docs_list)
    p = sub.add_parser(
        "mcp",
        parents=[common],
        help="serve the MCP tools on stdio for a desktop MCP client, reading the server at --url",
        description="An MCP server on stdin/stdout (list_indexes, search, fetch_document) that reads "
        "the ragserve server at --url with --api-key: point a desktop MCP client's command at "
        "`ragserve mcp --url URL --api-key KEY`. The server itself serves the same tools at /mcp.",
    )
    p.set_defaults(func=cmd_mcp)
    # Listed here for --help; `ragserve eval ...` is handed to ragserve.cli.beir before this parser runs.
    sub.add_parser("eval", help="retrieval quality on a BEIR-format dataset (ragserve eval --help)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    if given[:1] == ["eval"]:  # the evaluator has its own options (ragserve/cli/beir.py)
        from ragserve.cli.beir import main as evaluate

        return evaluate(given[1:], prog="ragserve eval")
    args = build_parser().parse_args(given)
    try:
        url = args.url or default_url()
    except ValueError as e:  # RAGSERVE_PORT is not a port
        Console(stderr=True).print(f"[red]error:[/red] {e}")
        return EXIT_USAGE
    key = args.api_key or os.environ.get("RAGSERVE_API_KEY") or None
    console = Console(stderr=True)  # progress, warnings and errors
    out = Console(soft_wrap=True)  # answers, tables and summaries (JSON is written to stdout directly)
    try:
        try:
            client = RagClient(url, key, timeout=args.timeout)
        except ValueError as e:  # a URL or an API key that cannot be used
            raise UsageError(str(e)) from None
        with client:
            return int(args.func(args, client, console, out))
    except UsageError as e:
        return _fail(args, console, e, EXIT_USAGE)
    except ApiError as e:
        return _fail(args, console, e)
    except KeyboardInterrupt:
        console.print("[yellow]aborted[/yellow]")
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `ragserve ... | head`: the reader is gone, nothing more to say
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAIL
    except Exception as e:  # an answer of an unexpected shape, a bug: one line, not a traceback
        if os.environ.get("RAGSERVE_DEBUG"):
            raise
        return _fail(
            args,
            console,
            RuntimeError(f"unexpected error: {type(e).__name__}: {e} (RAGSERVE_DEBUG=1 shows the traceback)"),
        )


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
