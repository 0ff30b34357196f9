"""Which files ``ragserve ingest`` picks up: supported types under the given paths, filtered by
include/exclude globs and by ``.gitignore`` files, as git itself would leave them out.

Every file is named by its path relative to a base directory (the current directory by default):
that relative path is the document id, so a second run finds the documents of the first.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pathspec

from app.ingest.convert import is_supported

ALWAYS_SKIPPED_DIRS = frozenset(
    {
        ".git",
        ".hg",
        ".svn",
        "__pycache__",
        "node_modules",
        ".venv",
        "venv",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        ".tox",
        ".idea",
        ".vscode",
    }
)


@dataclass(frozen=True)
class LocalFile:
    """A file to index: where it is, its id-forming relative path, size and modification time."""

    path: Path
    rel: str  # POSIX path relative to the base: the document id and metadata ``path``
    size: int
    mtime: float


@dataclass(frozen=True)
class _Ignore:
    base: Path
    spec: pathspec.PathSpec

    def ignored(self, path: Path, is_dir: bool) -> bool | None:
        """True/False when a pattern of this file decides, None when none matches."""
        try:
            rel = path.relative_to(self.base).as_posix()
        except ValueError:
            return None
        if is_dir:
            rel += "/"
        result = self.spec.check_file(rel)
        return None if result.include is None else bool(result.include)


def _load_gitignore(directory: Path) -> _Ignore | None:
    f = directory / ".gitignore"
    if not f.is_file():
        return None
    try:
        lines = f.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    return _Ignore(directory, pathspec.GitIgnoreSpec.from_lines(lines))


def _ancestor_ignores(start: Path) -> list[_Ignore]:
    """``.gitignore`` files from the repository's top (the directory holding ``.git``) down to the
    parent of ``start``, outermost first; none when ``start`` is not inside a git repository."""
    chain: list[Path] = []
    for d in [start, *start.parents]:
        chain.append(d)
        if (d / ".git").exists():
            break
    else:
        return []
    out = []
    for d in reversed(chain[1:]):  # start's own .gitignore is read by the walk
        ig = _load_gitignore(d)
        if ig is not None:
            out.append(ig)
    return out


def _is_ignored(ignores: Sequence[_Ignore], path: Path, is_dir: bool) -> bool:
    verdict = False
    for ig in ignores:  # outermost first: a deeper .gitignore overrides, as in git
        v = ig.ignored(path, is_dir)
        if v is not None:
            verdict = v
    return verdict


def relative_name(path: Path, base: Path) -> str:
    """``path`` relative to ``base`` in POSIX form; outside ``base``, relative to the path's own
    parent (its name), so ids never hold absolute, machine-specific paths."""
    path = path.resolve()
    try:
        return path.relative_to(base.resolve()).as_posix()
    except ValueError:
        return path.name


def scope_prefix(root: Path, base: Path) -> str:
    """The id prefix every file under ``root`` has ('' when ``root`` is the base itself)."""
    rel = relative_name(root, base)
    return "" if rel in ("", ".") else rel


class FileSelector:
    """Include/exclude globs (gitignore syntax, matched against the path relative to the base)."""

    def __init__(self, include: Iterable[str] = (), exclude: Iterable[str] = ()):
        inc, exc = list(include), list(exclude)
        self.include = pathspec.GitIgnoreSpec.from_lines(inc) if inc else None
        self.exclude = pathspec.GitIgnoreSpec.from_lines(exc) if exc else None

    def wants(self, rel: str) -> bool:
        if not is_supported(rel):
            return False
        if self.include is not None and not self.include.match_file(rel):
            return False
        return not (self.exclude is not None and self.exclude.match_file(rel))


def discover(
    roots: Sequence[Path],
    base: Path,
    selector: FileSelector,
    *,
    gitignore: bool = True,
    skipped: list[tuple[str, str]] | None = None,
) -> list[LocalFile]:
    """The supported files under ``roots`` (files or directories), sorted by relative path, each once.
    Unsupported files named explicitly are reported in ``skipped`` with the reason."""
    found: dict[str, LocalFile] = {}
    for root in roots:
        root = root.resolve()
        if root.is_file():
            rel = relative_name(root, base)
            if selector.wants(rel):
                st = root.stat()
                found[rel] = LocalFile(root, rel, st.st_size, st.st_mtime)
            elif skipped is not None:
                skipped.append((rel, "unsupported file type or excluded"))
            continue
        if not root.is_dir():
            raise FileNotFoundError(f"no such file or directory: {root}")
        base_ignores = _ancestor_ignores(root) if gitignore else []
        for f in _walk(root, base_ignores, gitignore):
            rel = relative_name(f, base)
            if rel in found or not selector.wants(rel):
                continue
            try:
                st = f.stat()
            except OSError:
                continue
            found[rel] = LocalFile(f, rel, st.st_size, st.st_mtime)
    return [found[k] for k in sorted(found)]


def _walk(root: Path, inherited: list[_Ignore], gitignore: bool) -> Iterator[Path]:
    stack: list[tuple[Path, list[_Ignore]]] = [(root, inherited)]
    while stack:
        directory, ignores = stack.pop()
        if gitignore:
            own = _load_gitignore(directory)
            if own is not None:
                ignores = [*ignores, own]
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError:
            continue
        subdirs = []
        for entry in entries:
            path = Path(entry.path)
            if entry.is_dir(follow_symlinks=False):
                if entry.name in ALWAYS_SKIPPED_DIRS or (gitignore and _is_ignored(ignores, path, True)):
                    continue
                subdirs.append((path, ignores))
            elif entry.is_file():
                if gitignore and _is_ignored(ignores, path, False):
                    continue
                yield path
        stack.extend(reversed(subdirs))
