"""Which files ``ragserve ingest`` picks up: supported types under the given paths, filtered by
include/exclude globs and by ``.gitignore`` files, as git itself would leave them out.

Every file is named by its path relative to a base folder (the folder given by default, see
:func:`sync_base`): that relative path is the document id, so a second run finds the documents of
the first, from whichever directory it runs. Links leaving the folder are never followed.
"""

from __future__ import annotations

import os
import stat
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pathspec

from ragserve.ingest.convert import is_supported

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
    key: tuple[int, int] | None = None  # (st_dev, st_ino) when found: reading checks it is still that file


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
    """The rules of ``directory/.gitignore``, None when it has none. Raises OSError when there is one
    that cannot be read: its folder cannot be judged, so it is not indexed (nor its documents deleted)."""
    f = directory / ".gitignore"
    try:
        data = f.read_bytes()
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    lines = data.decode("utf-8", errors="replace").splitlines()
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


def given_roots(roots: Sequence[Path], base: Path | None = None) -> list[Path]:
    """The paths to sync: as given, except that one folder named alone (with no ``--base``) is the
    folder given even when the name is a link to it (``ragserve ingest ~/notes`` with ``notes`` a
    link): it is what the user asked to sync, so it is taken as it resolves, and only links *inside*
    it are judged. A link among several paths (``docs/*``) is judged by the folder it lies in."""
    paths = [Path(r) for r in roots]
    if base is None and len(paths) == 1 and paths[0].is_dir():
        return [paths[0].resolve()]
    return paths


def sync_base(roots: Sequence[Path], base: Path | None = None) -> Path:
    """The folder document ids are relative to, resolved, so the same folder gives the same ids from
    any working directory: ``base`` when given (every root must lie inside it), else the folder
    given, or the deepest folder holding all the paths *as given*: a file or a link counts as its
    folder, and a link is never followed to find the base (``docs/*`` with a link ``docs/ext`` to a
    folder elsewhere still has ``docs`` as its base). Raises ValueError naming a root outside ``base``."""
    if base is not None:
        top = Path(base).resolve()
        if not top.is_dir():
            raise ValueError(f"--base {base} is not a folder")
        outside = [str(r) for r in roots if not located(Path(r)).is_relative_to(top)]
        if outside:
            raise ValueError(f"not inside --base {base}: {', '.join(outside)} (ids are paths relative to --base)")
        return top
    return Path(os.path.commonpath([str(_container(Path(r))) for r in roots])).resolve()


def _container(path: Path) -> Path:
    """The folder a path named on the command line stands for: a folder (not a link) itself, a file
    or a link the folder it lies in."""
    named = Path(os.path.abspath(path))
    return named if named.is_dir() and not named.is_symlink() else named.parent


def located(path: Path) -> Path:
    """Where a path named on the command line lies: a link in its resolved folder under the name
    given (a link is judged by where it lies, not where it points), anything else as it resolves."""
    named = Path(os.path.abspath(path))
    if named.is_symlink():
        return named.parent.resolve() / named.name
    return named.resolve()


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


def _walked(root: Path, base: Path) -> Path | None:
    """What is read for a path named on the command line: a folder as it resolves (a link to a
    folder beside it is walked as that folder), a file where it lies (a link under the name given);
    None when it leaves where it lies: a link whose target is outside the folder the link is in, or
    a path that goes out of ``base`` through a link."""
    lies = located(root)
    if not lies.is_relative_to(base):
        return None
    real = Path(os.path.realpath(root))
    if Path(os.path.abspath(root)).is_symlink() and not real.is_relative_to(lies.parent):
        return None
    return real if real.is_dir() else lies


def scope_prefix(root: Path, base: Path) -> str | None:
    """The id prefix every file under ``root`` has ('' when ``root`` is the base itself); None for
    a path that goes out of ``base`` through a link (it holds none of the sync's documents)."""
    lies = located(root)
    if not lies.is_relative_to(base):
        return None
    return relative_name(_walked(root, base) or lies, base)


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
        return not self.excluded(rel)

    def excluded(self, rel: str) -> bool:
        return self.exclude is not None and bool(self.exclude.match_file(rel))


def discover(
    roots: Sequence[Path],
    base: Path,
    selector: FileSelector,
    *,
    gitignore: bool = True,
    skipped: list[tuple[str, str]] | None = None,
    links_outside: list[str] | None = None,
    unreadable: list[tuple[str, str]] | None = None,
    left_out: list[str] | None = None,
) -> list[LocalFile]:
    """The supported files under ``roots`` (files or directories), sorted by relative path, each once.
    Unsupported or ignored files named explicitly, and broken links, are reported in ``skipped`` with
    the reason; links whose target lies outside the folder they are in (under a root, or named on the
    command line) are left out and listed in ``links_outside``; folders and entries that cannot be
    read are listed in ``unreadable`` (relative path, '' for the base itself, and the reason): what
    lies under them is unknown, not gone. Paths named on the command line that the rules leave out
    (see :func:`left_out_roots`) are listed in ``skipped`` and, by relative path, in ``left_out``:
    what the index holds under them is not gone either. Names in ``skipped`` and ``links_outside``
    are printable (:func:`shown`)."""
    base = base.resolve()
    found: dict[str, LocalFile] = {}
    rules = _Rules(gitignore)
    for given in roots:
        where = _walked(given, base)
        lies = located(given)
        name = (relative_name(lies, base) or ".") if lies.is_relative_to(base) else str(given)
        if where is None:
            if links_outside is not None:
                links_outside.append(shown(name))
            continue
        real = Path(os.path.realpath(where))  # a link named as a file is read where it lies
        try:
            out = _root_left_out(rules, lies, real)
            inherited = rules.ancestors(where) if where.is_dir() else []
        except OSError as e:
            if unreadable is not None:
                unreadable.append((relative_name(where, base), f"cannot read it: {e.strerror or e}"))
            continue
        if out:
            if skipped is not None:
                skipped.append((shown(name), "ignored (.gitignore, or a folder never indexed such as .git)"))
            prefix = scope_prefix(given, base)
            if left_out is not None and prefix is not None:
                left_out.append(prefix)
            continue
        if not where.is_dir():
            rel = relative_name(where, base)
            if not selector.wants(rel) or (real != where and selector.excluded(relative_name(real, base))):
                if skipped is not None:
                    skipped.append((shown(rel), "unsupported file type or excluded"))
                continue
            try:
                st = where.stat()
            except FileNotFoundError:
                continue
            except OSError as e:
                if unreadable is not None:
                    unreadable.append((rel, f"cannot read it: {e.strerror or e}"))
                continue
            if not stat.S_ISREG(st.st_mode):  # a pipe or a device would never end reading
                if skipped is not None:
                    skipped.append((shown(rel), "not a regular file"))
                continue
            found[rel] = LocalFile(where, rel, st.st_size, st.st_mtime, _key(st))
            continue
        walk = _Walk(where, rules, inherited)
        for f, st, through in walk.files():
            rel = relative_name(f, base)
            if rel in found or not selector.wants(rel):
                continue
            if through is not None and through != f and selector.excluded(relative_name(through, base)):
                continue  # a link inside to a file --exclude leaves out
            found[rel] = LocalFile(f, rel, st.st_size, st.st_mtime, _key(st))
        if links_outside is not None:
            links_outside += [shown(relative_name(p, base)) for p in walk.outside]
        if skipped is not None:
            broken = ((relative_name(p, base), reason) for p, reason in walk.broken)
            skipped += [(shown(rel), reason) for rel, reason in broken if selector.wants(rel)]
        if unreadable is not None:
            unreadable += [(relative_name(p, base), reason) for p, reason in walk.unreadable]
    return [found[k] for k in sorted(found)]


def _root_left_out(rules: _Rules, lies: Path, real: Path) -> bool:
    """Whether the rules leave out a path named on the command line (``lies``: where it lies;
    ``real``: where it resolves to). Raises OSError for a ``.gitignore`` that cannot be read."""
    return rules.named_left_out(lies) or (
        real != lies  # a link: its target is judged too, from the folder the link is in
        and rules.left_out(lies.parent, real, real.is_dir())
    )


def left_out_roots(roots: Sequence[Path], base: Path, *, gitignore: bool = True) -> list[tuple[str, str]]:
    """The paths named on the command line that :func:`discover` would leave out, as (name, why):
    ignored by a ``.gitignore`` (``--no-gitignore`` takes them), or lying in a folder never indexed
    (:data:`ALWAYS_SKIPPED_DIRS`). ``ragserve ingest`` refuses to sync such a path named alone: it
    would find nothing, and ``--delete`` would take everything under it for gone. A path that cannot
    be judged (a ``.gitignore`` that cannot be read) is not listed: discover reports it."""
    base = base.resolve()
    rules, always = _Rules(gitignore), _Rules(False)
    out: list[tuple[str, str]] = []
    for given in roots:
        where = _walked(given, base)
        if where is None:
            continue
        lies, real = located(given), Path(os.path.realpath(where))
        try:
            if not _root_left_out(rules, lies, real):
                continue
            never = _root_left_out(always, lies, real)
        except OSError:
            continue
        why = (
            f"it lies in a folder never indexed ({', '.join(sorted(ALWAYS_SKIPPED_DIRS))})"
            if never
            else "a .gitignore leaves it out (--no-gitignore indexes it)"
        )
        out.append((shown(str(given)), why))
    return out


def _key(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


class _Rules:
    """What is left out: the always-skipped folders and, with ``gitignore``, ``.gitignore`` files.
    Each ``.gitignore`` is read once and each folder judged once (a link is judged by its target's
    folder, so thousands of links into one deep folder cost one judgement of it). Raises OSError
    for a ``.gitignore`` that cannot be read."""

    def __init__(self, gitignore: bool):
        self.gitignore = gitignore
        self._loaded: dict[Path, _Ignore | None] = {}
        self._ancestors: dict[Path, list[_Ignore]] = {}
        self._folders: dict[tuple[Path, Path], tuple[bool, list[_Ignore]]] = {}

    def own(self, directory: Path) -> _Ignore | None:
        if not self.gitignore:
            return None
        if directory not in self._loaded:
            self._loaded[directory] = _load_gitignore(directory)
        return self._loaded[directory]

    def ancestors(self, start: Path) -> list[_Ignore]:
        if not self.gitignore:
            return []
        if start not in self._ancestors:
            self._ancestors[start] = _ancestor_ignores(start)
        return self._ancestors[start]

    def ignored(self, ignores: Sequence[_Ignore], path: Path, is_dir: bool) -> bool:
        return self.gitignore and _is_ignored(ignores, path, is_dir)

    def _folder(self, top: Path, folder: Path) -> tuple[bool, list[_Ignore]]:
        """Whether ``folder`` (``top`` or inside it) is left out by a walk from ``top``, and the
        rules in force inside it."""
        chain = []
        d = folder
        while (top, d) not in self._folders and d != top:
            chain.append(d)
            d = d.parent
        if (top, d) not in self._folders:  # d is top
            own = self.own(top)
            self._folders[(top, top)] = (False, [*self.ancestors(top), *([own] if own else [])])
        out, ignores = self._folders[(top, d)]
        for d in reversed(chain):
            out = out or d.name in ALWAYS_SKIPPED_DIRS or self.ignored(ignores, d, True)
            own = None if out else self.own(d)
            ignores = [*ignores, own] if own is not None else ignores
            self._folders[(top, d)] = (out, ignores)
        return out, ignores

    def left_out(self, top: Path, target: Path, is_dir: bool) -> bool:
        """Whether ``target`` (inside ``top``) is left out as a walk from ``top`` would judge it:
        under an always-skipped folder, or ignored itself or by a folder on the way."""
        if target == top:
            return False
        out, ignores = self._folder(top, target.parent)
        return out or (is_dir and target.name in ALWAYS_SKIPPED_DIRS) or self.ignored(ignores, target, is_dir)

    def named_left_out(self, path: Path) -> bool:
        """A path named on the command line (``docs/*`` names whatever the folder holds) is judged
        by the rules of the folder it lies in, as a walk of that folder would judge it."""
        return self.left_out(path.parent, path, path.is_dir())


class _Walk:
    """The files under ``root``, depth first in name order. Symbolic links are followed only when
    their target (the end of a chain of links) lies inside ``root`` and is not left out there itself
    (ignored, or in an always-skipped folder); the others are collected in ``outside`` or dropped.
    Every real folder is walked once and every real file given once, by its own path
    when the walk meets it, else by the first link naming it: a cycle of folder links ends, and
    folder links are walked after the real tree, so a link never renames a file the tree holds.
    Folders and entries that cannot be read are collected in ``unreadable``."""

    def __init__(self, root: Path, rules: _Rules, inherited: list[_Ignore]):
        self.root = root
        self.rules = rules
        self.inherited = inherited
        self.outside: list[Path] = []
        self.broken: list[tuple[Path, str]] = []
        self.unreadable: list[tuple[Path, str]] = []

    def files(self) -> Iterator[tuple[Path, os.stat_result, Path | None]]:
        """(path as walked, its stat, its real path when reached through a folder link)."""
        visited = {_key(self.root.stat())}
        given: set[tuple[int, int]] = set()
        # (folder as walked, its ignores, its real path when reached through a link)
        dir_links: deque[tuple[Path, list[_Ignore], os.stat_result, Path]] = deque()
        file_links: list[tuple[Path, list[_Ignore], os.stat_result, Path]] = []
        stack: list[tuple[Path, list[_Ignore], Path | None]] = [(self.root, self.inherited, None)]
        while stack or dir_links:
            if not stack:
                path, ignores, st, target = dir_links.popleft()
                if _key(st) not in visited and self._link_wanted(path, ignores, st, target):
                    visited.add(_key(st))
                    stack.append((path, ignores, target))
                continue
            directory, ignores, real_dir = stack.pop()
            try:
                own = self.rules.own(directory)
                entries = sorted(os.scandir(directory), key=lambda e: e.name)
            except FileNotFoundError:  # gone meanwhile: what it held is gone too
                continue
            except OSError as e:
                self.unreadable.append((directory, f"cannot read the folder: {e.strerror or e}"))
                continue
            if own is not None:
                ignores = [*ignores, own]
            subdirs = []
            for entry in entries:
                path = Path(entry.path)
                real: Path | None = None if real_dir is None else real_dir / entry.name
                try:
                    if entry.is_symlink():
                        self._link(path, ignores, dir_links, file_links)
                        continue
                    st = entry.stat(follow_symlinks=False)
                    if real is not None and self._left_out(real, stat.S_ISDIR(st.st_mode)):
                        continue  # reached through a link: the rules where it really lies count too
                except FileNotFoundError:
                    continue
                except OSError as e:
                    self.unreadable.append((path, f"cannot read it: {e.strerror or e}"))
                    continue
                if stat.S_ISDIR(st.st_mode):
                    if entry.name in ALWAYS_SKIPPED_DIRS or self.rules.ignored(ignores, path, True):
                        continue
                    if _key(st) not in visited:
                        visited.add(_key(st))
                        subdirs.append((path, ignores, real))
                elif stat.S_ISREG(st.st_mode) and not self.rules.ignored(ignores, path, False):
                    given.add(_key(st))
                    yield path, st, real
            stack.extend(reversed(subdirs))
        for path, ignores, st, target in file_links:
            if _key(st) not in given and self._link_wanted(path, ignores, st, target):
                given.add(_key(st))
                yield path, st, target

    def _left_out(self, real: Path, is_dir: bool) -> bool:
        return self.rules.left_out(self.root, real, is_dir)

    def _link(
        self,
        path: Path,
        ignores: list[_Ignore],
        dir_links: deque[tuple[Path, list[_Ignore], os.stat_result, Path]],
        file_links: list[tuple[Path, list[_Ignore], os.stat_result, Path]],
    ) -> None:
        """Sort a link met by the walk: outside, broken, or a folder or file to judge once the real
        tree is walked (one whose target the tree gave, or a folder it walked, costs no more)."""
        real = Path(os.path.realpath(path))
        if not real.is_relative_to(self.root):
            self.outside.append(path)
            return
        try:
            st = path.stat()  # follows the chain; a dangling link or a loop of links fails here
        except OSError as e:
            self.broken.append((path, f"broken symbolic link ({e.strerror or e})"))
            return
        if stat.S_ISDIR(st.st_mode):
            dir_links.append((path, ignores, st, real))
        elif stat.S_ISREG(st.st_mode):
            file_links.append((path, ignores, st, real))

    def _link_wanted(self, path: Path, ignores: list[_Ignore], st: os.stat_result, real: Path) -> bool:
        """Judged twice: by its own name where it lies, and by its target where that lies (a link to
        an ignored file or to .git must not bring it in under another name)."""
        is_dir = stat.S_ISDIR(st.st_mode)
        try:
            return not (
                (is_dir and path.name in ALWAYS_SKIPPED_DIRS)
                or self.rules.ignored(ignores, path, is_dir)
                or self._left_out(real, is_dir)
            )
        except OSError as e:  # a .gitignore on the target's way that cannot be read
            self.unreadable.append((path, f"cannot read it: {e.strerror or e}"))
            return False
