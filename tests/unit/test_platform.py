"""The one definition of the environment Ray starts with (deployments.platform)."""

from __future__ import annotations

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
