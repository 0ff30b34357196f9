"""The one definition of the environment Ray starts with (deployments.platform)."""

from __future__ import annotations

import os

import pytest

from deployments.platform import HIGH_THROUGHPUT_VARS, SWITCH, high_throughput_enabled, serve_env


@pytest.mark.parametrize(
    ("value", "on"),
    [(None, True), ("1", True), ("yes", True), ("0", False), ("false", False), ("OFF", False), (" no ", False)],
)
def test_switch_defaults_on_and_turns_off(value: str | None, on: bool) -> None:
    env = {} if value is None else {SWITCH: value}
    assert high_throughput_enabled(env) is on


def test_off_is_written_out_so_an_inherited_value_cannot_turn_it_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SWITCH, "0")
    assert serve_env() == dict.fromkeys(HIGH_THROUGHPUT_VARS, "0")
    assert serve_env(high_throughput=True) == {"RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"}


def test_haproxy_left_running_under_the_launcher_is_found_and_stopped(tmp_path) -> None:
    """``make run`` notes the HAProxy processes of its tree before Ray shuts down and stops those
    that outlive it. A stand-in named haproxy (a copy of ``sleep``), a grandchild of this process."""
    import shutil
    import subprocess
    import time

    from deployments.platform import haproxies_under, stop_leftovers

    fake = tmp_path / "haproxy"
    shutil.copy(shutil.which("sleep") or "/bin/sleep", fake)
    parent = subprocess.Popen(["/bin/sh", "-c", f"{fake} 60 & wait"])
    try:
        deadline = time.monotonic() + 10
        while not (found := haproxies_under(os.getpid())) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(found) == 1
        pid, started = found[0]
        assert stop_leftovers([(pid, started + 1)]) == []  # another process under a recycled pid: left alone
        assert stop_leftovers(found) == [pid]
        parent.wait(timeout=10)  # sh's wait returns once its child is gone
        assert stop_leftovers(found) == []  # gone: nothing to stop
    finally:
        parent.kill()
