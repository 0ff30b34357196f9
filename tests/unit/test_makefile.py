"""``make run`` installs what serving needs, ``make test`` adds the test tools: separate stamps, so
neither re-installs what the other did (``make -n`` shows what each would do)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def planned(target: str, venv: Path, **variables: str) -> str:
    """The commands ``make TARGET`` would run with this venv (nothing is run)."""
    args = [f"VENV={venv}", *(f"{k}={v}" for k, v in variables.items())]
    return subprocess.run(
        ["make", "-n", "-C", str(REPO), target, *args], capture_output=True, text=True, check=True
    ).stdout


def stamp(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    later = time.time() + 5  # newer than pyproject.toml, whatever the checkout's times
    os.utime(path, (later, later))


def test_run_installs_only_what_serving_needs_and_test_adds_the_rest(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    fresh_run = planned("run", venv)
    assert '-e ".[cpu]"' in fresh_run and "test]" not in fresh_run and "chromium" not in fresh_run
    stamp(venv / ".installed-run")  # after `make run`
    then_test = planned("test", venv)
    assert '-e ".[cpu,test]"' in then_test and "chromium" in then_test
    assert '-e ".[cpu]"' not in then_test and "-m venv" not in then_test  # serving's part is there
    stamp(venv / ".installed-test")  # after `make test`
    assert "pip install" not in planned("run", venv) and "pip install" not in planned("test", venv)


def test_make_run_port_sets_the_variable_the_server_and_the_cli_read(tmp_path: Path) -> None:
    from ragserve.serve_port import PORT_ENV

    venv = tmp_path / "venv"
    stamp(venv / ".installed-run")
    assert f"{PORT_ENV}=8123 " in planned("run", venv, PORT="8123")
    assert PORT_ENV not in planned("run", venv)  # unset: the config's port, or RAGSERVE_PORT from the shell


def test_gpu_check_looks_at_the_machine_before_it_installs_then_installs_once(tmp_path: Path) -> None:
    venv = tmp_path / "gpu-venv"
    plan = planned("gpu-check", tmp_path / "venv", GPU_VENV=str(venv), PYTHON="python3")
    fresh = [line for line in plan.splitlines() if not line.startswith("make")]  # make's own "Entering directory"
    assert fresh[0] == f"python3 -m benchmarks.gpu_check preflight --venv {venv}"  # before any venv or pip
    steps = [next(i for i, line in enumerate(fresh) if what in line) for what in ("-m venv", " install", " run")]
    assert steps == sorted(steps) and steps[0] > 0
    assert f"{venv}/bin/python -m benchmarks.gpu_check install" in fresh
    stamp(venv / ".installed-gpu")  # after an install
    again = planned("gpu-check", tmp_path / "venv", GPU_VENV=str(venv), GPU_CHECK_ARGS="--quick", PYTHON="python3")
    assert "install" not in again and "-m venv" not in again
    assert [line for line in again.splitlines() if not line.startswith("make")] == [
        f"python3 -m benchmarks.gpu_check preflight --venv {venv}",
        f"PYTHONUNBUFFERED=1 {venv}/bin/python -m benchmarks.gpu_check run --quick",
    ]


def test_gpu_check_on_a_machine_without_an_nvidia_driver_stops_at_once_with_a_message(tmp_path: Path) -> None:
    """PATH holds no nvidia-smi (an empty folder): `make gpu-check` ends in its first step, says why, and
    has created no venv; the interpreter is named by its path (the preflight needs nothing installed)."""
    empty = tmp_path / "bin"
    empty.mkdir()
    venv = tmp_path / "gpu-venv"
    started = time.monotonic()
    done = subprocess.run(
        [shutil.which("make") or "make", "-C", str(REPO), "gpu-check", f"GPU_VENV={venv}", f"PYTHON={sys.executable}"],
        env={**os.environ, "PATH": str(empty)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "gpu-check: missing: nvidia-smi was not found on PATH" in done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert not venv.exists() and "pip" not in done.stdout
    assert time.monotonic() - started < 60
