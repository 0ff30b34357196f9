"""Continuous batching of a Hugging Face causal LM on a CPU (docs/architecture.md §9).

On a CPU a small model's decode step is bound by reading its weights, so a forward step over several
sequences costs little more than over one. ``BatchLoop`` runs one thread that serves every sequence
submitted to it in shared decode steps, continuously: a sequence joins the running batch at the next
step, and leaves it as soon as it is done (end-of-sequence token, its own ``max_new_tokens``, or
cancelled), without waiting for the others.

How a step works. The batch's key/value cache is one transformers ``DynamicCache`` whose rows are
*right-aligned*: every row's tokens end in the same column, and a row shorter than the longest is
padded on the left (its ``pad`` columns are masked out of attention, and its position ids count only
its own tokens). A decode step feeds each row its last token with a 2D attention mask and position
ids, and samples each row's next token by its own rule. A joining prompt is read ("prefilled") on its
own cache, in chunks of ``prefill_chunk`` tokens, one chunk between two decode steps, so that a long
prompt does not stall the running streams for the whole of its reading; once read, its cache is
merged into the batch's (the shorter side padded on the left) and it decodes with the others. When
sequences leave, their rows are dropped, and the columns that are padding in every row left are cut
off, so the batch is only as long as its longest sequence. Joining and leaving re-lay the cache once
each; a step only appends its column (by concatenation, as ``DynamicCache`` does in ``generate``).

Sliding-window layers (Gemma 3: five of every six) keep only the last ``sliding_window - 1``
columns. Right alignment makes that consistent across rows: each row's own tokens are contiguous and
end at the last column, so the window in columns is the window in tokens, and the last columns are
the ones every row needs. Caches with other layer kinds (quantized, linear attention) cannot be
merged: the loop then serves one sequence at a time (``max_batch`` 1), still token by token.

The vocabulary head of a decode step over a few rows is computed as ``weight @ hidden.T``
(``rows_first_head``): with Gemma 3 270M's 262,144-token head most of what a step reads, and MKL
several times slower at the usual layout for a handful of rows, this is what lets a step over
four sequences cost little more than over one.

Sampling is per sequence: greedy when ``temperature`` is 0 or None; otherwise temperature, then
``top_k``, then ``top_p`` (the order of ``generate``'s warpers), drawn from the sequence's own
``torch.Generator`` seeded with its ``seed`` (or a random one), never the process's global generator,
so a seeded sequence draws the same tokens whatever company it keeps.

No I/O and no Ray; torch and transformers are imported when a loop is built (importing the module
only registers the exit hook, ``_close_at_exit``). The loop talks
to its caller through each sequence's ``Sink`` (called on the loop's thread) and ``cancel`` event.
"""

from __future__ import annotations

import atexit
import collections
import inspect
import logging
import math
import os
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

log = logging.getLogger(__name__)

#: Temperatures below this are greedy decoding (their limit): dividing scores by them overflows.
MIN_TEMPERATURE = 1e-6

#: How long the interpreter's exit waits, in all, for running loops to end their step (below), for
#: sinks that return at once (as the ``Sink`` protocol asks) and steps shorter than this.
EXIT_WAIT_S = 10.0

#: Loops whose thread has not ended yet (``_close_at_exit``).
_live: set[BatchLoop] = set()
_live_lock = threading.Lock()


@atexit.register
def _close_at_exit() -> None:
    """Close every running loop and wait for its step to end before the interpreter finalizes.

    A loop's thread is a daemon (a loop nobody closed must not keep a process alive), but a daemon
    thread still inside a torch operator when the interpreter exits is unwound from under it
    (CPython ends such a thread with ``pthread_exit``): the process aborts with "terminate called
    without an active exception" or a segmentation fault, instead of exiting with its own status.
    """
    with _live_lock:
        loops = list(_live)
    for loop in loops:
        try:
            loop.close()
        except Exception:  # pragma: no cover - a sink that failed as it ended; close the others
            log.exception("closing a generation loop at exit failed")
    deadline = time.monotonic() + EXIT_WAIT_S
    for loop in loops:
        loop.join(max(0.0, deadline - time.monotonic()))


def _forget_in_child() -> None:
    """A forked child has none of its parent's loop threads: its exit must not close the parent's
    loops (ending their waiting requests from the wrong process), and a lock held at the fork by
    another thread would never be released in it."""
    global _live_lock
    _live.clear()
    _live_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_in_child)


class Sink(Protocol):
    """Where a sequence's output goes; called on the loop's thread, so each call must be quick."""

    def token(self, token_id: int) -> None: ...

    def end(self, error: BaseException | None) -> None:
        """The sequence is over: ``None`` when it ended normally (including cancelled), else why it failed."""


class LoopClosed(RuntimeError):
    """The loop was closed before this sequence ended."""


@dataclass(eq=False)
class Sequence:
    """One generation request: its prompt ids, its limits and sampling rule, and where its tokens go.

    ``eos``: token ids that end it (the token is still emitted). ``cancel``: set by anyone, the
    sequence leaves before the next step. The fields after ``cancel`` are the loop's record."""

    prompt: list[int]
    max_new_tokens: int
    sink: Sink
    eos: frozenset[int] = frozenset()
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    cancel: threading.Event = field(default_factory=threading.Event)
    #: Tokens emitted so far.
    generated: int = 0
    #: Seconds of model time spent reading the prompt (the chunks' forward passes only).
    prefill_s: float = 0.0
    #: ``time.perf_counter()`` when its prompt began to be read, and when its first token came.
    admitted_at: float | None = None
    first_token_at: float | None = None
    generator: Any = None

    @property
    def sampled(self) -> bool:
        t = self.temperature
        return t is not None and math.isfinite(t) and t >= MIN_TEMPERATURE


# --- the batch cache ------------------------------------------------------------------------------


def new_cache(model: Any) -> Any:
    """An empty cache laid out for ``model`` (sliding-window layers where its config has them)."""
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


def mergeable(cache: Any) -> bool:
    """Whether ``cache``'s rows can be re-laid and merged here: full and sliding-window dynamic layers only."""
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    layers = getattr(cache, "layers", None) or []
    return bool(layers) and all(type(layer) in (DynamicLayer, DynamicSlidingWindowLayer) for layer in layers)


def relayout(cache: Any, old_length: int, new_length: int) -> None:
    """Re-lay every row of ``cache`` from ``old_length`` to ``new_length`` right-aligned columns: more
    columns are zeros at the left (the caller masks them), fewer drop the leftmost (which must be
    padding in every row). A sliding-window layer keeps at most ``sliding_window - 1`` columns."""
    import torch

    for layer in cache.layers:
        if not layer.is_initialized or layer.keys is None or layer.keys.numel() == 0:
            continue
        stored = layer.keys.shape[-2]
        window = getattr(layer, "sliding_window", None)
        target = new_length if window is None else min(new_length, window - 1)
        if target < stored:
            layer.keys = layer.keys[..., stored - target :, :]
            layer.values = layer.values[..., stored - target :, :]
        elif target > stored:
            shape = (*layer.keys.shape[:-2], target - stored, layer.keys.shape[-1])
            layer.keys = torch.cat([layer.keys.new_zeros(shape), layer.keys], dim=-2)
            layer.values = torch.cat([layer.values.new_zeros(shape), layer.values], dim=-2)
        if window is not None:
            layer.cumulative_length = new_length


def stack(cache: Any, other: Any) -> None:
    """Append ``other``'s rows to ``cache``'s (both laid on the same columns)."""
    import torch

    for layer, extra in zip(cache.layers, other.layers, strict=True):
        if layer.is_initialized != extra.is_initialized:
            raise RuntimeError("cannot merge caches: a layer is filled in one and empty in the other")
        if not layer.is_initialized:
            continue
        layer.keys = torch.cat([layer.keys, extra.keys], dim=0)
        layer.values = torch.cat([layer.values, extra.values], dim=0)


def select(cache: Any, rows: list[int]) -> None:
    """Keep only ``rows`` of ``cache``, in that order."""
    import torch

    index = torch.tensor(rows, dtype=torch.long)
    for layer in cache.layers:
        if layer.is_initialized and layer.keys is not None:
            layer.keys = layer.keys.index_select(0, index)
            layer.values = layer.values.index_select(0, index)


class Batch:
    """The running sequences and their shared cache, right-aligned on ``length`` columns; row ``i``
    has ``pads[i]`` padding columns at the left and ``last[i]`` is the token it reads next."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.rows: list[Sequence] = []
        self.cache: Any = None
        self.length = 0
        self.pads: list[int] = []
        self.last: list[int] = []

    def __len__(self) -> int:
        return len(self.rows)

    def join(self, seq: Sequence, cache: Any, length: int, token: int) -> None:
        """Add ``seq``, whose prompt of ``length`` tokens ``cache`` holds and whose next input is ``token``."""
        if not self.rows:
            self.cache, self.length, self.pads, self.last, self.rows = cache, length, [0], [token], [seq]
            return
        width = max(self.length, length)
        if width > self.length:
            relayout(self.cache, self.length, width)
            self.pads = [p + width - self.length for p in self.pads]
        if width > length:
            relayout(cache, length, width)
        stack(self.cache, cache)
        self.length = width
        self.rows.append(seq)
        self.pads.append(width - length)
        self.last.append(token)

    def keep(self, kept: list[int]) -> None:
        """Keep only the rows ``kept`` (indices, in order), then cut the columns that are padding in all."""
        if len(kept) == len(self.rows):
            return
        if not kept:
            self.clear()
            return
        select(self.cache, kept)
        self.rows = [self.rows[i] for i in kept]
        self.pads = [self.pads[i] for i in kept]
        self.last = [self.last[i] for i in kept]
        cut = min(self.pads)
        if cut:
            relayout(self.cache, self.length, self.length - cut)
            self.length -= cut
            self.pads = [p - cut for p in self.pads]

    def step(self, forward: Callable[..., Any]) -> Any:
        """One decode step of every row: the next-token logits, one row each."""
        import torch

        pads = torch.tensor(self.pads, dtype=torch.long)
        mask = torch.arange(self.length + 1)[None, :] >= pads[:, None]
        logits = forward(
            input_ids=torch.tensor(self.last, dtype=torch.long)[:, None],
            attention_mask=mask,
            position_ids=(self.length - pads)[:, None],
            cache=self.cache,
        )
        self.length += 1
        return logits


class Reader:
    """Reads one prompt into a fresh cache, ``chunk`` tokens per ``step``."""

    def __init__(self, seq: Sequence, cache: Any, chunk: int):
        self.seq, self.cache, self.chunk, self.done = seq, cache, chunk, 0

    def step(self, forward: Callable[..., Any]) -> Any:
        """Reads the next chunk; returns the next-token logits once the whole prompt is read, else None."""
        import torch

        prompt = self.seq.prompt
        end = min(len(prompt), self.done + self.chunk)
        t0 = time.perf_counter()
        logits = forward(
            input_ids=torch.tensor([prompt[self.done : end]], dtype=torch.long),
            attention_mask=None,
            position_ids=torch.arange(self.done, end)[None, :],
            cache=self.cache,
        )
        self.seq.prefill_s += time.perf_counter() - t0
        self.done = end
        return logits[0] if end == len(prompt) else None


#: Up to this many rows, ``rows_first_head`` computes the vocabulary projection as weight @ hidden^T
#: (measured on Gemma 3 270M's head with MKL: 1.5 to 2 times faster than ``F.linear`` for 2 to 8
#: rows, even at 16).
ROWS_FIRST_MAX = 16


def rows_first_head(model: Any) -> bool:
    """Make ``model``'s output projection (the vocabulary head: 262,144 x 640 floats for Gemma 3
    270M, most of what a decode step reads) compute a few rows (2 to ``ROWS_FIRST_MAX``) as
    ``weight @ hidden.T``. ``F.linear`` hands MKL a product with the weight transposed, which for a
    handful of rows against a very wide weight is several times slower than the same product laid
    the other way; one row (every request alone, ``generate``) and many rows keep ``F.linear``.
    The same product, summed in another order. Whether the head was changed."""
    import torch
    import torch.nn.functional as F

    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    if not isinstance(head, torch.nn.Linear) or "forward" in vars(head):  # not a plain linear, or done already
        return False

    def forward(x: Any) -> Any:
        rows = x.numel() // x.shape[-1]
        if not 2 <= rows <= ROWS_FIRST_MAX:
            return F.linear(x, head.weight, head.bias)
        flat = x.reshape(rows, x.shape[-1]).t()
        out = torch.mm(head.weight, flat) if head.bias is None else torch.addmm(head.bias[:, None], head.weight, flat)
        return out.t().contiguous().reshape(*x.shape[:-1], out.shape[0])

    head.forward = forward  # type: ignore[method-assign,assignment]
    return True


def forward_fn(model: Any) -> Callable[..., Any]:
    """``model``'s forward as the loop calls it: last-position logits (float), the cache updated in place."""
    params = _cache_params(model)
    cache_kw = params["cache"]
    keep_kw = params["keep"]

    def forward(input_ids: Any, attention_mask: Any, position_ids: Any, cache: Any) -> Any:
        kwargs: dict[str, Any] = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": position_ids,
            cache_kw: cache,
            "use_cache": True,
        }
        if keep_kw:
            kwargs["logits_to_keep"] = 1
        out = model(**kwargs)
        return out.logits[:, -1, :].float()

    return forward


def _cache_params(model: Any) -> dict[str, Any]:
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):  # pragma: no cover - a forward without a signature
        params = {}  # type: ignore[assignment]
    return {"cache": "cache" if "cache" in params else "past_key_values", "keep": "logits_to_keep" in params}


def read_prompt(model: Any, prompt: list[int], chunk: int) -> Any:
    """Read ``prompt`` as the loop reads one (in chunks, into a fresh cache); the next-token logits.
    What the engine's start-up measure of prefill speed times."""
    import torch

    seq = Sequence(prompt=list(prompt), max_new_tokens=1, sink=_NoSink())
    reader = Reader(seq, new_cache(model), chunk)
    forward = forward_fn(model)
    with torch.inference_mode():
        while (logits := reader.step(forward)) is None:
            pass
    return logits


class _NoSink:
    def token(self, token_id: int) -> None:
        pass

    def end(self, error: BaseException | None) -> None:
        pass


# --- sampling -------------------------------------------------------------------------------------


def pick(logits: Any, seqs: list[Sequence]) -> list[int]:
    """Each row's next token by its sequence's rule (``logits``: one row per sequence)."""
    tokens: list[int] = logits.argmax(-1).tolist()
    for i, seq in enumerate(seqs):
        if seq.sampled:
            tokens[i] = sample(logits[i], seq)
    return tokens


def sample(scores: Any, seq: Sequence) -> int:
    """One token drawn from ``scores`` (a vocabulary's logits) with the sequence's temperature, top-k,
    top-p and generator."""
    import torch

    assert seq.temperature is not None
    scores = scores.float() / seq.temperature
    k = seq.top_k
    if k is not None and 0 < k < scores.shape[-1]:
        values, ids = scores.topk(k)  # descending
    else:
        values, ids = scores.sort(descending=True)
    probs = values.softmax(-1)
    top_p = seq.top_p
    if top_p is not None and top_p < 1.0:
        # keep the most likely tokens until their mass reaches top_p (always at least one)
        before = probs.cumsum(-1) - probs
        keep = before < top_p
        keep[0] = True
        probs = probs * keep
    if not bool(torch.isfinite(probs).all()) or float(probs.sum()) <= 0:
        return int(ids[0])
    if seq.generator is None:
        seq.generator = seeded_generator(seq.seed)
    return int(ids[torch.multinomial(probs, 1, generator=seq.generator)])


def seeded_generator(seed: int | None) -> Any:
    """A generator of its own, seeded by ``seed`` (any int) or, without one, at random."""
    import torch

    generator = torch.Generator()
    generator.manual_seed(secrets.randbits(63) if seed is None else seed % 2**64)
    return generator


# --- the loop -------------------------------------------------------------------------------------


class BatchLoop:
    """Serves submitted sequences in shared decode steps on a thread of its own (see the module).

    ``max_batch``: how many sequences are served at once (the one whose prompt is being read
    included); later ones wait in order of submission. ``prefill_chunk``: how many prompt tokens are
    read between two decode steps. ``on_prefill(prompt_tokens, seconds)``: told, on the loop's thread,
    how long each prompt took to read (model time only).
    """

    def __init__(
        self,
        model: Any,
        max_batch: int = 8,
        prefill_chunk: int = 256,
        on_prefill: Callable[[int, float], None] | None = None,
        name: str = "generate",
    ):
        if max_batch < 1 or prefill_chunk < 1:
            raise ValueError(f"max_batch and prefill_chunk must be at least 1, not {max_batch} and {prefill_chunk}")
        self.model = model
        self.prefill_chunk = prefill_chunk
        self.on_prefill = on_prefill
        self.max_batch = max_batch
        if max_batch > 1 and not mergeable(new_cache(model)):
            log.warning("%s: this model's cache layers cannot be merged; serving one sequence at a time", name)
            self.max_batch = 1
        rows_first_head(model)
        self._forward = forward_fn(model)
        self._waiting: collections.deque[Sequence] = collections.deque()
        self._reader: Reader | None = None
        self._batch = Batch()
        self._cond = threading.Condition(threading.RLock())  # a sink ended under it may submit again
        self._closed = False
        #: Steps run, and the most rows one decode step served (for tests and benchmarks).
        self.steps = 0
        self.peak = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        with _live_lock:
            _live.add(self)
        try:
            self._thread.start()
        except BaseException:  # no thread ("can't start new thread"): nothing for the exit to wait for
            with _live_lock:
                _live.discard(self)
            raise

    # --- what callers use -----------------------------------------------------------------------

    def submit(self, seq: Sequence) -> None:
        """Queue ``seq``; it is served once it is at the head of the queue and there is room."""
        if not seq.prompt:
            raise ValueError("a sequence needs at least one prompt token")
        if seq.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, not {seq.max_new_tokens}")
        with self._cond:
            if self._closed:
                raise LoopClosed("the generation loop is closed")
            self._waiting.append(seq)
            self._cond.notify()

    def close(self) -> None:
        """Stop serving: waiting sequences end with ``LoopClosed`` now, running ones after the current step."""
        with self._cond:
            self._closed = True
            waiting = list(self._waiting)
            self._waiting.clear()
            self._cond.notify()
        for seq in waiting:
            seq.sink.end(LoopClosed("the generation loop was closed before this request was served"))

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the loop's thread to end; whether it has."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def running(self) -> int:
        """Sequences being served now (reading their prompt or decoding)."""
        return len(self._batch) + (self._reader is not None)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    # --- the loop's thread ----------------------------------------------------------------------

    def _run(self) -> None:
        import torch

        error: BaseException | None = None
        try:
            with torch.inference_mode():
                while True:
                    with self._cond:
                        while not self._closed and not self._waiting and self.running == 0:
                            self._cond.wait()
                        if self._closed:
                            break
                        self._admit()
                    self._iteration()
        except BaseException as exc:  # pragma: no cover - a bug in the loop itself; fail what it held
            log.exception("the generation loop failed")
            error = exc
        finally:
            with self._cond:
                self._closed = True
                held = [*self._batch.rows, *([self._reader.seq] if self._reader else []), *self._waiting]
                self._waiting.clear()
                self._batch, self._reader = Batch(), None
            try:
                for seq in held:
                    seq.sink.end(error or LoopClosed("the generation loop was closed before this request ended"))
            finally:
                with _live_lock:
                    _live.discard(self)

    def _admit(self) -> None:
        """Start reading the next waiting prompt, if none is being read and there is room (lock held)."""
        while self._reader is None and self._waiting and len(self._batch) < self.max_batch:
            seq = self._waiting.popleft()
            if seq.cancel.is_set():  # its client left while it waited
                seq.sink.end(None)
                continue
            seq.admitted_at = time.perf_counter()
            self._reader = Reader(seq, new_cache(self.model), self.prefill_chunk)

    def _iteration(self) -> None:
        self._drop_cancelled()
        if self._reader is not None:
            self._read()
        if self._batch.rows:
            self._decode()
        self.steps += 1

    def _drop_cancelled(self) -> None:
        if self._reader is not None and self._reader.seq.cancel.is_set():
            seq, self._reader = self._reader.seq, None
            seq.sink.end(None)
        rows = self._batch.rows
        if any(seq.cancel.is_set() for seq in rows):
            self._keep([i for i, seq in enumerate(rows) if not seq.cancel.is_set()])

    def _read(self) -> None:
        """One chunk of the prompt being read; once it is all read, its first token, then it joins the batch."""
        reader = self._reader
        assert reader is not None
        seq = reader.seq
        try:
            logits = reader.step(self._forward)
            if logits is None:
                return
            self._reader = None
            token = pick(logits[None, :], [seq])[0]
        except Exception as exc:
            self._reader = None
            seq.sink.end(exc)
            return
        if self.on_prefill is not None:
            try:
                self.on_prefill(len(seq.prompt), seq.prefill_s)
            except Exception:  # pragma: no cover - an observer's bug must not fail the request
                log.exception("on_prefill failed")
        if self._emit(seq, token):
            seq.sink.end(None)
            return
        try:
            self._batch.join(seq, reader.cache, len(seq.prompt), token)
        except Exception as exc:  # the batch's cache may be half merged: fail what it held
            self._fail_batch([*self._batch.rows, seq], exc)

    def _decode(self) -> None:
        batch = self._batch
        try:
            logits = batch.step(self._forward)
            tokens = pick(logits, batch.rows)
        except Exception as exc:
            self._fail_batch(batch.rows, exc)
            return
        self.peak = max(self.peak, len(batch))
        batch.last = tokens
        done = [self._emit(seq, token) for seq, token in zip(batch.rows, tokens, strict=True)]
        self._keep([i for i, over in enumerate(done) if not over])

    def _keep(self, kept: list[int]) -> None:
        """Keep the batch's rows ``kept``; the others (done or cancelled) end normally."""
        batch = self._batch
        keep = set(kept)
        dropped = [seq for i, seq in enumerate(batch.rows) if i not in keep]
        remaining = [seq for i, seq in enumerate(batch.rows) if i in keep]
        try:
            batch.keep(kept)
        except Exception as exc:  # the cache may be half re-laid: fail the rows it still held
            self._fail_batch(remaining, exc)
        for seq in dropped:
            seq.sink.end(None)

    def _emit(self, seq: Sequence, token: int) -> bool:
        """Hand ``token`` to ``seq``'s sink; whether ``seq`` is done."""
        seq.generated += 1
        if seq.first_token_at is None:
            seq.first_token_at = time.perf_counter()
        seq.sink.token(token)
        return token in seq.eos or seq.generated >= seq.max_new_tokens

    def _fail_batch(self, seqs: list[Sequence], error: BaseException) -> None:
        log.error("a generation step failed; failing its %d request(s): %r", len(seqs), error)
        self._batch = Batch()
        for seq in seqs:
            seq.sink.end(error)
