"""docs/architecture.md §2: ``ragserve/`` is pure logic with no Ray, so the RAG core is testable in milliseconds
and reusable outside Serve; only ``ragserve/deployments/`` may import Ray."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

APP = Path(__file__).resolve().parents[2] / "ragserve"


def _pure_files() -> list[Path]:
    """Every module of the package except the Serve shells (``ragserve/deployments``)."""
    return sorted(f for f in APP.rglob("*.py") if "deployments" not in f.relative_to(APP).parts)


def _is_ray(module: str | None) -> bool:
    return bool(module) and (module == "ray" or module.startswith("ray."))


def _ray_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [f"{path.name}:{node.lineno} import {a.name}" for a in node.names if _is_ray(a.name)]
        elif isinstance(node, ast.ImportFrom) and _is_ray(node.module):
            found.append(f"{path.name}:{node.lineno} from {node.module} import ...")
    return found


def test_no_module_under_app_imports_ray() -> None:
    files = _pure_files()
    assert len(files) > 20  # the walk found the package
    offenders = [hit for f in files for hit in _ray_imports(f)]
    assert offenders == [], offenders


def test_importing_every_app_module_does_not_load_ray() -> None:
    modules = sorted(
        ".".join(f.relative_to(APP.parent).with_suffix("").parts).removesuffix(".__init__") for f in _pure_files()
    )
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}:\n    importlib.import_module(m)\n"
        "loaded = sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.'))\n"
        "print(loaded[:5]); sys.exit(1 if loaded else 0)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=APP.parent, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
