"""``make run``'s own launcher end to end (``python -m ragserve.deployments.platform run CONFIG``): it serves
the config on ``RAGSERVE_PORT``, says when it is ready, starts none of the processes it leaves out on
one machine, keeps HAProxy's side ports on the loopback, and a stop (Ctrl-C to its process group)
ends the whole tree, HAProxy included, so the port is free for the next ``make run``. Every other way
of stopping it is tested on the launcher alone."""

from __future__ import annotations

import ipaddress
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from benchmarks.bench_memory import serve_config
from benchmarks.common import free_port, wait_healthy
from ragserve.deployments.platform import high_throughput_enabled, sigint_as_in_a_terminal
from ragserve.testing.fake_openai import FakeOpenAI
from tests.integration.conftest import MODEL_CACHE, REPO

pytestmark = pytest.mark.slow


def _port_is_free(port: int) -> bool:
    """Whether a server could listen on ``port`` now (as servers do, past connections in TIME_WAIT)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


# How the launcher is stopped here: (signal, to its whole process group?). The launcher turns every
# stop into the same Ctrl-C to its server, which runs in a session of its own (so a signal to the
# launcher's group never reaches it directly); that each of SIGINT, SIGTERM and SIGHUP, to the
# launcher or its group, does so is tested on the launcher alone (tests/unit/deployments/
# test_platform.py). The real server then sees one stop whatever the signal was: it is run here once,
# as Ctrl-C in a terminal stops it (a start costs about a minute of Ray and Serve; a second stop by
# SIGTERM to the launcher alone ran the same server path).
STOPS = {
    "ctrl-c": (signal.SIGINT, True),  # what Ctrl-C in the terminal sends
}


def _loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip.split("%")[0])
    mapped = getattr(address, "ipv4_mapped", None)
    return bool(address.is_loopback or (mapped is not None and mapped.is_loopback))


@pytest.mark.parametrize("stop", list(STOPS))
def test_make_run_serves_the_config_and_a_stop_ends_every_process(tmp_path: Path, stop: str) -> None:
    """Each way of stopping shuts Serve and then Ray down and leaves no HAProxy on the port."""
    port = free_port()
    config = serve_config(REPO / "configs" / "remote-llm.yaml", free_port(), tmp_path)  # RAGSERVE_PORT wins
    with FakeOpenAI(answer="KAITO runs models on Kubernetes [1].", model="upstream-model") as upstream:
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("RAY_SERVE_")},
            "RAGSERVE_PORT": str(port),
            "RAGSERVE_STORAGE_DIR": str(tmp_path / "data"),
            "RAGSERVE_LLM_URL": upstream.url,
            "RAGSERVE_MODEL_CACHE_DIR": str(MODEL_CACHE),
        }
        log = open(tmp_path / "server.log", "w")  # noqa: SIM115  (closed below, after the server)
        launcher = subprocess.Popen(
            [sys.executable, "-m", "ragserve.deployments.platform", "run", str(config)],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=sigint_as_in_a_terminal,  # a test run in the background inherits it ignored
        )
        tree: list[psutil.Process] = []
        side_ports: set[int] = set()
        try:
            base = f"http://127.0.0.1:{port}"
            wait_healthy(base, timeout_s=600)
            ready = f"ragserve ready on {base} (Ctrl-C to stop)"
            deadline = time.monotonic() + 60  # the launcher polls /health too, and then says so
            while ready not in (tmp_path / "server.log").read_text() and time.monotonic() < deadline:
                time.sleep(0.2)
            doc = {"text": "KAITO is a Kubernetes operator that runs AI models.", "metadata": {}}
            assert httpx.post(f"{base}/index", json={"index_name": "kb", "documents": [doc]}, timeout=120).is_success
            if stop == "ctrl-c":
                more = [{"text": f"Document {i} is about subject {i} and nothing else."} for i in range(300)]
                more_body = {"index_name": "more", "documents": more}
                assert httpx.post(f"{base}/index", json=more_body, timeout=300).is_success
            chat = httpx.post(
                f"{base}/v1/chat/completions",
                json={"index_name": "kb", "messages": [{"role": "user", "content": "What is KAITO?"}]},
                timeout=120,
            )
            assert chat.status_code == 200, chat.text
            assert "KAITO runs models" in chat.json()["choices"][0]["message"]["content"]

            tree = psutil.Process(launcher.pid).children(recursive=True)
            commands = [" ".join(p.cmdline()) for p in tree]
            assert not [c for c in commands if "autoscaler/_private/monitor.py" in c]  # nothing to autoscale
            assert bool([c for c in commands if "log_monitor.py" in c]) is not high_throughput_enabled()
            haproxies = [p for p in tree if p.name() == "haproxy"]
            assert bool(haproxies) is high_throughput_enabled()
            # HAProxy listens where the application does (the loopback), never on every interface
            listening = [c.laddr for p in haproxies for c in p.net_connections("inet") if c.status == "LISTEN"]
            assert {a.ip for a in listening} <= {"127.0.0.1"}, listening
            side_ports = {a.port for a in listening} - {port}
            assert not haproxies or len(side_ports) >= 2  # the stats page and Prometheus, on free ports
            assert not side_ports & {8404, 9101}
            # and so does Ray: its metrics port (which names every index), its agents, and the
            # replicas' gRPC servers, which Ray itself binds on every interface
            beyond = [
                (p.name(), c.laddr)
                for p in [psutil.Process(launcher.pid), *tree]
                for c in p.net_connections("inet")
                if c.status == "LISTEN" and not _loopback(c.laddr.ip)
            ]
            assert not beyond, beyond
        finally:
            signum, group = STOPS[stop]
            if group:
                os.killpg(launcher.pid, signum)
            else:
                launcher.send_signal(signum)
            try:
                launcher.wait(timeout=120)
            finally:
                if launcher.poll() is None:
                    os.killpg(launcher.pid, signal.SIGKILL)
                log.close()
    _, survivors = psutil.wait_procs(tree, timeout=30)  # Ray's processes and HAProxy, however Ray ended
    assert not survivors, [p.name() for p in survivors]
    assert _port_is_free(port) and all(_port_is_free(p) for p in side_ports)
    output = (tmp_path / "server.log").read_text()
    assert "Serve's logs are in" in output
    assert f"ragserve ready on http://127.0.0.1:{port} (Ctrl-C to stop)" in output
    assert "ragserve: stopped" in output
