"""Locust users for ragserve: RAG chat (plain and streaming, with time-to-first-token and
time-per-output-token as their own metrics), passthrough chat, ingestion and retrieval.

    locust -f load_tests/locustfile.py --host http://127.0.0.1:8000 --headless \
        --csv results/run --html results/run.html -u 8 -r 8 -t 2m
    RAGSERVE_SHAPE=step locust -f load_tests/locustfile.py --host ... --headless --peak-users 16 --step-s 30

Options (also environment variables ``RAGSERVE_<OPTION>``): ``--index-name``, ``--max-tokens``,
``--api-key``; the load shape comes from ``RAGSERVE_SHAPE`` (unset: Locust's -u/-r/-t; ``fixed``:
``--peak-users`` for ``--hold-s``; ``step``: ``--step-users`` more every ``--step-s`` up to ``--peak-users``).
Pick user classes by name on the command line (``locust ... RagChatUser IngestUser``).
"""

from __future__ import annotations

import json
import os
import random
import time
from itertools import count
from typing import Any

from locust import FastHttpUser, LoadTestShape, between, events, stats, task

stats.PERCENTILES_TO_REPORT = [0.5, 0.75, 0.9, 0.95, 0.99, 0.999, 1.0]
stats.PERCENTILES_TO_CHART = [0.5, 0.95, 0.99]

TOPICS = ["pump", "valve", "turbine", "boiler", "compressor", "conveyor", "generator", "chiller"]
QUESTIONS = [f"When was the {t} on line {n} last serviced?" for t in TOPICS for n in range(1, 6)]
SEED_DOCS = [
    {
        "text": f"Service record: the {t} on line {n} was serviced in week {(n * 7) % 52 + 1}; pressure "
        f"{90 + n * 3} kPa, next check in {n + 2} weeks.",
        "metadata": {"topic": t, "line": n},
    }
    for t in TOPICS
    for n in range(1, 6)
]
_doc_ids = count()


def _env(name: str, default: str) -> str:
    return os.environ.get(f"RAGSERVE_{name.upper()}", default)


@events.init_command_line_parser.add_listener
def _options(parser: Any) -> None:
    parser.add_argument("--index-name", default=_env("index_name", "locust"), help="index the users query")
    parser.add_argument("--max-tokens", type=int, default=int(_env("max_tokens", "32")))
    parser.add_argument(
        "--cached-answers",
        action="store_true",
        default=_env("cached_answers", "false").lower() in ("1", "true", "yes"),
        help="let RAG chats be answered from the server's answer cache (off: each sends cache: false, so "
        "every chat runs retrieval and the model, with 25 questions asked over and over)",
    )
    parser.add_argument("--api-key", default=_env("api_key", ""), help="sent as Authorization: Bearer")
    parser.add_argument("--peak-users", type=int, default=int(_env("peak_users", "8")), help="fixed/step: users")
    parser.add_argument("--hold-s", type=int, default=int(_env("hold_s", "60")), help="fixed: duration")
    parser.add_argument("--step-users", type=int, default=int(_env("step_users", "2")))
    parser.add_argument("--step-s", type=int, default=int(_env("step_s", "30")), help="step: seconds per step")


def _headers(env: Any) -> dict[str, str]:
    key = env.parsed_options.api_key if env.parsed_options else ""
    return {"Authorization": f"Bearer {key}"} if key else {}


@events.test_start.add_listener
def _seed_index(environment: Any, **_: Any) -> None:
    """The index exists before the first chat (idempotent: same texts, same documents)."""
    import httpx

    opts = environment.parsed_options
    if environment.host is None or opts is None:
        return
    r = httpx.post(
        f"{environment.host.rstrip('/')}/index",
        headers=_headers(environment),
        timeout=300,
        json={"index_name": opts.index_name, "documents": SEED_DOCS},
    )
    r.raise_for_status()


def fire_metric(env: Any, name: str, value_ms: float) -> None:
    """A custom metric in Locust's tables and CSV, with its percentiles (request type METRIC)."""
    env.events.request.fire(
        request_type="METRIC", name=name, response_time=value_ms, response_length=0, exception=None, context={}
    )


class _RagServeUser(FastHttpUser):
    abstract = True
    wait_time = between(0.1, 0.5)

    def on_start(self) -> None:
        opts = self.environment.parsed_options
        self.index = opts.index_name if opts else "locust"
        self.max_tokens = opts.max_tokens if opts else 32
        self.cached_answers = bool(opts.cached_answers) if opts else False
        self.headers = _headers(self.environment)

    def chat_body(self, rag: bool) -> dict[str, Any]:
        body: dict[str, Any] = {
            "messages": [{"role": "user", "content": random.choice(QUESTIONS)}],
            "max_tokens": self.max_tokens,
        }
        if rag:
            body["index_name"] = self.index
            if not self.cached_answers:
                body["cache"] = False
        return body


class RagChatUser(_RagServeUser):
    """Non-streaming RAG chat; fails on a non-200 or a body without choices."""

    weight = 3

    @task
    def rag_chat(self) -> None:
        with self.client.post(
            "/v1/chat/completions",
            json=self.chat_body(True),
            headers=self.headers,
            name="chat rag",
            catch_response=True,
        ) as r:
            if r.status_code != 200:
                r.failure(f"{r.status_code}: {r.text[:200]}")
            elif not r.json().get("choices"):
                r.failure("no choices in the response")


class StreamingRagChatUser(_RagServeUser):
    """Streaming RAG chat: time to the first content delta (``ttft_ms``) and per output token after
    it (``tpot_ms``); a final SSE error event is a failure."""

    weight = 2

    @task
    def rag_stream(self) -> None:
        t0 = time.perf_counter()
        first = last = None
        deltas = 0
        with self.client.post(
            "/v1/chat/completions",
            json={**self.chat_body(True), "stream": True},
            headers=self.headers,
            name="chat rag stream",
            stream=True,
            catch_response=True,
        ) as r:
            if r.status_code != 200:
                r.failure(f"{r.status_code}")
                return
            buffer = b""
            for block in r.stream:
                buffer += block
                while b"\n\n" in buffer:
                    event, buffer = buffer.split(b"\n\n", 1)
                    data = event.decode().removeprefix("data: ").strip()
                    if not data or data == "[DONE]":
                        continue
                    chunk = json.loads(data)
                    if "error" in chunk:
                        r.failure(f"stream error event: {chunk['error'].get('message')}")
                        return
                    choices = chunk.get("choices") or [{}]
                    if choices[0].get("delta", {}).get("content"):
                        last = time.perf_counter()
                        first = first or last
                        deltas += 1
            if first is None:
                r.failure("no content delta in the stream")
                return
        fire_metric(self.environment, "ttft_ms", (first - t0) * 1000)
        if deltas > 1 and last is not None:
            fire_metric(self.environment, "tpot_ms", (last - first) * 1000 / (deltas - 1))


class PassthroughChatUser(_RagServeUser):
    """Chat without ``index_name``: straight to the LLM (``X-RAG-Mode: passthrough``)."""

    weight = 1

    @task
    def passthrough(self) -> None:
        with self.client.post(
            "/v1/chat/completions",
            json=self.chat_body(False),
            headers=self.headers,
            name="chat passthrough",
            catch_response=True,
        ) as r:
            if r.status_code != 200 or r.headers.get("x-rag-mode") != "passthrough":
                r.failure(f"{r.status_code} mode={r.headers.get('x-rag-mode')}")


class IngestUser(_RagServeUser):
    """``POST /index`` of a few new documents per call (unique texts: nothing is deduplicated)."""

    weight = 1

    @task
    def ingest(self) -> None:
        docs = []
        for _ in range(5):
            i = next(_doc_ids)
            t = TOPICS[i % len(TOPICS)]
            docs.append(
                {
                    "text": f"Locust record {i} from {os.getpid()}: the {t} on line {i % 11} logged "
                    f"{80 + i % 70} kPa at {time.time():.3f}.",
                    "metadata": {"topic": t},
                }
            )
        with self.client.post(
            "/index",
            json={"index_name": self.index, "documents": docs},
            headers=self.headers,
            name="index",
            catch_response=True,
        ) as r:
            if r.status_code != 200 or len(r.json()) != len(docs):
                r.failure(f"{r.status_code}: {r.text[:200]}")


class RetrieveUser(_RagServeUser):
    """``POST /retrieve``: embed + search + fetch, no generation."""

    weight = 3

    @task
    def retrieve(self) -> None:
        with self.client.post(
            "/retrieve",
            json={"index_name": self.index, "query": random.choice(QUESTIONS), "max_node_count": 5},
            headers=self.headers,
            name="retrieve",
            catch_response=True,
        ) as r:
            if r.status_code != 200:
                r.failure(f"{r.status_code}: {r.text[:200]}")


def _parsed(shape: LoadTestShape) -> Any:
    """The parsed command line; a shape only ticks inside a running test, which has one."""
    assert shape.runner is not None and shape.runner.environment.parsed_options is not None
    return shape.runner.environment.parsed_options


class FixedShape(LoadTestShape):
    """``--peak-users`` users for ``--hold-s`` seconds, all started at once."""

    abstract = True

    def tick(self) -> tuple[int, float] | None:
        opts = _parsed(self)
        return (opts.peak_users, opts.peak_users) if self.get_run_time() < opts.hold_s else None


class StepShape(LoadTestShape):
    """``--step-users`` more users every ``--step-s`` seconds up to ``--peak-users``, then one more step
    at the peak; latency against load, one plateau per step."""

    abstract = True

    def tick(self) -> tuple[int, float] | None:
        opts = _parsed(self)
        steps = -(-opts.peak_users // opts.step_users)
        t = self.get_run_time()
        if t >= (steps + 1) * opts.step_s:
            return None
        return min(opts.peak_users, (int(t // opts.step_s) + 1) * opts.step_users), opts.step_users


# Locust uses a shape class whenever the locustfile defines one (and then ignores -u/-r/-t), so the
# shape is chosen before the file is read: RAGSERVE_SHAPE=fixed|step (unset: -u/-r/-t as usual).
_SHAPE = os.environ.get("RAGSERVE_SHAPE", "none")
if _SHAPE == "fixed":

    class SelectedShape(FixedShape):
        abstract = False
elif _SHAPE == "step":

    class SelectedShape(StepShape):  # type: ignore[no-redef]
        abstract = False
elif _SHAPE != "none":
    raise SystemExit(f"RAGSERVE_SHAPE must be fixed, step or none, not {_SHAPE!r}")
