"""``make gpu-check`` (benchmarks/gpu_check.py) where there is no GPU: the preflight's verdicts on
the machine (a fake ``nvidia-smi`` stands in for the driver, the one edge that cannot run here),
the arguments, the application's settings for the GPU, what the install removes first, the stack
check on this CPU build, the timing of vLLM's output stream, and the table and JSON made from a
result, also a partial one. ``tests/unit/test_makefile.py`` runs ``make gpu-check`` itself here."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from benchmarks import gpu_check
from benchmarks.gpu_check import (
    DEFAULT,
    EXIT_FAILED,
    QUICK,
    CheckError,
    Generation,
    Gpu,
    Recorder,
    app_settings,
    parse_args,
    parse_gpus,
    preflight,
    report,
    sizes_of,
    summarize,
    timed_outputs,
    to_uninstall,
    torch_cuda_of,
)

REPO = Path(__file__).resolve().parents[2]
H100 = "0, NVIDIA H100 80GB HBM3, 81559, 580.159.04"
READY = (3, 12)


def fake_nvidia_smi(bin_dir: Path, body: str) -> None:
    """An ``nvidia-smi`` on ``bin_dir`` that runs ``body`` (a shell script)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / "nvidia-smi"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


@pytest.fixture
def bin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """PATH is this empty folder alone: no nvidia-smi unless a test puts one there."""
    path = tmp_path / "bin"
    path.mkdir()
    monkeypatch.setenv("PATH", str(path))
    return path


# --- preflight ---------------------------------------------------------------------------------


def test_without_nvidia_smi_the_preflight_says_there_is_no_driver(bin_dir: Path) -> None:
    gpus, problems = preflight(python=READY, environ={}, system="linux")
    assert gpus == []
    assert len(problems) == 1
    assert "nvidia-smi was not found" in problems[0] and "no NVIDIA driver" in problems[0]


def test_a_machine_with_a_big_enough_gpu_is_ready(bin_dir: Path) -> None:
    fake_nvidia_smi(bin_dir, f'echo "{H100}"')
    gpus, problems = preflight(python=READY, environ={}, system="linux")
    assert problems == []
    assert gpus == [Gpu(0, "NVIDIA H100 80GB HBM3", 81559, "580.159.04")]


def test_a_driver_that_fails_is_reported_with_what_nvidia_smi_said(bin_dir: Path) -> None:
    fake_nvidia_smi(
        bin_dir,
        'echo "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver."; exit 9',
    )
    _, problems = preflight(python=READY, environ={}, system="linux")
    assert len(problems) == 1
    assert "exit 9" in problems[0] and "couldn't communicate with the NVIDIA driver" in problems[0]


def test_a_driver_that_hangs_is_reported_as_stuck(bin_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_check, "NVIDIA_SMI_TIMEOUT_S", 0.3)
    fake_nvidia_smi(bin_dir, f"exec {shutil.which('sleep', path=os.defpath)} 5")
    _, problems = preflight(python=READY, environ={}, system="linux")
    assert len(problems) == 1 and "did not answer within 0.3 s" in problems[0]


def test_an_empty_gpu_list_a_small_gpu_an_old_python_hidden_gpus_and_another_os_are_each_said(
    bin_dir: Path,
) -> None:
    fake_nvidia_smi(bin_dir, "exit 0")
    _, problems = preflight(python=READY, environ={}, system="linux")
    assert problems == ["nvidia-smi lists no GPU"]

    fake_nvidia_smi(bin_dir, 'echo "0, Tesla T4, 15360, 535.1"')
    _, problems = preflight(python=(3, 10), environ={"CUDA_VISIBLE_DEVICES": ""}, system="darwin")
    assert len(problems) == 4, problems
    darwin, python, hidden, small = problems
    assert "Linux" in darwin and "darwin" in python + darwin
    assert "Python 3.10 is too old" in python and "PYTHON=" in python
    assert "CUDA_VISIBLE_DEVICES" in hidden
    assert "Tesla T4" in small and "15.0 GiB" in small and "at least 16 GiB" in small


def test_a_python_that_cannot_make_the_missing_venv_is_said_and_an_existing_venv_needs_nothing(
    bin_dir: Path, tmp_path: Path
) -> None:
    fake_nvidia_smi(bin_dir, f'echo "{H100}"')
    venv = tmp_path / "venv"
    _, problems = preflight(python=READY, environ={}, system="linux", venv=venv, can_make_venvs=False)
    assert len(problems) == 1 and "cannot make the venv" in problems[0] and "python3-venv" in problems[0]
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    assert preflight(python=READY, environ={}, system="linux", venv=venv, can_make_venvs=False)[1] == []


def test_a_python_newer_than_faiss_gpu_wheels_is_said(bin_dir: Path) -> None:
    fake_nvidia_smi(bin_dir, f'echo "{H100}"')
    _, problems = preflight(python=(3, 14), environ={}, system="linux")
    assert len(problems) == 1 and "Python 3.14 is too new for faiss-gpu-cu12" in problems[0]


def test_parse_gpus_takes_every_gpu_and_reads_an_unknown_memory_as_zero() -> None:
    text = f"{H100}\n1, NVIDIA H200, [N/A], 580.1\nnot a row\n\n"
    assert parse_gpus(text) == [
        Gpu(0, "NVIDIA H100 80GB HBM3", 81559, "580.159.04"),
        Gpu(1, "NVIDIA H200", 0, "580.1"),
    ]


def run_preflight(bin_dir: Path) -> subprocess.CompletedProcess[str]:
    """``python -m benchmarks.gpu_check preflight`` with ``bin_dir`` as the whole PATH."""
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_check", "preflight"],
        cwd=REPO,
        env={**os.environ, "PATH": str(bin_dir)},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_preflight_command_fails_fast_with_a_message_and_no_traceback(bin_dir: Path) -> None:
    """What `make gpu-check` runs first, with the interpreter alone (nothing of the venv needed)."""
    started = time.monotonic()
    done = run_preflight(bin_dir)
    assert done.returncode == gpu_check.EXIT_MISSING
    assert "gpu-check: missing: nvidia-smi was not found on PATH" in done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert time.monotonic() - started < 30  # no install, no model, no import of torch


def test_the_preflight_command_says_ready_for_a_gpu(bin_dir: Path) -> None:
    fake_nvidia_smi(bin_dir, f'echo "{H100}"')
    done = run_preflight(bin_dir)
    if not gpu_check.MIN_PYTHON <= sys.version_info[:2] <= gpu_check.MAX_PYTHON:  # the interpreter is a finding
        assert done.returncode == gpu_check.EXIT_MISSING and "Python" in done.stderr
        return
    assert done.returncode == 0, done.stderr
    assert "ready: GPU 0 NVIDIA H100 80GB HBM3, 80 GiB, driver 580.159.04" in done.stdout


# --- install --------------------------------------------------------------------------------------


def test_the_install_removes_faiss_cpu_and_a_cpu_torch_and_nothing_else() -> None:
    cpu_venv = {"faiss-cpu": "1.15.1", "torch": "2.13.0+cpu", "torchvision": "0.28.0", "ray": "2.60.0"}
    assert sorted(to_uninstall(cpu_venv, torch_cuda=None)) == ["faiss-cpu", "torch", "torchvision"]
    both = {"faiss-cpu": "1.15.1", "faiss-gpu-cu12": "1.14.1", "torch": "2.14.0"}
    assert sorted(to_uninstall(both, torch_cuda="13.0")) == ["faiss-cpu", "faiss-gpu-cu12"]
    assert to_uninstall({"faiss-gpu-cu12": "1.14.1", "torch": "2.14.0"}, torch_cuda="13.0") == {}
    assert to_uninstall({}, torch_cuda=None) == {}
    assert "CPU build" in to_uninstall({"torch": "2.13.0+cpu"}, torch_cuda=None)["torch"]


@pytest.mark.parametrize(
    ("text", "cuda"),
    [
        ("__version__ = '2.13.0+cpu'\ndebug = False\ncuda: Optional[str] = None\nhip: Optional[str] = None\n", None),
        ("__version__ = '2.14.0'\ncuda: Optional[str] = '13.0'\n", "13.0"),
        ('cuda = "12.8"\n', "12.8"),
        ("git_version = 'abc'\n", None),
    ],
)
def test_torch_cuda_of_reads_the_build_from_torch_version_py(text: str, cuda: str | None) -> None:
    assert torch_cuda_of(text) == cuda


def test_the_installed_torch_build_is_read_without_importing_torch() -> None:
    import torch

    assert gpu_check.installed_torch_cuda() == torch.version.cuda


def test_an_install_without_a_package_index_stops_before_touching_the_venv(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []

    def offline_pip(args: list[str], capture: bool = False, timeout: float | None = None) -> Any:
        calls.append(list(args))
        return subprocess.CompletedProcess(args, 1, "", "ERROR: No matching distribution found for vllm\n")

    monkeypatch.setattr(gpu_check, "pip", offline_pip)
    monkeypatch.setattr(gpu_check, "MIN_FREE_DISK_GIB", 0)
    with pytest.raises(CheckError, match="cannot reach a package index") as e:
        gpu_check.install()
    assert "No matching distribution found for vllm" in str(e.value)
    assert [c[:2] for c in calls] == [["index", "versions"]]  # no uninstall, no install


def test_the_stack_check_names_each_missing_part_on_this_cpu_build() -> None:
    import torch

    if torch.version.cuda is not None:
        pytest.skip("this torch is a CUDA build")
    with pytest.raises(CheckError) as e:
        gpu_check.stack()
    said = str(e.value)
    assert f"torch {torch.__version__} is a CPU build" in said
    assert "--force-reinstall --no-deps torch==" in said
    # --parts asks for less, but never for no GPU: a CPU torch is still refused, and faiss-cpu,
    # the missing vLLM and the packaged Gemma are not among its problems
    with pytest.raises(CheckError) as e:
        gpu_check.stack(parts=True)
    assert f"torch {torch.__version__} is a CPU build" in str(e.value)
    assert "vLLM does not import" not in str(e.value) and "GPU support" not in str(e.value)


def test_the_parts_stack_records_what_is_absent_instead_of_refusing(monkeypatch: pytest.MonkeyPatch) -> None:
    """``stack(parts=True)`` on a CUDA torch that sees a GPU, with faiss-cpu and no vLLM (what a lent
    machine that reaches no package index has): ready, the absent parts named."""
    import torch

    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda _: SimpleNamespace(name="NVIDIA H200", total_memory=141 * 2**30)
    )
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm raises ImportError
    found = gpu_check.stack(parts=True)
    assert found["gpu"] == "NVIDIA H200" and found["torch_cuda"] == "13.0"
    absent = "\n".join(found["absent"])
    assert "vLLM does not import" in absent
    with pytest.raises(CheckError) as e:  # the full check refuses the same machine
        gpu_check.stack()
    assert "vLLM does not import" in str(e.value)


# --- run: arguments, settings, timings, report -----------------------------------------------------


def test_run_arguments_default_quick_and_overrides() -> None:
    args = parse_args(["run"])
    assert sizes_of(args) == DEFAULT and args.json is None and args.gpu_memory_utilization == 0.35
    assert sizes_of(parse_args(["run", "--quick"])) == QUICK
    custom = sizes_of(parse_args(["run", "--quick", "--chunks", "5000", "--max-tokens", "32"]))
    assert (custom.chunks, custom.max_tokens, custom.docs, custom.eager) == (5000, 32, QUICK.docs, True)
    assert sizes_of(parse_args(["run", "--eager"])).eager and not DEFAULT.eager
    assert parse_args(["run", "--json", "out.json"]).json == "out.json"
    parts = parse_args(["run", "--parts"])
    assert parts.parts and parts.device == "cuda" and sizes_of(parts) == DEFAULT
    assert parse_args(["run", "--parts", "--device", "cpu"]).device == "cpu"


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["run", "--chunks", "0"],
        ["run", "--chats", "-3"],
        ["run", "--gpu-memory-utilization", "1.5"],
        ["go"],
        ["run", "--device", "cpu"],  # the application runs vLLM: only --parts runs on the CPU
        ["run", "--parts", "--device", "tpu"],
    ],
)
def test_bad_arguments_are_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        parse_args(argv)
    assert e.value.code == 2 and capsys.readouterr().err


def test_the_application_settings_point_vllm_at_the_converted_gemma_with_faiss_and_the_embedder_on_the_gpu(
    tmp_path: Path,
) -> None:
    from ragserve.config import Settings
    from ragserve.models.transformers_engine import TransformersEngine
    from ragserve.models.vllm_engine import VLLMEngine
    from ragserve.service.engine_factory import make_engine

    model_dir = TransformersEngine(None, tmp_path / "models").converted_dir  # what `run` converts into
    assert model_dir is not None
    settings = Settings(**app_settings(tmp_path / "data", model_dir, 2, 0.35, eager=False))
    assert (settings.llm_engine, settings.llm_model) == ("vllm", str(model_dir))
    assert (settings.faiss_device, settings.embedding_device, settings.query_embedding) == ("gpu", "cuda", "deployment")
    assert settings.llm_engine_args == {"dtype": "bfloat16", "gpu_memory_utilization": 0.35, "max_model_len": 8192}
    assert (settings.similarity_threshold, settings.answerability, settings.evidence_in_prompt) == (0.0, False, 0)
    engine = make_engine(settings)  # what the Generator deployment and vLLM alone both build
    assert isinstance(engine, VLLMEngine) and engine.model_id == str(model_dir)
    eager = Settings(**app_settings(tmp_path / "data", model_dir, 2, 0.5, eager=True))
    assert eager.llm_engine_args["enforce_eager"] is True and eager.llm_engine_args["gpu_memory_utilization"] == 0.5


def outputs(*counts: int, pause_s: float = 0.01, delta: bool = False) -> AsyncIterator[Any]:
    """vLLM's RequestOutput stream, ``counts[i]`` token ids so far at step i: all of them
    (cumulative outputs) or the new ones (``delta``)."""

    async def gen() -> AsyncIterator[Any]:
        before = 0
        for n in counts:
            await asyncio.sleep(pause_s)
            yield SimpleNamespace(outputs=[SimpleNamespace(token_ids=list(range(before if delta else 0, n)))])
            before = n

    return gen()


@pytest.mark.parametrize("delta", [False, True], ids=["cumulative", "delta"])
def test_timed_outputs_times_the_first_and_the_last_new_token(delta: bool) -> None:
    started = time.perf_counter()
    gen = asyncio.run(timed_outputs(outputs(0, 1, 3, 3, 5, delta=delta), started, prompt_tokens=40, delta=delta))
    assert (gen.completion_tokens, gen.prompt_tokens) == (5, 40)
    assert 0.015 < gen.ttft_s < gen.last_s  # the first step carried no token; the fourth none new
    assert gen.decode_tokens_per_s == pytest.approx(4 / (gen.last_s - gen.ttft_s))
    with pytest.raises(RuntimeError, match="no token"):
        asyncio.run(timed_outputs(outputs(0, 0, delta=delta), time.perf_counter(), prompt_tokens=1, delta=delta))


def test_a_one_token_answer_has_no_decode_rate_and_summaries_skip_it() -> None:
    one = Generation(ttft_s=0.05, last_s=0.05, completion_tokens=1, prompt_tokens=10)
    many = Generation(ttft_s=0.02, last_s=0.22, completion_tokens=21, prompt_tokens=12)
    assert one.decode_tokens_per_s is None and many.decode_tokens_per_s == pytest.approx(100)
    other = Generation(ttft_s=0.03, last_s=0.13, completion_tokens=21, prompt_tokens=12)
    s = summarize([one, many, other])
    assert s["requests"] == 3 and s["decode_tokens_per_s_p50"] == pytest.approx(200)  # of 100 and 200
    assert s["ttft_ms"]["p50"] == pytest.approx(30) and s["completion_tokens_p50"] == 21


def full_result() -> dict[str, Any]:
    ms = {"p50": 1.0, "p90": 1.5, "p99": 2.0, "mean": 1.1}
    return {
        "check": "gpu",
        "machine": "16 cores",
        "stack": {"gpu": "NVIDIA H100 80GB HBM3", "torch": "2.14.0", "vllm": "0.33.0", "faiss": "1.14.1"},
        "phases_s": {"stack": 9.5, "start": 98.2},
        "baselines": {"query_encode": {**ms, "p50": 1.5}, "bare_faiss_gpu": {**ms, "p50": 0.5}},
        "ingest": {
            "documents": 20000,
            "chunks": 20000,
            "served_docs_per_s": 2500.0,
            "served_chunks_per_s": 2500.0,
            "raw_chunks_per_s": 10000.0,
            "ratio": 0.25,
        },
        "retrieve": {
            "chunks": 100000,
            "dense": {"cold": {**ms, "p50": 6.0}, "warm": {**ms, "p50": 3.0}},
            "hybrid": {"cold": {**ms, "p50": 8.0}, "warm": {**ms, "p50": 4.0}},
        },
        "chat": {
            "ragserve": summarize([Generation(0.040, 0.540, 101, 300)]),
            "vllm_alone": summarize([Generation(0.010, 0.260, 101, 300)]),
            "same_prompt": 1,
        },
        "gpu_memory_mib": {"shard actors": 1800.0, "embedder replica": 900.0},
    }


def test_the_report_sets_each_figure_beside_its_baseline() -> None:
    text = report(full_result())
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ")}
    assert "NVIDIA H100 80GB HBM3" in text and "vllm 0.33.0" in text
    assert "2,500 docs/s" in rows["ingest, POST /index"] and "| 0.25 |" in rows["ingest, POST /index"]
    dense = rows["/retrieve p50, 100,000 chunks, dense, cold"]
    assert "6.00 ms (warm 3.00)" in dense and "2.00 ms" in dense and "| 3.00 |" in dense  # 6 / (1.5 + 0.5)
    ttft = rows["RAG chat TTFT p50, streamed"]
    assert "40.0 ms" in ttft and "10.0 ms" in ttft and "same prompt 1/1" in ttft and "| 4.00 |" in ttft
    assert "| 200 | 400 |" in rows["RAG chat decode tokens/s p50"]  # 100 tokens in 0.5 s against 0.25 s
    assert "GPU memory by process while serving (MiB): embedder replica 900, shard actors 1,800" in text
    assert "after it stopped" not in text and "| start | 98.20 |" in text


def test_a_partial_result_reports_what_was_not_measured() -> None:
    result = {k: v for k, v in full_result().items() if k in ("stack", "phases_s", "baselines", "ingest")}
    result["error"] = {"phase": "start", "message": "RuntimeError: the Embedder runs on cpu"}
    text = report(result)
    assert "2,500 docs/s" in text
    assert text.count("not measured") == 3  # two retrieval modes, the chats
    assert "Stopped in the start phase: RuntimeError: the Embedder runs on cpu" in text
    assert "stack not checked" in report({})


def test_the_parts_report_names_where_it_ran_and_falls_back_to_faiss_on_the_cpu() -> None:
    """``run --parts``: in-process labels, FAISS on the CPU as the floor where faiss has no GPU, the
    encode's agreement with sentence-transformers, and the chats said to be out of its reach."""
    result = full_result()
    ms = {"p50": 1.0, "p90": 1.5, "p99": 2.0, "mean": 1.1}
    result.update(mode="parts", chat={}, gpu_memory_mib={})
    result["baselines"] = {
        "query_encode": {**ms, "p50": 1.5},
        "bare_faiss_cpu": {**ms, "p50": 2.5},
        "bare_faiss_cpu_shard_one_thread": {**ms, "p50": 4.5},
        "min_cosine_vs_sentence_transformers": 0.9999996,  # a lower bound: printed rounded down
    }
    result["ingest"]["free_embedder_docs_per_s"] = 6000.0
    result["retrieve"]["faiss"] = "cpu"
    text = report(result)
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ")}
    assert "the parts in process (no HTTP, no Ray, no vLLM)" in text
    assert "| 0.25 |" in rows["ingest, DocumentService in process"]
    assert "6,000 docs/s" in rows["ingest, DocumentService in process, an embedder that costs nothing"]
    dense = rows["Retriever in process p50, 100,000 chunks, dense, cold"]
    assert "4.00 ms" in dense and "bare flat FAISS on the CPU" in dense and "| 1.50 |" in dense  # 6 / (1.5 + 2.5)
    shards_way = rows["Retriever in process p50, 100,000 chunks, dense, cold, against the shards' way"]
    assert "6.00 ms" in shards_way and "| 1.00 |" in shards_way  # 6 / (1.5 + 4.5)
    assert "cosine >= 0.999999 " in rows["embeddings: the application's encode vs sentence-transformers'"]
    assert "not measured (--parts)" in rows["RAG chat TTFT and tokens/s"]


def test_the_json_is_written_after_each_phase_also_one_that_fails(tmp_path: Path) -> None:
    out = tmp_path / "sub" / "gpu.json"
    rec = Recorder(str(out), QUICK)
    with rec.phase("one", "first"):
        rec.result["one"] = {"x": 1}
    assert json.loads(out.read_text())["one"] == {"x": 1}
    with pytest.raises(ValueError), rec.phase("two", "second"):
        raise ValueError("boom")
    written = json.loads(out.read_text())
    assert set(written["phases_s"]) == {"one", "two"} and written["sizes"]["chunks"] == QUICK.chunks


def test_a_run_that_fails_midway_leaves_its_error_and_what_it_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def fails_in_ingest(rec: Recorder, sizes: Any, args: Any) -> None:
        with rec.phase("baselines", "in-process"):
            rec.result["baselines"] = full_result()["baselines"]
        with rec.phase("ingest", "POST /index"):
            raise ConnectionError("the Ingress went away")

    monkeypatch.setattr(gpu_check, "_measure", fails_in_ingest)
    out = tmp_path / "gpu.json"
    assert gpu_check.main(["run", "--quick", "--json", str(out)]) == EXIT_FAILED
    written = json.loads(out.read_text())
    assert written["error"] == {"phase": "ingest", "message": "ConnectionError: the Ingress went away"}
    assert set(written["phases_s"]) == {"baselines", "ingest"}
    captured = capsys.readouterr()
    assert "the ingest phase failed" in captured.err and "Stopped in the ingest phase" in captured.out


def test_a_missing_prerequisite_found_by_run_is_said_without_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def no_vllm(rec: Recorder, sizes: Any, args: Any) -> None:
        raise CheckError("vLLM does not import (ModuleNotFoundError: No module named 'vllm')\nfaiss has no GPU")

    monkeypatch.setattr(gpu_check, "_measure", no_vllm)
    assert gpu_check.main(["run"]) == gpu_check.EXIT_MISSING
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "gpu-check: missing: vLLM does not import (ModuleNotFoundError: No module named 'vllm')",
        "gpu-check: missing: faiss has no GPU",
    ]


async def test_vllm_alone_generates_from_each_chats_rebuilt_prompt_with_the_applications_engine_args(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """vLLM alone against the fake ``vllm`` module of the engine's tests (vLLM's API boundary): built as
    the Generator builds it, given each chat's ``build_rag_messages`` rendered and tokenized, greedy."""
    from ragserve.api.documents import NodeWithScore
    from ragserve.rag.prompt import build_rag_messages
    from tests.unit.models.test_engine_vllm import PIECES, FakeEngine, FakeTokenizer, install_fake_vllm

    install_fake_vllm(monkeypatch)
    settings = app_settings(tmp_path / "data", tmp_path / "model", 2, 0.35, eager=True)
    node = {"doc_id": "d1", "node_id": "d1-0", "text": "Pump 3 was serviced in week 23.", "score": 0.8}
    tok = FakeTokenizer()
    messages = build_rag_messages([], [], "When was pump 3 serviced?", [NodeWithScore.model_validate(node)])
    ids = tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True), add_special_tokens=False)
    chats = [
        gpu_check.ChatPrompt("When was pump 3 serviced?", [node], len(ids), max_tokens=3),
        gpu_check.ChatPrompt("When was pump 3 serviced?", [node], len(ids) + 1, max_tokens=64),
    ]
    out = await gpu_check.vllm_alone(settings, chats)
    fake = FakeEngine.last
    assert fake is not None and fake.shut_down
    assert (fake.args.model, fake.args.kwargs) == (str(tmp_path / "model"), settings["llm_engine_args"])
    assert [call[0] for call in fake.calls] == [{"prompt_token_ids": ids}] * 2
    assert [(call[1].kwargs["temperature"], call[1].max_tokens) for call in fake.calls] == [(0.0, 3), (0.0, 64)]
    assert all(call[1].kwargs["output_kind"].name == "DELTA" for call in fake.calls)  # as the application asks
    assert [(g.completion_tokens, g.prompt_tokens, same) for g, same in out] == [
        (3, len(ids), True),
        (len(PIECES), len(ids), False),  # the chat said another length: not the same prompt
    ]
    assert all(0 < g.ttft_s <= g.last_s for g, _ in out)


def test_a_deployment_serve_gave_up_on_stops_the_wait_with_serves_reasons(monkeypatch: pytest.MonkeyPatch) -> None:
    """``deploy_ragserve`` waits for health unless Serve says the application failed (vLLM that cannot
    start fails every replica's constructor): then at once, with Serve's messages."""
    from ray import serve
    from ray.serve.schema import ApplicationStatus

    from benchmarks.common import serve_failure, wait_healthy

    def status(app_status: ApplicationStatus) -> Any:
        generator = SimpleNamespace(message="ValueError: Free memory on device (2.1 GiB) is too little")
        app = SimpleNamespace(
            status=app_status, message="Deploying app 'gpu' failed.", deployments={"Generator": generator}
        )
        return SimpleNamespace(applications={"gpu": app})

    monkeypatch.setattr(serve, "status", lambda: status(ApplicationStatus.DEPLOYING))
    assert serve_failure("gpu") is None and serve_failure("other") is None
    monkeypatch.setattr(serve, "status", lambda: status(ApplicationStatus.DEPLOY_FAILED))
    reason = serve_failure("gpu")
    assert reason == "Deploying app 'gpu' failed.; Generator: ValueError: Free memory on device (2.1 GiB) is too little"
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="will not become healthy: Deploying app 'gpu' failed"):
        wait_healthy("http://127.0.0.1:9", timeout_s=60, failed=lambda: serve_failure("gpu"))
    assert time.monotonic() - started < 5
