"""``make run``'s own launcher end to end (``python -m deployments.platform run CONFIG``): it serves
the config, starts none of the processes it leaves out on one machine, and Ctrl-C (SIGINT to the
terminal's process group) or SIGTERM stops the whole tree, HAProxy included, so the port is free for
the next ``make run``."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import psutil
import pytest

from benchmarks.bench_memory import serve_config
from benchmarks.common import free_port, wait_healthy
from deployments.platform import high_throughput_enabled, private_haproxy_ports, sigint_as_in_a_terminal
from tests.fakes.fake_openai import FakeOpenAI
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


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_make_run_serves_the_config_and_a_stop_ends_every_process(tmp_path: Path, stop: signal.Signals) -> None:
    """Ctrl-C in the terminal (SIGINT to the process group) and a service manager's SIGTERM (to
    the launcher) both shut Serve and then Ray down."""
    port = free_port()
    config = serve_config(REPO / "configs" / "remote-llm.yaml", port, tmp_path)
    with FakeOpenAI(answer="KAITO runs models on Kubernetes [1].", model="upstream-model") as upstream:
        env = {
            **os.environ,
            "RAGSERVE_STORAGE_DIR": str(tmp_path / "data"),
            "RAGSERVE_LLM_URL": upstream.url,
            "RAGSERVE_MODEL_CACHE_DIR": str(MODEL_CACHE),
            **private_haproxy_ports(),  # never the fixed ports of another HAProxy on this machine
        }
        log = open(tmp_path / "server.log", "w")  # noqa: SIM115  (closed below, after the server)
        launcher = subprocess.Popen(
            [sys.executable, "-m", "deployments.platform", "run", str(config)],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=sigint_as_in_a_terminal,  # a test run in the background inherits it ignored
        )
        tree: list[psutil.Process] = []
        try:
            base = f"http://127.0.0.1:{port}"
            wait_healthy(base, timeout_s=600)
            doc = {"text": "KAITO is a Kubernetes operator that runs AI models.", "metadata": {}}
            assert httpx.post(f"{base}/index", json={"index_name": "kb", "documents": [doc]}, timeout=120).is_success
            more = [{"text": f"Document {i} is about subject {i} and nothing else."} for i in range(300)]
            assert httpx.post(f"{base}/index", json={"index_name": "more", "documents": more}, timeout=300).is_success
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
        finally:
            if stop == signal.SIGINT:
                os.killpg(launcher.pid, signal.SIGINT)  # what Ctrl-C in the terminal sends
            else:
                launcher.send_signal(signal.SIGTERM)
            try:
                launcher.wait(timeout=120)
            finally:
                if launcher.poll() is None:
                    os.killpg(launcher.pid, signal.SIGKILL)
                log.close()
    _, survivors = psutil.wait_procs(tree, timeout=30)  # Ray's processes exit as it shuts down
    assert not survivors, [p.name() for p in survivors]
    assert _port_is_free(port)
    assert "Serve's logs are in" in (tmp_path / "server.log").read_text()
