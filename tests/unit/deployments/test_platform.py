"""The one definition of the environment Ray starts with (ragserve.deployments.platform)."""

from __future__ import annotations

import os

import pytest

from ragserve.deployments.platform import HIGH_THROUGHPUT_VARS, SWITCH, high_throughput_enabled, serve_env


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


# --- make run: port, side ports, what a stop leaves (issue 21) -------------------------------------
def test_the_port_comes_from_ragserve_port_over_the_config() -> None:
    from ragserve.deployments.platform import served_config, url_of

    config = {"http_options": {"host": "127.0.0.1", "port": 8000, "request_timeout_s": 600}, "applications": []}
    assert served_config(config, {}) == (config, "127.0.0.1", 8000)
    served, host, port = served_config(config, {"RAGSERVE_PORT": "8123"})
    assert (host, port) == ("127.0.0.1", 8123) and served["http_options"]["port"] == 8123
    assert served["http_options"]["request_timeout_s"] == 600 and config["http_options"]["port"] == 8000
    assert served_config({}, {})[1:] == ("127.0.0.1", 8000)
    for bad in ("http", "0", "70000", "-1"):
        with pytest.raises(ValueError, match="RAGSERVE_PORT"):
            served_config(config, {"RAGSERVE_PORT": bad})
    assert url_of("127.0.0.1", 8123) == "http://127.0.0.1:8123"
    assert url_of("0.0.0.0", 80) == "http://127.0.0.1:80" and url_of("::1", 80) == "http://[::1]:80"


def test_the_cli_calls_the_port_the_server_serves_on() -> None:
    from ragserve.cli.client import default_url

    assert default_url({}) == "http://127.0.0.1:8000"
    assert default_url({"RAGSERVE_PORT": "8123"}) == "http://127.0.0.1:8123"
    assert default_url({"RAGSERVE_PORT": "8123", "RAGSERVE_URL": "http://h:1"}) == "http://h:1"


def test_side_ports_are_free_ones_on_the_host_and_a_set_one_is_kept() -> None:
    import socket

    from ragserve.deployments.platform import FIXED_PORT_VARS, private_haproxy_ports

    ports = private_haproxy_ports("127.0.0.1", {"RAY_SERVE_HAPROXY_STATS_PORT": "18404"})
    assert set(ports) == set(FIXED_PORT_VARS) and ports["RAY_SERVE_HAPROXY_STATS_PORT"] == "18404"
    assert len(set(ports.values())) == len(FIXED_PORT_VARS)  # no two alike
    assert all(int(p) not in (8404, 9101, 8500, 9500) for k, p in ports.items() if k != "RAY_SERVE_HAPROXY_STATS_PORT")
    for var, port in ports.items():  # each can be listened on now
        if var != "RAY_SERVE_HAPROXY_STATS_PORT":
            with socket.socket() as s:
                s.bind(("127.0.0.1", int(port)))


def test_haproxy_side_ports_listen_on_the_frontend_host() -> None:
    """Ray's template binds the stats page and the Prometheus port on every interface; the hook
    moves them to ``http_options.host`` (fails when a Ray release changes those lines)."""
    import importlib

    from ray.serve._private import haproxy_templates

    from ragserve.deployments.platform import SIDE_PORTS_HOOK, side_ports_on_the_frontend_host

    original = haproxy_templates.HAPROXY_CONFIG_TEMPLATE
    try:
        side_ports_on_the_frontend_host()
        template = haproxy_templates.HAPROXY_CONFIG_TEMPLATE
        assert "bind {{ config.frontend_host }}:{{ config.stats_port }}" in template
        assert "bind {{ config.frontend_host }}:{{ config.metrics_port }}" in template
        binds = [line.strip() for line in template.splitlines() if line.strip().startswith("bind ")]
        assert binds and all(
            b.startswith(("bind {{ config.frontend_host }}", "bind {{ config.grpc_frontend_host }}")) for b in binds
        )
        module, _, name = SIDE_PORTS_HOOK.rpartition(".")
        assert getattr(importlib.import_module(module), name) is side_ports_on_the_frontend_host
    finally:
        haproxy_templates.HAPROXY_CONFIG_TEMPLATE = original


def test_each_run_keeps_haproxys_files_in_its_own_folder(tmp_path) -> None:
    from ragserve.deployments.platform import HAPROXY_FILE_VARS, haproxy_files

    files = haproxy_files(tmp_path / "haproxy")
    assert set(files) == set(HAPROXY_FILE_VARS)
    assert all(p == str(tmp_path / "haproxy") or p.startswith(f"{tmp_path / 'haproxy'}/") for p in files.values())


def test_a_left_haproxy_of_this_run_is_stopped_and_no_other(tmp_path) -> None:
    """What a killed Ray leaves: an haproxy whose config is in this run's folder. Another run's
    survives."""
    import subprocess
    import sys
    import time

    from ragserve.deployments.platform import find_haproxies, stop_haproxies

    fake = tmp_path / "bin" / "haproxy"  # a process named haproxy, as Ray starts it: haproxy -db -f CFG
    fake.parent.mkdir()
    fake.symlink_to(sys.executable)
    ours, theirs = tmp_path / "run-a", tmp_path / "run-b"
    procs = [
        subprocess.Popen([str(fake), "-c", "import time; time.sleep(60)", "-f", f"{d}/node/haproxy.cfg"])
        for d in (ours, theirs)
    ]
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (find_haproxies(ours) and find_haproxies(theirs)):
            time.sleep(0.05)  # until both have exec'd
        assert find_haproxies(ours) == [procs[0].pid] and find_haproxies(theirs) == [procs[1].pid]
        assert stop_haproxies(ours, timeout_s=5) == [procs[0].pid]
        assert procs[0].wait(timeout=5) is not None and find_haproxies(ours) == []
        assert procs[1].poll() is None  # another run's is left alone
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_the_servers_environment(tmp_path) -> None:
    from ragserve.deployments.platform import FIXED_PORT_VARS, HAPROXY_FILE_VARS, SINGLE_NODE_VAR, server_env

    env = server_env("127.0.0.1", {"PATH": "/bin", "RAY_SERVE_HAPROXY_STATS_PORT": "18404"}, tmp_path)
    assert env["PATH"] == "/bin" and env[SINGLE_NODE_VAR] == "0"  # a loopback server: a loopback Ray
    assert env["RAY_SERVE_HAPROXY_STATS_PORT"] == "18404" and all(var in env for var in FIXED_PORT_VARS)
    assert all(env[var].startswith(str(tmp_path)) for var in HAPROXY_FILE_VARS)
    assert SINGLE_NODE_VAR not in server_env("0.0.0.0", {}, tmp_path)  # reachable from elsewhere: as Ray decides
    assert SINGLE_NODE_VAR not in server_env("127.0.0.1", {"RAY_ADDRESS": "ray://head:10001"}, tmp_path)
    off = server_env("127.0.0.1", {"RAGSERVE_HIGH_THROUGHPUT": "0"}, tmp_path)
    assert not any(var in off for var in (*FIXED_PORT_VARS, *HAPROXY_FILE_VARS))


def test_on_a_loopback_ray_grpc_servers_bind_the_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    """Serve's replicas bind their gRPC server on ``[::]:0``; on a Ray on the loopback the hook
    makes that the loopback (and leaves an explicit address, and any other Ray, alone)."""
    from ray._common import tls_utils

    from ragserve.deployments.platform import SINGLE_NODE_VAR, _grpc_on_the_loopback

    class Server:
        def __init__(self) -> None:
            self.addresses: list[str] = []

        def add_insecure_port(self, address: str) -> int:
            self.addresses.append(address)
            return 1234

    monkeypatch.setattr(tls_utils, "add_port_to_grpc_server", tls_utils.add_port_to_grpc_server)
    monkeypatch.delenv(SINGLE_NODE_VAR, raising=False)
    _grpc_on_the_loopback()  # a Ray as Ray decides: nothing changes
    server = Server()
    tls_utils.add_port_to_grpc_server(server, "[::]:0")
    monkeypatch.setenv(SINGLE_NODE_VAR, "0")
    _grpc_on_the_loopback()
    _grpc_on_the_loopback()  # twice (every worker runs the hook once; a second call adds nothing)
    for address in ("[::]:0", "0.0.0.0:5000", "10.1.2.3:7"):
        assert tls_utils.add_port_to_grpc_server(server, address) == 1234
    assert server.addresses == ["[::]:0", "127.0.0.1:0", "127.0.0.1:5000", "10.1.2.3:7"]


# --- make run's launcher, every way of stopping it ------------------------------------------------
# The launcher with its server replaced by a stand-in that records the signal it gets: each stop
# (Ctrl-C, SIGTERM to the launcher or to its group, SIGHUP) must reach the server as Ctrl-C and end
# in "ragserve: stopped". tests/integration/test_make_run.py runs two of them on the real server.
_STAND_IN = r"""
import signal, sys, time
from pathlib import Path
marker = Path(sys.argv[1])
def on_signal(signum, frame):
    marker.write_text(signal.Signals(signum).name)
    sys.exit(0)
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(s, on_signal)
marker.write_text("up")
while True:
    time.sleep(0.05)
"""

_LAUNCHER = r"""
import subprocess, sys
from ragserve.deployments import platform
config, marker, stand_in = sys.argv[1:4]
real = subprocess.Popen
def server(cmd, **kwargs):  # the server's own environment and preexec_fn (its session, its death signal)
    assert cmd[-2:] == ["serve", cmd[-1]], cmd
    return real([sys.executable, "-c", stand_in, marker], **kwargs)
platform.subprocess.Popen = server
platform._healthy = lambda url: True
sys.exit(platform.launch([config]))
"""


@pytest.mark.parametrize(
    ("signum", "group"),
    [("SIGINT", True), ("SIGTERM", False), ("SIGTERM", True), ("SIGHUP", True)],
    ids=["ctrl-c", "sigterm", "sigterm-group", "sighup"],
)
def test_every_stop_of_the_launcher_stops_its_server_as_ctrl_c_does(tmp_path, signum: str, group: bool) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    import psutil
    import yaml

    from ragserve.deployments.platform import sigint_as_in_a_terminal
    from ragserve.serve_port import free_port

    config = tmp_path / "serve.yaml"
    config.write_text(yaml.safe_dump({"http_options": {"port": free_port()}, "applications": []}))
    marker = tmp_path / "server-got"
    out = tmp_path / "launcher.log"
    with open(out, "w") as log:
        launcher = subprocess.Popen(
            [sys.executable, "-c", _LAUNCHER, str(config), str(marker), _STAND_IN],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=sigint_as_in_a_terminal,
        )
        try:
            deadline = time.monotonic() + 60
            while not (marker.exists() and marker.read_text() == "up" and "ragserve ready on" in out.read_text()):
                assert launcher.poll() is None and time.monotonic() < deadline, out.read_text()
                time.sleep(0.05)
            server = psutil.Process(launcher.pid).children()[0]
            assert os.getsid(server.pid) != os.getsid(launcher.pid)  # a session of its own
            sig = getattr(signal, signum)
            if group:
                os.killpg(launcher.pid, sig)
            else:
                launcher.send_signal(sig)
            assert launcher.wait(timeout=30) == 0, out.read_text()
        finally:
            if launcher.poll() is None:
                os.killpg(launcher.pid, signal.SIGKILL)
    assert marker.read_text() == "SIGINT"  # asked to stop as Ctrl-C asks: Serve, then Ray
    assert not psutil.pid_exists(server.pid) or server.status() == psutil.STATUS_ZOMBIE
    assert out.read_text().rstrip().endswith("ragserve: stopped")


def test_a_free_port_is_picked_below_the_kernels_ephemeral_range(tmp_path) -> None:
    """A port from bind(0) may be handed to another socket (Ray starts dozens) before the server
    that was to bind it does: HAProxy's side ports then failed with "Address already in use". A
    picked port lies below the ephemeral range, free; without room there, the kernel picks."""
    import socket

    from ragserve.serve_port import FREE_PORT_FLOOR, ephemeral_range, free_port, free_ports

    span = tmp_path / "range"
    span.write_text("32768\t60999\n")
    assert ephemeral_range(str(span)) == (32768, 60999)
    assert ephemeral_range(str(tmp_path / "absent")) is None
    for _ in range(20):
        port = free_port(ephemeral=(32768, 60999))
        assert FREE_PORT_FLOOR <= port < 32768
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # free indeed
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        # no room below a range that starts low: the kernel's pick, never a port in use
        picks = {free_port(ephemeral=(FREE_PORT_FLOOR + 10, 60999)) for _ in range(20)}
        assert taken not in picks
    assert free_port("::1", ephemeral=(32768, 60999)) < 32768 if socket.has_ipv6 else True
    # several at once are all different, below the range or not (each is held until all are chosen)
    for span in ((32768, 60999), (FREE_PORT_FLOOR + 10, 60999)):
        for _ in range(50):
            assert len(set(free_ports(4, ephemeral=span))) == 4
    assert free_ports(0) == []


@pytest.mark.parametrize("failure", ["raise RuntimeError('HAProxy crashed during startup')", "sys.exit(3)"])
def test_a_failed_serve_start_ends_the_server_process_whatever_threads_are_left(failure: str) -> None:
    """``make run``'s server process exits (status non-zero, the traceback shown) when ``serve run``
    fails, even with a thread left that the interpreter's exit would wait for: the launcher waits on
    this process, and once waited on one that served nothing until it was killed."""
    import subprocess
    import sys

    code = f"""
import sys, threading, time
from ragserve.deployments import platform
def failing(argv):
    threading.Thread(target=time.sleep, args=(3600,)).start()  # not a daemon: exit would wait for it
    {failure}
platform.serve_run = failing
platform.serve_main(["config.yaml"])
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == (3 if "exit" in failure else 1), done.stderr
    if "RuntimeError" in failure:
        assert "HAProxy crashed during startup" in done.stderr


def test_a_local_ray_never_joins_a_cluster_another_process_started(monkeypatch: pytest.MonkeyPatch) -> None:
    """ray.init() with no address joins the cluster named in /tmp/ray/ray_current_cluster (``ray
    start``, another test's multi-node cluster) and then refuses num_cpus: init_local_ray asks for
    a Ray of its own unless told an address."""
    import ray

    from ragserve.deployments import platform

    calls: list[dict] = []
    monkeypatch.setattr(ray, "init", lambda **kw: calls.append(kw))
    for name in ("RAY_SERVE_ENABLE_HA_PROXY", "RAY_SERVE_THROUGHPUT_OPTIMIZED"):
        monkeypatch.delenv(name, raising=False)
    with monkeypatch.context() as m:
        m.setattr(os, "environ", dict(os.environ))  # init_local_ray exports the mode's variables
        platform.init_local_ray(num_cpus=2, high_throughput=False)
        platform.init_local_ray(high_throughput=False, address="ray://head:10001")
    assert calls[0]["address"] == "local" and calls[0]["num_cpus"] == 2
    assert calls[1]["address"] == "ray://head:10001"
