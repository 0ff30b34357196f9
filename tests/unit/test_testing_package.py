"""``ragserve/testing/`` holds what the tests, benchmarks and load tests share, so benchmarks/ and
load_tests/ import nothing from tests/ (a test suite's helpers are not an API: moving a fixture must
not break a benchmark), and what they import from ``ragserve.testing`` runs without pytest.

Every import counts, wherever it is written (a function body too): benchmarks import lazily.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT_DIRS = ("benchmarks", "load_tests")


def script_files() -> list[Path]:
    return sorted(f for d in SCRIPT_DIRS for f in (REPO / d).rglob("*.py"))


def imported_modules(source: str, filename: str = "<planted>") -> list[tuple[int, str]]:
    """(line, module) for every import in ``source``; a relative import is given with its dots."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source, filename=filename)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            if node.module is None:  # ``from . import x``, ``from tests import x`` names x too
                found += [(node.lineno, f"{module}{a.name}") for a in node.names]
            else:
                found.append((node.lineno, module))
    return found


def is_tests(module: str) -> bool:
    return module == "tests" or module.startswith("tests.")


def imports_of_tests(source: str, filename: str = "<planted>") -> list[str]:
    return [f"{filename}:{line} imports {m}" for line, m in imported_modules(source, filename) if is_tests(m)]


def test_benchmarks_and_load_tests_import_nothing_from_tests() -> None:
    files = script_files()
    assert len(files) > 5  # the walk found the scripts
    bad = [hit for f in files for hit in imports_of_tests(f.read_text(), str(f.relative_to(REPO)))]
    assert bad == [], "move what they need into ragserve/testing/: " + "; ".join(bad)


def test_the_package_imports_nothing_from_tests() -> None:
    files = sorted((REPO / "ragserve").rglob("*.py"))
    bad = [hit for f in files for hit in imports_of_tests(f.read_text(), str(f.relative_to(REPO)))]
    assert bad == []


@pytest.mark.parametrize(
    "source",
    [
        "from tests.conftest import InProcessEmbedder\n",
        "def f():\n    import tests.live_server\n",
        "from tests import loopback\n",
        "import tests\n",
    ],
)
def test_the_check_catches_an_import_of_tests(source: str) -> None:
    assert len(imports_of_tests(source)) == 1


def test_the_check_lets_other_imports_through() -> None:
    assert imports_of_tests("import testsuite\nfrom ragserve.testing import embedder\nfrom . import tests\n") == []


def shared_modules_used_by_scripts() -> list[str]:
    """The ``ragserve.testing`` modules benchmarks/ and load_tests/ import."""
    used = {
        m
        for f in script_files()
        for _, m in imported_modules(f.read_text(), str(f))
        if m.startswith("ragserve.testing.")
    }
    return sorted(used)


def test_what_benchmarks_import_from_ragserve_testing_loads_without_pytest() -> None:
    """Import each of them in a fresh interpreter where ``import pytest`` fails: a module that needs
    pytest, itself or through what it imports, belongs in the test suite, not here."""
    used = shared_modules_used_by_scripts()
    assert "ragserve.testing.embedder" in used and "ragserve.testing.fake_openai" in used
    code = (
        "import importlib, sys\n"
        "sys.modules['pytest'] = None  # import pytest now raises ImportError\n"
        f"for m in {used!r}:\n    importlib.import_module(m)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
