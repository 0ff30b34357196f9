"""Which files ``ragserve ingest`` picks: supported types, .gitignore files at every level (with
negation, and from the repository's top when a subfolder is given), include/exclude globs."""

from __future__ import annotations

from pathlib import Path

from app.cli.files import FileSelector, discover


def names(root: Path, base: Path, **kw) -> list[str]:
    include, exclude = kw.pop("include", ()), kw.pop("exclude", ())
    return [f.rel for f in discover([root], base, FileSelector(include, exclude), **kw)]


def test_gitignore_at_every_level_and_globs(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    (tmp_path / ".gitignore").write_text("*.log.md\ndist/\n")
    for rel in (
        "README.md",
        "a/keep.md",
        "a/drop.log.md",
        "a/b/notes.txt",
        "a/b/secret.md",
        "a/b/ok.md",
        "dist/out.md",
        "node_modules/x/readme.md",
        "a/image.png",
        "a/b/main.py",
    ):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x")
    (tmp_path / "a" / "b" / ".gitignore").write_text("*.md\n!ok.md\n")
    assert names(tmp_path, tmp_path) == ["README.md", "a/b/main.py", "a/b/notes.txt", "a/b/ok.md", "a/keep.md"]
    # a subfolder still honours the repository's .gitignore above it; ids stay relative to the base
    assert names(tmp_path / "a", tmp_path) == ["a/b/main.py", "a/b/notes.txt", "a/b/ok.md", "a/keep.md"]
    assert names(tmp_path / "a", tmp_path / "a") == ["b/main.py", "b/notes.txt", "b/ok.md", "keep.md"]
    assert "a/b/secret.md" in names(tmp_path, tmp_path, gitignore=False)
    assert names(tmp_path, tmp_path, include=["*.md"], exclude=["a/b/"]) == ["README.md", "a/keep.md"]
    skipped: list[tuple[str, str]] = []
    assert discover([tmp_path / "a" / "image.png"], tmp_path, FileSelector(), skipped=skipped) == []
    assert skipped == [("a/image.png", "unsupported file type or excluded")]
