"""Which files ``ragserve ingest`` picks up: supported types under the given paths, filtered by
include/exclude globs and by ``.gitignore`` files, as git itself would leave them out.

Every file is named by its path relative to a base folder (the folder given by default, see
:func:`sync_base`): that relative path is the document id, so a second run finds the documents of
the first, from whichever directory it runs. Links leaving the folder are never followed.
"""

from __future__ import annotations

import os
import stat
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


def sync_base(roots: Sequence[Path], base: Path | None = None) -> Path:
    """The folder document ids are relative to, resolved (links followed), so the same folder gives
    the same ids from any working directory: ``base`` when given (every root must lie inside it),
    else the folder given (a file's own folder), or the deepest folder holding all of them.
    Raises ValueError naming a root outside ``base``."""
    resolved = [located(Path(r)) for r in roots]
    if base is not None:
        top = Path(base).resolve()
        if not top.is_dir():
            raise ValueError(f"--base {base} is not a folder")
        outside = [str(r) for r, full in zip(roots, resolved, strict=True) if not full.is_relative_to(top)]
        if outside:
            raise ValueError(f"not inside --base {base}: {', '.join(outside)} (ids are paths relative to --base)")
        return top
    return Path(os.path.commonpath([str(r if r.is_dir() else r.parent) for r in resolved]))


def located(path: Path) -> Path:
    """Where a path named on the command line is: a folder as it resolves (links followed: it is
    the folder given), a file in its resolved folder under the name given, so that a link named as
    a file (``docs/*`` expanded by the shell) is still judged as a link."""
    if path.resolve().is_dir():
        return path.resolve()
    named = Path(os.path.abspath(path))
    return named.parent.resolve() / named.name


def shown(rel: str) -> str:
    """A name for messages and JSON: a file name that is not valid UTF-8 (the file system allows
    any bytes) with its odd bytes written as ``\\xe9``, so reporting it cannot fail."""
    try:
        rel.encode("utf-8")
        return rel
    except UnicodeEncodeError:
        return os.fsencode(rel).decode("utf-8", errors="backslashreplace")


def relative_name(path: Path, base: Path) -> str:
    """``path`` (absolute, as walked: links in it are not resolved) relative to ``base`` in POSIX
    form. Raises ValueError when it is not inside ``base``: ids never fall back to bare file names,
    which would collide (``a/README.md``, ``b/README.md``) and change with the working directory."""
    rel = Path(os.path.abspath(path)).relative_to(base).as_posix()
    return "" if rel == "." else rel


def scope_prefix(root: Path, base: Path) -> str:
    """The id prefix every file under ``root`` has ('' when ``root`` is the base itself)."""
    return relative_name(located(root), base)


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
    links_outside: list[str] | None = None,
) -> list[LocalFile]:
    """The supported files under ``roots`` (files or directories), sorted by relative path, each once.
    Unsupported files named explicitly, and broken links, are reported in ``skipped`` with the reason;
    links under a root whose target lies outside that root are left out and listed in ``links_outside``
    (their paths relative to ``base``). A folder named on the command line is taken as it resolves,
    a file where it lies (:func:`located`)."""
    base = base.resolve()
    found: dict[str, LocalFile] = {}
    for root in roots:
        root = located(root)
        if root.is_file():
            rel = relative_name(root, base)
            if root.is_symlink() and not Path(os.path.realpath(root)).is_relative_to(root.parent):
                if links_outside is not None:  # a link leaving the folder it lies in, named as a file
                    links_outside.append(rel)
                continue
            if selector.wants(rel):
                st = root.stat()
                found[rel] = LocalFile(root, rel, st.st_size, st.st_mtime)
            elif skipped is not None:
                skipped.append((rel, "unsupported file type or excluded"))
            continue
        if not root.is_dir():
            raise FileNotFoundError(f"not a file or folder: {root}")
        base_ignores = _ancestor_ignores(root) if gitignore else []
        walk = _Walk(root, gitignore)
        for f, st in walk.files(base_ignores):
            rel = relative_name(f, base)
            if rel in found or not selector.wants(rel):
                continue
            found[rel] = LocalFile(f, rel, st.st_size, st.st_mtime)
        if links_outside is not None:
            links_outside += [relative_name(p, base) for p in walk.outside]
        if skipped is not None:
            broken = ((relative_name(p, base), reason) for p, reason in walk.broken)
            skipped += [(rel, reason) for rel, reason in broken if selector.wants(rel)]
    return [found[k] for k in sorted(found)]


def _key(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


class _Walk:
    """The files under ``root``, depth first in name order. Symbolic links are followed only when
    their target (the end of a chain of links) lies inside ``root``; the others are collected in
    ``outside``. Every real folder is walked once and every real file given once, by its own path
    when the walk meets it, else by the first link naming it: a cycle of folder links ends, and
    folder links are walked after the real tree, so a link never renames a file the tree holds."""

    def __init__(self, root: Path, gitignore: bool):
        self.root = root
        self.gitignore = gitignore
        self.outside: list[Path] = []
        self.broken: list[tuple[Path, str]] = []

    def files(self, inherited: list[_Ignore]) -> Iterator[tuple[Path, os.stat_result]]:
        visited = {_key(self.root.stat())}
        given: set[tuple[int, int]] = set()
        dir_links: list[tuple[Path, list[_Ignore], tuple[int, int]]] = []
        file_links: list[tuple[Path, os.stat_result]] = []
        stack: list[tuple[Path, list[_Ignore]]] = [(self.root, inherited)]
        while stack or dir_links:
            if not stack:
                path, ignores, key = dir_links.pop(0)
                if key not in visited:
                    visited.add(key)
                    stack.append((path, ignores))
                continue
            directory, ignores = stack.pop()
            if self.gitignore:
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
                try:
                    if entry.is_symlink():
                        self._link(path, ignores, dir_links, file_links)
                        continue
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISDIR(st.st_mode):
                    if entry.name in ALWAYS_SKIPPED_DIRS or self._ignored(ignores, path, True):
                        continue
                    if _key(st) not in visited:
                        visited.add(_key(st))
                        subdirs.append((path, ignores))
                elif stat.S_ISREG(st.st_mode) and not self._ignored(ignores, path, False):
                    given.add(_key(st))
                    yield path, st
            stack.extend(reversed(subdirs))
        for path, st in file_links:
            if _key(st) not in given:
                given.add(_key(st))
                yield path, st

    def _ignored(self, ignores: Sequence[_Ignore], path: Path, is_dir: bool) -> bool:
        return self.gitignore and _is_ignored(ignores, path, is_dir)

    def _link(
        self,
        path: Path,
        ignores: list[_Ignore],
        dir_links: list[tuple[Path, list[_Ignore], tuple[int, int]]],
        file_links: list[tuple[Path, os.stat_result]],
    ) -> None:
        if not Path(os.path.realpath(path)).is_relative_to(self.root):
            self.outside.append(path)
            return
        try:
            st = path.stat()  # follows the chain; a dangling link or a loop of links fails here
        except OSError as e:
            self.broken.append((path, f"broken symbolic link ({e.strerror or e})"))
            return
        if stat.S_ISDIR(st.st_mode):
            if path.name not in ALWAYS_SKIPPED_DIRS and not self._ignored(ignores, path, True):
                dir_links.append((path, ignores, _key(st)))
        elif stat.S_ISREG(st.st_mode) and not self._ignored(ignores, path, False):
            file_links.append((path, st))
